"""The recursive agent runtime: agent loop, sandboxed REPLs, limits (docs/concepts.md; docs/sandbox.md).

Public API: ``RuntimeConfig``, ``run_tree``, ``run_trees``, ``load_tokenizer``, ``oracle_policy`` (from the
environment registry, ``rao_core.envs``).
"""

from rao_core.envs import oracle_policy
from rao_core.runtime.agent import run_tree, run_trees, system_prompt
from rao_core.runtime.chat import ChatTokens, extract_code, load_tokenizer
from rao_core.runtime.config import RuntimeConfig

__all__ = ["ChatTokens", "RuntimeConfig", "extract_code", "load_tokenizer", "oracle_policy", "run_tree", "run_trees",
           "system_prompt"]
