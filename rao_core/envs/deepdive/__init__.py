"""DeepDive: multi-hop deep research over a searchable corpus (docs/environments.md, "DeepDive").

Files: ``kg.py`` knowledge graph, pages and k-hop questions (offline generator); ``backends.py`` the
``SearchBackend`` protocol, the SQLite FTS5 engine and an HTTP skeleton; ``scoring.py`` answer
normalisation and exact match; ``loader.py`` the real parquet records; ``env.py`` the environment.
"""

from rao_core.envs.deepdive.backends import (
    HttpSearchBackend,
    LocalFTSBackend,
    SearchBackend,
    SearchResult,
    build_pages_db,
)
from rao_core.envs.deepdive.env import DeepDiveConfig, DeepDiveEnv, DeepDiveEpisode, ensure_corpus
from rao_core.envs.deepdive.kg import CorpusParams, Page, build_graph, render_pages
from rao_core.envs.deepdive.loader import load_deepdive_parquet
from rao_core.envs.deepdive.scoring import exact_match, normalize_answer

__all__ = [
    "CorpusParams", "DeepDiveConfig", "DeepDiveEnv", "DeepDiveEpisode", "HttpSearchBackend",
    "LocalFTSBackend", "Page", "SearchBackend", "SearchResult", "build_graph", "build_pages_db",
    "ensure_corpus", "exact_match", "load_deepdive_parquet", "normalize_answer", "render_pages",
]
