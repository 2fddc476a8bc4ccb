"""The recursive agent loop: grows one execution tree per rollout (docs/concepts.md, "The execution tree").

Every node runs the same loop: system prompt + goal, then alternately a policy generation (token in, token out),
the first ```python cell of it run in the node's own sandboxed REPL, and the cell's output as the next user
message, until its code calls ``finish(result)`` or a limit of ``RuntimeConfig`` ends it (an ``EndReason``).
``await launch_subagent(...)`` runs a child node with a fresh context at ``depth + 1``, concurrently with its
siblings, and returns the child's ``finish`` value to the parent REPL. A node's end calls ``env.on_node_end`` then
``env.verify`` once, before the parent resumes (:func:`_end_node`); the runtime never computes rewards.
Departures from the paper / project choices: a child that ends without calling finish makes ``launch_subagent``
raise ``ToolError`` in the parent; the per-cell wall-clock limit does not count waits on sub-agents or tools; the
tree's limit counts the tree's own time (:class:`_TreeClock`, ``runtime.tree_clock``), not the policy server's.
Docs: docs/concepts.md#the-execution-tree, docs/pipeline/evaluation.md#tree-limits-on-a-busy-machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rao_core.envs.base import Environment, Episode, Task, ToolError
from rao_core.policies.base import Generation, Policy, PolicyError, PolicyRequest
from rao_core.runtime.chat import ChatTokens, extract_code, load_tokenizer
from rao_core.runtime.config import RuntimeConfig
from rao_core.runtime.sandbox import (CellResult, Repl, ReplPool, SandboxError, SandboxLimits, close_fully,
                                      uncancellable)
from rao_core.tree import CellStatus, EndReason, ExecutionTree, Node, NodeTimings, Turn

TreeCallback = Callable[[ExecutionTree], None]

_REPL_RULES = """You are an agent that acts by writing Python code in a persistent REPL.
Each reply: think briefly, then write exactly ONE code cell in a fenced block:
```python
# your code
```
The cell runs right away; what it prints is shown to you in the next message (cut after {obs_chars} characters).
Variables persist between cells. Top-level `await` works. Only the first code block of a reply is run.
Only what you print is shown: a bare expression on the last line is not displayed.
You have at most {max_steps} replies. Call finish(result) when done: it ends your work and returns
`result` (a JSON-serialisable value: dict, list, str, number) to whoever gave you the goal."""


def sandbox_limits(config: RuntimeConfig) -> SandboxLimits:
    """The per-REPL limits implied by ``config``."""
    return SandboxLimits(
        cell_timeout_s=config.cell_timeout_s, memory_mb=config.cell_memory_mb, cpu_s=config.cell_cpu_s,
        cpu_total_s=config.cell_cpu_s * config.max_steps_per_node, nproc=config.max_processes,
        fsize_mb=config.max_file_mb, output_cap=max(8 * config.observation_max_chars, 65536),
        result_max_bytes=config.result_max_bytes, result_max_depth=config.result_max_depth,
        mode=config.sandbox, echo=config.echo_last_expression, nice=config.cell_nice, work_root=config.work_root)


def system_prompt(env: Environment, config: RuntimeConfig, node: Node) -> str:
    """System prompt of ``node``: REPL rules, env tools, launch_subagent (if allowed), finish, env notes."""
    parts = [_REPL_RULES.format(obs_chars=config.observation_max_chars,
                                max_steps=node.max_steps or config.max_steps_per_node)]
    tools = ["- finish(result) -> None\n  End your work and return `result`."]
    for t in env.tools():
        tools.append(f"- {t.signature}\n  {t.doc}")
    if config.delegation and node.depth < config.effective_max_depth:
        sub = env.subagent_tool()
        tools.append(f"- await {sub.signature}\n  {sub.doc} The sub-agent sees only the goal you give it, not "
                     "this conversation.")
    parts.append("Functions available in the REPL:\n" + "\n".join(tools))
    extra = env.extra_system_prompt()
    if extra:
        parts.append(extra)
    return "\n\n".join(parts)


def format_observation(res: CellResult | None, max_chars: int, note: str = "") -> str:
    """Cell output as shown to the node: printed text, then the error, cut to ``max_chars``."""
    if res is None:
        text = note
    else:
        text = res.output
        if res.error:
            text = (text + "\n" if text and not text.endswith("\n") else text) + res.error
        if res.status in (CellStatus.TIMEOUT, CellStatus.KILLED):
            text += ("\n[the REPL was restarted: all variables from earlier cells are lost]")
        if not text.strip():
            text = "[the cell ran and printed nothing]"
    cut = len(text) - max_chars + (res.truncated_chars if res else 0)
    if len(text) > max_chars:
        text = text[:max_chars]
    if cut > 0:
        text += f"\n[output cut: {cut} more characters not shown]"
    return text


@dataclass
class _Shared:
    """State shared by all trees of one run_trees call."""

    config: RuntimeConfig
    policy: Policy
    chat: ChatTokens
    semaphore: asyncio.Semaphore
    pool: ReplPool


class _TreeClock:
    """The tree's own time in seconds (docs/pipeline/evaluation.md, "Tree limits on a busy machine"): wall-clock
    seconds during which at least one running node of the tree is working, i.e. has started (``start``), has not
    ended (``end``) and is not inside ``waiting`` (a policy generation, a call from its REPL to the orchestrator: a
    sub-agent or a tool). Never more than the tree's wall-clock. Robust to a ``waiting`` block that closes after
    its node ended (it counts nothing then)."""

    def __init__(self) -> None:
        self._waits: dict[str, int] = {}  # running node id -> ``waiting`` blocks open
        self._working = 0  # running nodes with no ``waiting`` block open
        self._since: float | None = None  # perf_counter() when _working last became positive
        self._own = 0.0

    def _shift(self, delta: int) -> None:
        now = time.perf_counter()
        if self._working == 0 and delta > 0:
            self._since = now
        self._working += delta
        if self._working == 0 and self._since is not None:
            self._own += now - self._since
            self._since = None

    def own_s(self) -> float:
        """Seconds of own time so far (the running interval included)."""
        return self._own + (time.perf_counter() - self._since if self._since is not None else 0.0)

    def start(self, node_id: str) -> None:
        """Node ``node_id`` starts working."""
        if node_id not in self._waits:
            self._waits[node_id] = 0
            self._shift(+1)

    def end(self, node_id: str) -> None:
        """Node ``node_id`` ended: it no longer counts, whatever it was doing."""
        if self._waits.pop(node_id, None) == 0:
            self._shift(-1)

    @contextlib.contextmanager
    def waiting(self, node_id: str) -> Iterator[None]:
        """Node ``node_id`` waits on something that is not its own work for the duration of the block."""
        if node_id in self._waits:
            self._waits[node_id] += 1
            if self._waits[node_id] == 1:
                self._shift(-1)
        try:
            yield
        finally:
            if node_id in self._waits:
                self._waits[node_id] -= 1
                if self._waits[node_id] == 0:
                    self._shift(+1)


@dataclass
class _TreeCtx:
    env: Environment
    episode: Episode
    tree: ExecutionTree
    shared: _Shared
    on_update: TreeCallback | None = None
    steps: int = 0
    timed_out: bool = False
    clock: _TreeClock = field(default_factory=_TreeClock)
    ended: set[str] = field(default_factory=set)  # node ids already finalised by _end_node
    child_locks: dict[str, asyncio.Lock] = field(default_factory=dict)  # parent id -> lock (sequential_children)

    @property
    def config(self) -> RuntimeConfig:
        return self.shared.config

    def notify(self) -> None:
        if self.on_update is not None:
            try:
                self.on_update(self.tree)
            except Exception:  # noqa: BLE001 - a broken live view must not kill rollouts
                pass


def _finalise_tokens(node: Node) -> None:
    """Fill node.token_ids / assistant_mask / behaviour_logprobs from its valid turns."""
    turns = [t for t in node.turns if t.prompt_token_ids is not None]
    if node.end_reason == EndReason.TOKEN_PREFIX_BREAK and turns:
        turns = turns[:-1]  # the broken turn is kept for inspection, not as training data
    if not turns:
        node.token_ids, node.assistant_mask, node.behaviour_logprobs = [], [], []
        return
    last = turns[-1]
    ids = list(last.prompt_token_ids) + list(last.completion_token_ids)
    mask = [0] * len(ids)
    lps = [0.0] * len(ids)
    for t in turns:
        start = len(t.prompt_token_ids)
        for j, lp in enumerate(t.completion_logprobs):
            mask[start + j] = 1
            lps[start + j] = float(lp)
    node.token_ids, node.assistant_mask, node.behaviour_logprobs = ids, mask, lps


def request_seed(tree_seed: int | None, node_id: str, turn: int) -> int | None:
    """Sampling seed (an int in [0, 2^31)) of turn ``turn`` of node ``node_id`` in a tree seeded ``tree_seed``
    (``ExecutionTree.seed``): ``int(sha256(f"{tree_seed}|{node_id}|{turn}")[:8 hex digits]) mod 2^31``, so every
    request of a rollout has its own seed and the same rollout asks for the same seeds wherever it runs; None
    for an unseeded tree."""
    if tree_seed is None:
        return None
    return int(hashlib.sha256(f"{tree_seed}|{node_id}|{turn}".encode()).hexdigest()[:8], 16) % (2 ** 31)


async def _generate(ctx: _TreeCtx, node: Node, prompt_ids: list[int]) -> tuple[Generation, float, float]:
    """One policy call under the shared semaphore; returns (generation, queue_s, generation_s)."""
    cfg = ctx.config
    t0 = time.perf_counter()
    async with ctx.shared.semaphore:
        t1 = time.perf_counter()
        req = PolicyRequest(node=node, env=ctx.env.name, prompt_token_ids=prompt_ids,
                            max_tokens=cfg.max_new_tokens, seed=request_seed(ctx.tree.seed, node.node_id,
                                                                             len(node.turns)),
                            tree_id=ctx.tree.tree_id)
        async with asyncio.timeout(cfg.policy_timeout_s):  # not wait_for: in 3.11 it can swallow a cancellation
            gen = await ctx.shared.policy.generate(req)
    return gen, t1 - t0, time.perf_counter() - t1


def _end_node(ctx: _TreeCtx, node: Node, wall_s: float | None) -> None:
    """Finalise an ended node exactly once (synchronous, so no cancellation can cut it short).

    Order: ``env.on_node_end`` (the end reason and result are already set), trajectory tokens, timings
    (``wall_s``: seconds from the node's start to its end, REPL teardown excluded; None: measured from
    ``timings.started_at`` when the node started, else left at 0), then ``env.verify`` into
    ``node.verifier`` (None when not checkable or when the hook or verifier raised;
    the error goes to ``env_info``), then ``notify``.
    """
    if node.node_id in ctx.ended:
        return
    ctx.ended.add(node.node_id)
    env = ctx.env
    try:
        env.on_node_end(ctx.episode, node)
    except Exception as e:  # noqa: BLE001 - a hook bug leaves the node visible, not the run dead
        node.env_info["on_node_end_error"] = f"{type(e).__name__}: {e}"
    _finalise_tokens(node)
    if wall_s is None and node.timings.started_at:  # ended from outside its own loop
        wall_s = max(0.0, time.time() - node.timings.started_at)
    if wall_s is not None:
        node.timings.wall_s = wall_s
    node.timings.queue_s = sum(t.queue_s for t in node.turns)
    node.timings.generation_s = sum(t.generation_s for t in node.turns)
    node.timings.execution_s = sum(t.execution_s for t in node.turns)
    try:
        node.verifier = env.verify(ctx.episode, node)
    except Exception as e:  # noqa: BLE001 - a verifier error leaves the node unscored
        node.verifier = None
        node.env_info["verifier_error"] = f"{type(e).__name__}: {e}"
    ctx.notify()


class _NodeEnd(Exception):
    """``_NodeEnd(reason, error)``: raised by a step of the node loop to end the node."""


@dataclass
class _NodeLoop:
    """The steps of one node's loop, run by ``_run_node``: ``start``, then per turn ``check_limits``,
    ``policy_turn``, ``run_cell`` and ``next_prompt``. A step that ends the node raises ``_NodeEnd``;
    ``finished``/``result`` are set by ``finish()`` in a cell or by a finishing tool (``on_call``)."""

    ctx: _TreeCtx
    node: Node
    prompt_ids: list[int] = field(default_factory=list)
    repl: Repl | None = None
    finished: bool = False
    result: Any = None

    async def start(self) -> None:
        """Start hook, system prompt and goal, the first prompt's ids and the node's REPL."""
        ctx, node = self.ctx, self.node
        ctx.env.on_node_start(ctx.episode, node)
        node.messages = [{"role": "system", "content": system_prompt(ctx.env, ctx.config, node)},
                         {"role": "user", "content": node.goal}]
        self.prompt_ids = ctx.shared.chat.initial(node.messages[0]["content"], node.goal)
        self.repl = await self._new_repl()
        ctx.notify()

    async def _new_repl(self) -> Repl:
        """A started and initialised REPL for the node; closed again (to the end) if the initialisation
        fails or is cancelled, so no process or work folder outlives a node cancelled at this point. A
        REPL that cannot start ends the node."""
        ctx = self.ctx
        try:
            repl = await ctx.shared.pool.acquire()
            try:
                await repl.init([{"name": t.name, "finishes": t.finishes} for t in ctx.env.tools()],
                                ctx.config.delegation, ctx.env.repl_variables(ctx.episode, self.node))
            except BaseException:
                await close_fully(repl)
                raise
        except SandboxError as e:
            raise _NodeEnd(EndReason.SANDBOX_ERROR, str(e)) from None
        return repl

    def check_limits(self) -> None:
        """End the node at its step limit, when the tree's step budget is spent, or when the next prompt
        and ``max_new_tokens`` would not fit in the context window."""
        cfg, node, n = self.ctx.config, self.node, len(self.prompt_ids)
        max_steps = node.max_steps or cfg.max_steps_per_node
        if len(node.turns) >= max_steps:
            raise _NodeEnd(EndReason.MAX_STEPS, f"no finish() after {max_steps} steps")
        if cfg.tree_step_budget is not None and self.ctx.steps >= cfg.tree_step_budget:
            raise _NodeEnd(EndReason.TREE_STEP_BUDGET, f"the tree's step budget of {cfg.tree_step_budget} is spent")
        if n + cfg.max_new_tokens > cfg.context_window:
            raise _NodeEnd(EndReason.CONTEXT_OVERFLOW, f"prompt of {n} tokens + max_new_tokens {cfg.max_new_tokens} "
                                                       f"> context_window {cfg.context_window}")

    async def policy_turn(self) -> Turn:
        """One policy generation, recorded as a turn and an assistant message. Ends the node when the policy
        fails or times out, returns fewer or more log-probs than token ids, or echoes other prompt ids than
        were sent."""
        ctx, node, sent = self.ctx, self.node, self.prompt_ids
        ctx.steps += 1
        try:
            with ctx.clock.waiting(node.node_id):  # the server's time, not the tree's (_TreeClock)
                gen, queue_s, gen_s = await _generate(ctx, node, sent)
        except asyncio.TimeoutError:
            raise _NodeEnd(EndReason.POLICY_ERROR, f"policy did not answer within {ctx.config.policy_timeout_s:g} s") \
                from None
        except PolicyError as e:
            raise _NodeEnd(EndReason.POLICY_ERROR, str(e)) from None
        except Exception as e:  # noqa: BLE001 - a policy bug fails this node, not the run
            raise _NodeEnd(EndReason.POLICY_ERROR, f"{type(e).__name__}: {e}") from None
        if gen.token_ids is not None:
            comp_ids = list(gen.token_ids)
            lps = list(gen.logprobs) if gen.logprobs is not None else [0.0] * len(comp_ids)
            if len(lps) != len(comp_ids):
                raise _NodeEnd(EndReason.POLICY_ERROR,
                               f"policy returned {len(comp_ids)} token ids but {len(lps)} log-probs")
        else:
            comp_ids = ctx.shared.chat.encode(gen.text)
            lps = [0.0] * len(comp_ids)
        turn = Turn(prompt_token_ids=list(sent), completion_token_ids=comp_ids, completion_logprobs=lps,
                    text=gen.text, finish_reason=gen.finish_reason, queue_s=queue_s, generation_s=gen_s)
        node.turns.append(turn)
        node.messages.append({"role": "assistant", "content": gen.text})
        if gen.prompt_token_ids is not None and list(gen.prompt_token_ids) != list(sent):
            turn.prompt_token_ids = list(gen.prompt_token_ids)
            k = next((i for i, (a, b) in enumerate(zip(gen.prompt_token_ids, sent)) if a != b),
                     min(len(gen.prompt_token_ids), len(sent)))
            raise _NodeEnd(EndReason.TOKEN_PREFIX_BREAK,
                           f"turn {len(node.turns) - 1}: server prompt ids ({len(gen.prompt_token_ids)}) differ "
                           f"from the sent ids ({len(sent)}) at position {k}")
        return turn

    async def run_cell(self, turn: Turn) -> None:
        """Run the turn's first code cell and record its observation; a cell that timed out or was killed
        gets the node a fresh REPL (a REPL that cannot start ends the node)."""
        code = extract_code(turn.text)
        if code is None:
            turn.cell_status = CellStatus.NO_CODE
            turn.observation = ("[no code cell found: write one ```python ... ``` block per reply; "
                                "call finish(result) when done]")
        else:
            turn.code = code
            res = await self.repl.execute(code, self.on_call)
            turn.execution_s, turn.cell_status = res.wall_s, res.status
            if res.finished and not self.finished:
                self.finished, self.result = True, res.finish_value
            turn.observation = format_observation(res, self.ctx.config.observation_max_chars)
            if res.status in (CellStatus.TIMEOUT, CellStatus.KILLED):
                await self.repl.close()
                self.repl = await self._new_repl()
        self.ctx.notify()

    def next_prompt(self, turn: Turn) -> None:
        """Append the observation as the next user message and extend the prompt ids with it."""
        chat, comp_ids = self.ctx.shared.chat, turn.completion_token_ids
        self.node.messages.append({"role": "user", "content": turn.observation})
        self.prompt_ids = self.prompt_ids + comp_ids + chat.suffix(comp_ids, turn.observation)

    async def on_call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Serve a call from the node's REPL: ``launch_subagent`` or an environment tool (a finishing tool
        finishes the node with its value)."""
        ctx = self.ctx
        with ctx.clock.waiting(self.node.node_id):  # a sub-agent's work is its own, a tool's the orchestrator's
            if name == "launch_subagent":
                return await _launch_child(ctx, self.node, args, kwargs)
            spec = next((t for t in ctx.env.tools() if t.name == name), None)
            if spec is None:
                raise ToolError(f"unknown tool {name!r}")
            value = ctx.env.call_tool(ctx.episode, self.node, name, list(args), dict(kwargs))
            if spec.finishes:
                self.finished, self.result = True, value
            return value


