"""ART-E: question answering over one email inbox (docs/environments.md, "ART-E").

Files: ``db.py`` SQLite schema, FTS5 triggers, search and read; ``synth.py`` offline inbox generator;
``loader.py`` real Enron email and question records; ``reward.py`` the ladder and 0/1 rewards;
``env.py`` the environment.
"""

from rao_core.envs.arte.db import EmailRecord, build_email_db, open_email_db, read_email, search_emails
from rao_core.envs.arte.env import ArteConfig, ArteEnv, ArteEpisode, ensure_corpus
from rao_core.envs.arte.loader import build_enron_db, load_arte_questions, load_enron_emails
from rao_core.envs.arte.reward import ArteReward, ArteRewardConfig, ArteRubric, binary_reward, ladder_reward
from rao_core.envs.arte.synth import InboxParams, generate_corpus

__all__ = [
    "ArteConfig", "ArteEnv", "ArteEpisode", "ArteReward", "ArteRewardConfig", "ArteRubric", "EmailRecord",
    "InboxParams", "binary_reward", "build_email_db", "build_enron_db", "ensure_corpus", "generate_corpus",
    "ladder_reward", "load_arte_questions", "load_enron_emails", "open_email_db", "read_email", "search_emails",
]
