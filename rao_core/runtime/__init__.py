"""The recursive agent runtime: agent loop, sandboxed REPLs, limits (spec section 1).

Public API: ``RuntimeConfig``, ``run_tree``, ``run_trees``, ``load_tokenizer``, ``oracle_policy``.
"""

from rao_core.runtime.agent import run_tree, run_trees, system_prompt
from rao_core.runtime.chat import ChatTokens, extract_code, load_tokenizer
from rao_core.runtime.config import RuntimeConfig
from rao_core.runtime.oracle import ORACLE_POLICIES, oracle_policy

__all__ = ["ChatTokens", "ORACLE_POLICIES", "RuntimeConfig", "extract_code", "load_tokenizer", "oracle_policy",
           "run_tree", "run_trees", "system_prompt"]