async def _run_node(ctx: _TreeCtx, node: Node) -> None:
    """Run ``node`` to its end; never raises except CancelledError (after recording the end reason).

    The loop's steps are ``_NodeLoop``'s; a step ends the node by raising ``_NodeEnd``, and the node
    finishes when ``finish()`` or a finishing tool has given its result.
    """
    t_start = time.perf_counter()
    node.timings = NodeTimings(started_at=time.time())
    loop = _NodeLoop(ctx, node)
    ctx.clock.start(node.node_id)
    try:
        await loop.start()
        while not loop.finished:
            loop.check_limits()
            turn = await loop.policy_turn()
            await loop.run_cell(turn)
            if not loop.finished:
                loop.next_prompt(turn)
        node.result, node.end_reason = loop.result, EndReason.FINISHED
    except _NodeEnd as end:
        node.end_reason, node.error = end.args
    except asyncio.CancelledError:
        node.end_reason = EndReason.TREE_TIMEOUT if ctx.timed_out else EndReason.CANCELLED
        node.error = node.error or (_timeout_note(ctx.config) if ctx.timed_out
                                    else "cancelled (the parent's cell ended or was killed)")
        raise
    except Exception as e:  # noqa: BLE001 - environment bugs end the node with a visible error
        if node.end_reason == EndReason.RUNNING:
            node.end_reason = EndReason.SANDBOX_ERROR
        node.error = f"{type(e).__name__}: {e}"
        ctx.tree.error = ctx.tree.error or f"node {node.node_id}: {type(e).__name__}: {e}"
    finally:
        # Finalise synchronously BEFORE the first await: a cancellation that arrives while the REPL is
        # being closed (the parent's cell ended, or a second cancel from an outer gather) must not skip
        # the end hook, the timings or the verifier.
        if node.end_reason == EndReason.RUNNING:  # only a BaseException other than CancelledError
            node.end_reason = EndReason.CANCELLED
            node.error = node.error or "the node was interrupted"
        _end_node(ctx, node, time.perf_counter() - t_start)
        ctx.clock.end(node.node_id)
        if loop.repl is not None:
            await close_fully(loop.repl)


