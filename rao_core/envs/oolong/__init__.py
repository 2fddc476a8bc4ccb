"""Oolong: long-context aggregation over D&D transcripts (docs/environments.md, "Oolong").

Modules: ``scoring`` (official answer scoring), ``loaders`` (Oolong-Real JSON, Oolong-synth parquet),
``synth`` (offline transcript generator), ``env`` (the environment).
"""

from rao_core.envs.oolong.env import OolongEnv
from rao_core.envs.oolong.loaders import load_oolong_real, load_oolong_synth
from rao_core.envs.oolong.scoring import extract_boxed, parse_answer, score_answer, score_synth_answer
from rao_core.envs.oolong.synth import QUESTION_TYPES, approx_tokens, generate_oolong_tasks

__all__ = [
    "OolongEnv", "QUESTION_TYPES", "approx_tokens", "extract_boxed", "generate_oolong_tasks", "load_oolong_real",
    "load_oolong_synth", "parse_answer", "score_answer", "score_synth_answer",
]
