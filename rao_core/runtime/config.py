"""Limits and knobs of the recursive agent runtime (one pydantic config for the rollout stage).

Every limit here is enforced by the orchestrator process, outside the node's REPL (docs/concepts.md, "The execution
tree"): model code can neither read nor change them. Each limit that stops a node has its own
``rao_core.tree.EndReason``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RuntimeConfig(BaseModel):
    """Configuration of ``run_tree``/``run_trees``.

    Context-window rule (``CONTEXT_OVERFLOW``, [project choice]): before every generation, a node whose
    prompt length ``T_prompt`` (tokens) satisfies ``T_prompt + max_new_tokens > context_window`` ends
    with ``EndReason.CONTEXT_OVERFLOW``; so no request can ever exceed the window, and the recorded
    trajectory holds at most ``context_window`` tokens.
    """

    model_config = ConfigDict(extra="forbid")

    max_depth: int = Field(2, ge=0, description="Deepest node depth allowed (root = 0). launch_subagent "
                           "from a node at max_depth raises inside its REPL.")
    max_steps_per_node: int = Field(10, ge=1, description="Turns (generation + cell) per node; a node "
                                    "that has not finished after this many ends with MAX_STEPS.")
    context_window: int = Field(8192, ge=64, description="Tokens per node: prompt + max_new_tokens of the "
                                "next turn must fit, else CONTEXT_OVERFLOW.")
    max_new_tokens: int = Field(1024, ge=1, description="Generation cap per turn (tokens).")
    observation_max_chars: int = Field(2000, ge=64, description="Cell output shown to the node is cut to "
                                       "this many characters (a note says it was cut).")
    cell_timeout_s: float = Field(30.0, gt=0, description="Wall-clock seconds per cell, not counting "
                                  "time the REPL waits on the orchestrator (sub-agents, tools). On expiry "
                                  "the REPL is killed and restarted; its variables are lost.")
    cell_memory_mb: int = Field(1024, ge=64, description="RLIMIT_AS of a node's REPL process, MiB.")
    cell_cpu_s: int = Field(60, ge=1, description="CPU seconds per cell (RLIMIT_CPU soft limit, reset "
                            "per cell); the hard limit is cell_cpu_s * max_steps_per_node per REPL.")
    cell_nice: int = Field(10, ge=0, le=19, description="Scheduling niceness of each REPL process tree, set "
                           "outside the sandbox (0: the orchestrator's own): a cell that loops gets about a tenth "
                           "of a busy core instead of taking it from a CPU vLLM engine bound to every core.")
    max_processes: int = Field(32, ge=4, description="RLIMIT_NPROC per REPL (each REPL has its own uid).")
    max_file_mb: int = Field(64, ge=1, description="RLIMIT_FSIZE of a REPL, MiB (largest file it writes).")
    max_children_per_node: int = Field(8, ge=0, description="launch_subagent calls allowed per node.")
    result_max_bytes: int = Field(262_144, ge=64, description="Largest finish() value, as JSON text "
                                  "(characters): a larger one is refused with a ToolError in the node's REPL "
                                  "and again by the orchestrator; NaN and infinity are refused too.")
    result_max_depth: int = Field(64, ge=1, le=200, description="Deepest nesting of containers in a finish() "
                                  "value or in tool / launch_subagent arguments (tree records serialise up to "
                                  "about 250 levels).")
    tree_step_budget: int | None = Field(None, ge=1, description="Optional turns shared by the whole "
                                         "tree; once spent every running node ends with TREE_STEP_BUDGET.")
    tree_timeout_s: float = Field(600.0, gt=0, description="Seconds per tree on the clock ``tree_clock`` names "
                                  "(wall-clock, or the tree's own time); then all nodes still running end with "
                                  "TREE_TIMEOUT, an infrastructure failure (unscored).")
    tree_clock: Literal["auto", "wall", "own"] = Field(
        "auto", description="What tree_timeout_s counts. 'wall': the seconds since the tree started. 'own': the "
        "tree's own time, the wall-clock seconds during which at least one of its nodes is working (starting its "
        "REPL, running a cell, between turns), not those during which every working node waits on a policy "
        "generation (queue and server; each bounded by policy_timeout_s, their number by max_steps_per_node), so "
        "a server slowed by other load does not end the tree, and the tree's wall-clock limit becomes "
        "tree_timeout_s plus the time it waited on the server. 'auto' (default): 'own', in the RL rollouts and "
        "the evaluations alike. "
        "Reason and numbers: rao_core.runtime.agent, 'Tree limits' (docs/pipeline/evaluation.md, "
        "'Tree limits on a busy machine').")
    max_concurrent_requests: int = Field(64, ge=1, description="Policy requests in flight at once, over "
                                         "all trees of one run_trees call.")
    max_concurrent_trees: int | None = Field(None, ge=1, description="Trees grown at once by one run_trees "
                                             "call (None: all). A tree's wall-clock and tree_timeout_s start when "
                                             "it starts, so with many wide trees this keeps the timeout a limit on "
                                             "the tree, not on its wait behind the others.")
    policy_timeout_s: float = Field(300.0, gt=0, description="Seconds one generation may take (including "
                                    "retries) before the node ends with POLICY_ERROR.")
    max_infra_failure_share: float = Field(
        0.25, ge=0, le=1, description="Largest share of a campaign stage's trees (generation, evaluation) that "
        "may end by an infrastructure failure (root policy_error, sandbox_error, token_prefix_break or "
        "tree_timeout, or a crashed rollout) before the stage fails, naming the server's state and log, with no "
        "completion marker (a re-run redoes it on a fresh server). 0.25 because the two cases are far apart: a "
        "policy server that dies fails every tree still running (8 of 8 in the drill that motivated it), while a "
        "healthy run loses a few percent to a killed REPL or a slow tree; a quarter lies between them and keeps "
        "three quarters of each batch the policy's own, so most groups of G rollouts still compare.")
    delegation: bool = Field(True, description="False = single-agent baseline: max depth 0 and no "
                             "launch_subagent in the prompt or the REPL.")
    sequential_children: bool = Field(False, description="Run each parent's children one at a time, whatever its "
                                      "code asks (asyncio.gather included): a runtime switch for wall-clock "
                                      "studies (docs/benchmarks.md), not a prompt; the trees and results are "
                                      "otherwise the same. False: children run as the code launches them.")
    sandbox: Literal["bwrap", "none"] = Field("bwrap", description="'bwrap' (bubblewrap, default) or "
                                             "'none' (plain subprocess with rlimits; debugging only).")
    repl_pool_size: int = Field(2, ge=0, description="Pre-started idle REPL processes (hide start-up).")
    work_root: str | None = Field(None, description="Folder that holds the REPLs' work folders (rao-repl-*); "
                                  "None: the system temporary folder. A Ray shard sets its own (infra/ray_rollouts.py).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of endpoint policies.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of endpoint policies.")
    echo_last_expression: bool = Field(False, description="Notebook echo: print the repr of a cell's bare "
                                       "last expression. Off by default, as in the paper: a sub-agent's result "
                                       "stays in its REPL variable and enters the parent's context only if the "
                                       "parent prints it.")

    @model_validator(mode="after")
    def _check(self) -> RuntimeConfig:
        if self.max_new_tokens >= self.context_window:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be below context_window "
                             f"({self.context_window})")
        return self

    @property
    def effective_max_depth(self) -> int:
        """Max depth in force: 0 when delegation is disabled."""
        return self.max_depth if self.delegation else 0

    @property
    def whole_tree_steps(self) -> int:
        """Steps a single agent's node gets to match one recursive node and its children:
        ``max_steps_per_node x (1 + max_children_per_node)`` (the single-agent arms of the experiments)."""
        return self.max_steps_per_node * (1 + self.max_children_per_node)