async def _launch_child(ctx: _TreeCtx, parent: Node, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Serve ``launch_subagent`` from ``parent``'s REPL: validate, run the child, return its result."""
    cfg = ctx.config
    if not cfg.delegation:
        raise ToolError("launch_subagent is disabled in this run (single-agent mode)")
    if parent.depth >= cfg.effective_max_depth:
        raise ToolError(f"launch_subagent refused: maximum depth {cfg.effective_max_depth} reached "
                        f"(this agent is at depth {parent.depth}); solve this goal yourself")
    if len(parent.children) >= cfg.max_children_per_node:
        raise ToolError(f"launch_subagent refused: at most {cfg.max_children_per_node} sub-agents per agent")
    spec = ctx.env.child_spec(ctx.episode, parent, list(args), dict(kwargs))
    steps = cfg.max_steps_per_node if spec.max_steps is None else max(1, min(spec.max_steps,
                                                                             cfg.max_steps_per_node))
    child = Node(node_id=f"{parent.node_id}.{len(parent.children)}", parent_id=parent.node_id,
                 depth=parent.depth + 1, goal=spec.goal, goal_args=spec.goal_args, max_steps=steps,
                 no_bonus=ctx.env.bonus_exclusion(ctx.episode, parent, spec))
    parent.children.append(child.node_id)
    ctx.tree.nodes.append(child)
    if cfg.sequential_children:  # one child of this parent at a time, in launch order (asyncio.Lock is FIFO)
        async with ctx.child_locks.setdefault(parent.node_id, asyncio.Lock()):
            await _run_node(ctx, child)
    else:
        await _run_node(ctx, child)
    if child.end_reason != EndReason.FINISHED:
        raise ToolError(f"sub-agent ended without finishing ({child.end_reason.value})")
    return child.result


def tree_clock(config: RuntimeConfig) -> str:
    """The clock ``config.tree_timeout_s`` (seconds) counts in ``run_tree``/``run_trees``, ``'wall'`` or ``'own'``:
    ``config.tree_clock``, with ``'auto'`` read as ``'own'`` in the RL rollouts and the evaluations alike (an
    evaluation resolves it before it runs its trees: ``rao_core.evaluation.mode_runtime``). Raises nothing."""
    return "own" if config.tree_clock == "auto" else config.tree_clock


def _timeout_note(config: RuntimeConfig) -> str:
    """The error of a node ended by the tree's limit."""
    if tree_clock(config) == "own":
        return f"the tree's own time reached its limit of {config.tree_timeout_s:g} s (runtime.tree_clock: own)"
    return "the tree's wall-clock limit elapsed"


_OWN_CLOCK_POLL_S = 0.05  # shortest wait between two looks at a paused own clock close to its limit (seconds)


async def _run_tree_ctx(ctx: _TreeCtx) -> ExecutionTree:
    t0 = time.perf_counter()
    root = ctx.tree.root
    task = asyncio.ensure_future(_run_node(ctx, root))
    own = tree_clock(ctx.config) == "own"
    limit = ctx.config.tree_timeout_s
    try:
        while True:  # the clock never runs faster than the wall: waking after `remaining` seconds is never late
            remaining = limit - (ctx.clock.own_s() if own else time.perf_counter() - t0)
            if remaining > 0:
                await asyncio.wait({task}, timeout=max(remaining, _OWN_CLOCK_POLL_S) if own else remaining)
            if task.done():
                if task.exception() is not None:
                    ctx.tree.error = f"{type(task.exception()).__name__}: {task.exception()}"
                break
            if remaining <= 0:
                ctx.timed_out = True
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                break
    except asyncio.CancelledError:
        task.cancel()
        # to its end even if cancelled again: a second cancel would cut the root's wait for its children short
        await uncancellable(asyncio.gather(task, return_exceptions=True))
        raise
    for n in ctx.tree.nodes:  # nodes that never started their loop (e.g. cancelled while queued)
        if n.end_reason == EndReason.RUNNING:
            n.end_reason = EndReason.TREE_TIMEOUT if ctx.timed_out else EndReason.CANCELLED
            n.error = n.error or "the node never ran (cancelled before it started)"
        _end_node(ctx, n, None)
    ctx.tree.wall_s = time.perf_counter() - t0
    ctx.tree.meta["own_s"] = ctx.clock.own_s()
    ctx.notify()
    return ctx.tree


def _new_tree(env: Environment, task: Task, policy: Policy, config: RuntimeConfig, tree_id: str | None,
              group_id: str, rollout_index: int, seed: int | None = None) -> tuple[ExecutionTree, Episode]:
    spec = env.root_goal(task)
    root = Node(node_id="0", depth=0, goal=spec.goal, goal_args=spec.goal_args,
                max_steps=config.max_steps_per_node)
    tree = ExecutionTree(tree_id=tree_id or uuid.uuid4().hex, env=env.name, task_id=task.task_id,
                         group_id=group_id, rollout_index=rollout_index, root_id=root.node_id, nodes=[root],
                         policy=getattr(policy, "name", type(policy).__name__), seed=seed,
                         meta={"max_depth": config.effective_max_depth, "delegation": config.delegation})
    return tree, env.new_episode(task)


def _shared(policy: Policy, config: RuntimeConfig, tokenizer: Any) -> _Shared:
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__") \
        else tokenizer
    return _Shared(config=config, policy=policy, chat=ChatTokens(tok),
                   semaphore=asyncio.Semaphore(config.max_concurrent_requests),
                   pool=ReplPool(sandbox_limits(config), size=config.repl_pool_size))


async def run_tree(env: Environment, task: Task, policy: Policy, config: RuntimeConfig, *, tokenizer: Any,
                   tree_id: str | None = None, group_id: str = "", rollout_index: int = 0,
                   on_update: TreeCallback | None = None, seed: int | None = None) -> ExecutionTree:
    """Grow one execution tree for ``task`` (one rollout). Never raises for rollout failures.

    ``tokenizer``: a Hugging Face tokenizer or the checkpoint folder holding one. ``on_update`` is
    called with the (live) tree after each turn and node end. ``seed``: the rollout's sampling seed
    (``ExecutionTree.seed``; each policy request gets :func:`request_seed` of it), None: unseeded. Failures are
    recorded in each node's
    ``end_reason``/``error`` and in ``tree.error``; every node has an end reason on return.
    """
    shared = _shared(policy, config, tokenizer)
    try:
        return await _run_one(env, task, shared, tree_id, group_id, rollout_index, on_update, seed)
    finally:
        await shared.pool.close()


async def _run_one(env: Environment, task: Task, shared: _Shared, tree_id: str | None, group_id: str,
                   rollout_index: int, on_update: TreeCallback | None, seed: int | None = None) -> ExecutionTree:
    try:
        tree, episode = _new_tree(env, task, shared.policy, shared.config, tree_id, group_id, rollout_index, seed)
    except Exception as e:  # noqa: BLE001 - a bad task gives an empty failed tree, not an exception
        root = Node(node_id="0", goal="", end_reason=EndReason.CANCELLED, error=f"{type(e).__name__}: {e}")
        return ExecutionTree(tree_id=tree_id or uuid.uuid4().hex, env=env.name, task_id=task.task_id,
                             group_id=group_id, rollout_index=rollout_index, root_id="0", nodes=[root], seed=seed,
                             error=f"could not start the rollout: {type(e).__name__}: {e}")
    ctx = _TreeCtx(env=env, episode=episode, tree=tree, shared=shared, on_update=on_update)
    try:
        return await _run_tree_ctx(ctx)
    except Exception as e:  # noqa: BLE001 - never raise for a rollout failure
        tree.error = f"{type(e).__name__}: {e}"
        for n in tree.nodes:
            if n.end_reason == EndReason.RUNNING:
                n.end_reason, n.error = EndReason.CANCELLED, tree.error
            _end_node(ctx, n, None)
        return tree
    finally:  # the policy drops what it kept for the tree (a pool's pin), also when the tree was cancelled
        try:
            tree.meta.update(shared.policy.tree_done(tree.tree_id) or {})
        except Exception:  # noqa: BLE001 - bookkeeping never fails a rollout
            pass


async def run_trees(env: Environment, tasks_with_rollouts: Iterable[tuple[Task, int]], policy: Policy,
                    config: RuntimeConfig, *, tokenizer: Any,
                    progress: Callable[[int, int, ExecutionTree], None] | bool | None = None,
                    seeds: Callable[[Task, int], int | None] | None = None) -> list[ExecutionTree]:
    """Grow G trees per task concurrently; returns them task by task, rollout index 0..G-1.

    ``tasks_with_rollouts``: pairs (task, G). Each tree gets ``group_id = task.task_id`` and
    ``rollout_index`` g. All trees share one policy-request semaphore (``max_concurrent_requests``)
    and one REPL pool; at most ``config.max_concurrent_trees`` trees grow at once (the others wait before
    their clock starts).

    ``seeds``: ``seeds(task, g)`` is the sampling seed of rollout g of ``task`` (``ExecutionTree.seed``, e.g.
    ``rao_core.task_sampling.rollout_seed``); None: every tree unseeded.

    ``progress``: a callback ``progress(done, total, tree)`` called as each tree finishes (``done`` trees
    of ``total`` finished), or True/None; unless it is False, a rich bar "rollouts done/total" is drawn
    while the trees grow when stdout is a terminal (:class:`rao_core.progress.StepProgress`: never in
    tests, CI logs or a worker's log; ``RAO_PROGRESS=0`` turns it off). Exceptions of the callback end
    the call like any error.
    """
    from rao_core.progress import StepProgress

    items = [(task, g) for task, n in tasks_with_rollouts for g in range(int(n))]
    shared = _shared(policy, config, tokenizer)
    total = len(items)
    done_count = 0
    bar = StepProgress("rollouts", total, show=progress is not False)

    gate = asyncio.Semaphore(config.max_concurrent_trees or max(1, total))

    async def one(task: Task, g: int) -> ExecutionTree:
        nonlocal done_count
        async with gate:  # the tree's clock (wall_s, tree_timeout_s) starts inside
            tree = await _run_one(env, task, shared, None, task.task_id, g, None,
                                  seeds(task, g) if seeds is not None else None)
        done_count += 1
        bar.advance(done=done_count)
        if callable(progress):
            progress(done_count, total, tree)
        return tree

    bar.start()
    trees = [asyncio.ensure_future(one(t, g)) for t, g in items]
    try:
        return list(await asyncio.gather(*trees))
    finally:
        # A cancelled gather returns as soon as ONE tree has ended cancelled, while the others are still
        # closing their nodes: await every tree (cancelled once, never twice) before the pool is closed.
        for t in trees:
            if not t.done() and not t.cancelling():
                t.cancel()
        # One uncancellable block for both: a second cancellation arriving while the trees close must not
        # skip the pool's close (it re-raises only after the pool is closed).
        async def close_all() -> None:
            await asyncio.gather(*trees, return_exceptions=True)
            await shared.pool.close()

        try:
            await uncancellable(close_all())
        finally:
            bar.stop()
