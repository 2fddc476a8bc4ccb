"""Rollouts beyond one process: the generate stage's groups as shards on a Ray cluster.

With ``execution.backend: ray`` the generate stage (``tasks.stages.generate_trees``) cuts its groups (one RL task
and its G rollouts) into at most ``execution.shards`` :class:`Shard` records, in task order and never splitting a
group (the leave-one-out baseline of Eq. 3 needs all G trees of a task). Each shard is one Ray task
(:func:`run_shard`) that grows its trees with ``rao_core.runtime.run_trees`` in the worker's own process, with
the seeds the stage drew (``rao_core.task_sampling.rollout_seed``: the same trees whatever the backend), pins
each tree to one policy server replica (``rao_core.policies.pool.PolicyPool``) and writes its trees to ONE S3
object in one upload, returning its SHA-256. The stage resubmits a shard whose worker was lost (at most
``execution.max_retries`` times, :func:`run_on_ray`), reads exactly the objects the final results name, each
against its checksum, and checks they hold exactly the planned (task, rollout) pairs; judge, validate and train
do not change. :func:`connect` joins the cluster at ``execution.ray_address``.
Docs: docs/pipeline/ray.md, docs/pipeline/resume-and-faults.md#bad-input-and-faults.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra.process import ServiceError
from rao_core.envs import Task
from rao_core.tree import ExecutionTree

REPO_ROOT = Path(__file__).resolve().parents[1]


class ShardError(ServiceError):
    """A shard failed for good (its retries spent, or its code raised), or its object is not what it returned."""


class RolloutGroup(BaseModel):
    """One task's G rollouts, with the sampling seed of each (``seeds[g]`` for rollout index g; None:
    unseeded)."""

    task: Task
    rollouts: int = Field(ge=1)
    seeds: list[int | None]


class Shard(BaseModel):
    """A unit of work of the generate stage: whole groups, and the S3 key (relative to the campaign) that its
    trees go to."""

    index: int = Field(ge=0)
    count: int = Field(ge=1)  # shards of the stage
    groups: list[RolloutGroup]
    key: str
    mode: Literal["recursive", "single"] | None = None  # an evaluation shard's mode (delegation on/off)

    @property
    def num_trees(self) -> int:
        return sum(g.rollouts for g in self.groups)

    def planned(self) -> list[tuple[str, int, int | None]]:
        """(task id, rollout index, seed) of every tree the shard grows, in order."""
        return [(g.task.task_id, i, g.seeds[i]) for g in self.groups for i in range(g.rollouts)]


class ShardResult(BaseModel):
    """What a shard returns once its object is written: where, its SHA-256, what it holds and who grew it."""

    index: int
    uri: str
    sha256: str
    num_trees: int
    solved: int = 0
    crashed: int = 0
    generation_s: float = 0.0
    worker: str = ""  # host:pid of the Ray worker process


def shard_key(iteration: int, index: int, count: int) -> str:
    """S3 key (relative to the campaign) of shard ``index`` (0-based) of ``count``:
    ``iter-K/trees/shards/shard-<index+1>-of-<count>.jsonl`` (the count in the name: a re-run with another
    shard count never reads an object of the earlier plan)."""
    from infra.stage_io import iter_key

    return iter_key(iteration, f"trees/shards/shard-{index + 1}-of-{count}.jsonl")


def plan_shards(tasks: Sequence[Task], rollouts: int, *, seed: int, iteration: int, shards: int) -> list[Shard]:
    """Cut the iteration's groups into ``min(shards, len(tasks))`` shards of consecutive whole groups, sizes as
    even as possible (the first shards take the remainder: 5 groups over 2 shards -> 3 + 2).

    Args:
        tasks: the iteration's tasks, in the order the stage grows them (``tasks.stages.iteration_tasks``).
        rollouts: G, rollouts per task (>= 1).
        seed, iteration: the campaign's master seed and the iteration: each tree's seed is
            ``rollout_seed(seed, iteration, task_id, g)``.
        shards: the most shards wanted (``execution.shards``, >= 1).

    Returns:
        The shards in order; their trees, concatenated, are the local backend's trees in its order.

    Raises:
        ValueError: ``shards`` < 1, ``rollouts`` < 1, or no task.
    """
    from rao_core.task_sampling import rollout_seed

    if shards < 1 or rollouts < 1 or not tasks:
        raise ValueError(f"cannot shard {len(tasks)} tasks x {rollouts} rollouts into {shards} shards "
                         f"(need at least one task, one rollout and one shard)")
    groups = [RolloutGroup(task=t, rollouts=rollouts,
                           seeds=[rollout_seed(seed, iteration, t.task_id, g) for g in range(rollouts)])
              for t in tasks]
    return _cut(groups, shards, lambda i, n: shard_key(iteration, i, n))


def plan_eval_shards(tasks: Sequence[Task], *, mode: Literal["recursive", "single"], shards: int,
                     folder: str, seed: int | None = None) -> list[Shard]:
    """The evaluation's shards of one mode: one tree per task, seeded as ``rao_core.evaluation`` seeds them
    (``eval_tree_seed(seed, mode, task_id)``; ``seed`` None: unseeded), ``min(shards, len(tasks))`` shards of
    consecutive tasks, objects ``<folder>/eval/shards/<mode>-shard-<i>-of-<n>.jsonl`` (``folder``: ``iter-K`` or
    the nightly's folder). Raises ValueError for no task or ``shards`` < 1."""
    from rao_core.task_sampling import eval_tree_seed

    if shards < 1 or not tasks:
        raise ValueError(f"cannot shard {len(tasks)} evaluation tasks into {shards} shards")
    groups = [RolloutGroup(task=t, rollouts=1, seeds=[None if seed is None else eval_tree_seed(seed, mode, t.task_id)])
              for t in tasks]
    return _cut(groups, shards, lambda i, n: f"{folder}/eval/shards/{mode}-shard-{i + 1}-of-{n}.jsonl", mode=mode)


def _cut(groups: list[RolloutGroup], shards: int, key: Callable[[int, int], str], mode: str | None = None
         ) -> list[Shard]:
    """``groups`` in ``min(shards, len(groups))`` runs of consecutive groups, sizes by ``split_evenly``."""
    from rao_core.task_sampling import split_evenly

    sizes = split_evenly(len(groups), min(shards, len(groups)))
    out, start = [], 0
    for i, n in enumerate(sizes):
        out.append(Shard(index=i, count=len(sizes), groups=groups[start:start + n], key=key(i, len(sizes)),
                         mode=mode))
        start += n
    return out


PolicyFactory = Callable[..., Any]  # (ctx, served) -> rao_core.policies.base.Policy


def worker_name() -> str:
    """``host:pid`` of this process (the Ray worker that grows a shard), and ``@node`` (the first 8 hex digits of
    its Ray node id) inside a Ray worker: several nodes can share a host name."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    ray = sys.modules.get("ray")  # never imported here for this: the local backend does not load Ray
    try:
        if ray is not None and ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
            return f"{name}@{node[:8]}" if node else name
    except Exception:  # noqa: BLE001 - the host and pid say enough
        pass
    return name


def grow_shard(ctx: Any, iteration: int, shard: Shard, served: Any, tokenizer_path: str,
               make_policy: PolicyFactory, work_root: Path | None = None) -> list[ExecutionTree]:
    """Grow the trees of ``shard`` in this process (``run_trees``, its own REPL pool and policy client from
    ``make_policy(ctx, served)``), each with its planned seed; returns them in plan order with ``meta``
    campaign, iteration, shard (``"2/4"``) and worker (:func:`worker_name`) set. ``work_root``: the folder of the REPLs' work folders
    (``runtime.work_root``; None: the config's). Never raises for a rollout failure (``run_trees`` records
    them)."""
    from rao_core.envs import get_env
    from rao_core.runtime import load_tokenizer, run_trees

    from rao_core.evaluation import mode_runtime

    cfg = ctx.config
    runtime = cfg.runtime if shard.mode is None else mode_runtime(cfg.runtime, shard.mode)
    runtime = runtime if work_root is None else runtime.model_copy(update={"work_root": str(work_root)})
    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    seeds = {(g.task.task_id, i): s for g in shard.groups for i, s in enumerate(g.seeds)}
    policy = make_policy(ctx, served)

    async def go() -> list[ExecutionTree]:
        try:
            return await run_trees(env, [(g.task, g.rollouts) for g in shard.groups], policy, runtime,
                                   tokenizer=load_tokenizer(tokenizer_path), progress=False,
                                   seeds=lambda task, g: seeds[(task.task_id, g)])
        finally:
            await policy.aclose()

    trees = asyncio.run(go())
    for t in trees:
        t.meta.update({"campaign": ctx.name, "iteration": iteration, "shard": f"{shard.index + 1}/{shard.count}",
                       "worker": worker_name()})
    return trees


def run_shard(ctx: Any, iteration: int, shard: Shard, served: Any, tokenizer_path: str,
              make_policy: PolicyFactory) -> ShardResult:
    """One shard, start to end (the body of the Ray task): grow its trees (:func:`grow_shard`), write them to a
    local file, upload it as ONE object at ``shard.key`` (whole or absent; an earlier attempt's object at that
    key is replaced), and return where it is with its SHA-256. Local files live in a scratch folder
    ``$TMPDIR/rao-shard-CAMPAIGN-iter-K-I-of-N`` (the REPLs' work folders included), removed at the end, and at
    the start of the next attempt when a lost worker left it.

    Raises whatever the upload raises (``botocore`` errors after boto3's own retries); rollout failures are in
    the trees."""
    import shutil

    from rao_core.tree import write_trees

    # Everything the shard writes locally (the REPLs' work folders, the trees file) goes under one scratch
    # folder per shard, removed at the end; a worker killed mid-shard cannot remove it, so the next attempt
    # on this node removes the earlier attempt's first (its sandboxes died with that worker: bwrap
    # --die-with-parent).
    scratch = Path(tempfile.gettempdir()) / f"rao-shard-{ctx.name}-iter-{iteration}-{shard.index + 1}-of-{shard.count}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        t0 = time.monotonic()
        trees = grow_shard(ctx, iteration, shard, served, tokenizer_path, make_policy, work_root=scratch)
        gen_s = time.monotonic() - t0
        path = write_trees(scratch / "trees.jsonl", trees)  # one unserialisable tree: a failed record
        up = ctx.store().put_file(path, shard.key)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ShardResult(index=shard.index, uri=up["uri"], sha256=up["sha256"], num_trees=len(trees),
                       solved=sum(map(_solved, trees)),
                       crashed=sum(int(bool(t.error)) for t in trees), generation_s=round(gen_s, 3),
                       worker=worker_name())


def _solved(tree: ExecutionTree) -> int:
    try:
        return int(tree.root.verifier == 1.0)
    except KeyError:  # a crashed rollout without its root
        return 0


def read_shards(ctx: Any, what: str, shards: Sequence[Shard], results: Sequence[ShardResult]
                ) -> list[ExecutionTree]:
    """The trees of ``shards``, in shard order: exactly the object each final result names (through the local
    cache, at the object's key), checked against the SHA-256 that result returned, and holding exactly the
    shard's planned (task id, rollout index, seed) triples. ``what`` names the stage in errors
    (``"iteration 1 generate"``).

    Raises:
        ShardError: a shard without its result, or an object whose trees are not the planned ones (a tree
            twice, one missing, another seed).
        ChecksumError: an object that is not the one its result wrote (``infra.storage``).
    """
    from rao_core.tree import read_trees

    by_index = {r.index: r for r in results}
    store, trees = ctx.store(), []
    for s in shards:
        r = by_index.get(s.index)
        if r is None:
            raise ShardError(f"{what}: shard {s.index + 1}/{s.count} returned no result")
        local = ctx.local(s.key)
        local.unlink(missing_ok=True)  # never an earlier attempt's copy
        store.get_file(r.uri, local, sha256=r.sha256)
        got = read_trees(local)
        have = [(t.task_id, t.rollout_index, t.seed) for t in got]
        if have != s.planned():
            missing = sorted(set(s.planned()) - set(have))[:3]
            raise ShardError(f"{what}: {r.uri} holds {len(have)} trees, not the "
                             f"{s.num_trees} planned for shard {s.index + 1}/{s.count} (missing {missing}, "
                             f"{len(have) - len(set(have))} duplicated)")
        trees += got
    return trees


def worker_runtime_env(key_env: str | None = None) -> dict[str, Any]:
    """The runtime environment of the Ray job (:func:`connect`), of each shard's task (:func:`shard_options`) and
    of each policy server replica's actor (``infra.ray_serving.RayReplica.actor_options``): the repository (this
    checkout's path) on every worker's ``PYTHONPATH``, ``RAO_POLICY_API_KEY`` (the key of the pipeline's vLLM
    servers, which the shards' clients send to them only: :func:`infra.serving.policy_api_key`), and when set here
    ``RAO_POLICY_BASE_URL``, the variable ``key_env`` names (``serving.api_key_env``: the key of external policy
    servers), ``RAO_HOME`` and ``RAO_VLLM_PYTHON`` (the vLLM environment a replica's actor starts its server with,
    ``infra/ray_serving.py``)."""
    from infra.serving import policy_api_key

    path = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path)), "RAO_POLICY_API_KEY": policy_api_key()}
    for name in ("RAO_POLICY_BASE_URL", key_env, "RAO_HOME", "RAO_VLLM_PYTHON"):
        if name and os.environ.get(name):
            env[name] = os.environ[name]
    return {"env_vars": env}


def connect(address: str, key_env: str | None = None) -> dict[str, float]:
    """Join the Ray cluster at ``address`` (``execution.ray_address``) unless this process is connected already
    (then its cluster is used as it is), its workers in :func:`worker_runtime_env` of ``key_env``; returns the
    cluster's resources (``{"CPU": 4.0, ...}``). When a Ray token is at hand (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, where ``rao services up --ray`` leaves it) and
    ``RAY_AUTH_MODE`` is unset, token authentication is used. A cluster on 127.0.0.1 (``rao services up --ray``'s)
    is joined on loopback (``infra.services.ray_loopback``: Ray would otherwise
    replace 127.0.0.1 by the host's network address, where that head does not listen). When stdout is not a
    terminal, Ray prints its own lines without colour codes (``RAY_COLOR_PREFIX=0``).

    Raises:
        ShardError: no cluster answers at ``address``: one line saying how to start one.
    """
    token = (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
             or (Path.home() / ".ray" / "auth_token").is_file())
    if token and "ray" not in sys.modules:  # Ray reads the mode once, when it is imported
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # Ray sends its token only in mode 'token'
    from infra.services import is_loopback_address, ray_loopback

    if not sys.stdout.isatty():  # Ray's own lines ("(raylet) A worker died ...") without colour codes in a log
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if is_loopback_address(address) and not ("ray" in sys.modules and sys.modules["ray"].is_initialized()):
        ray_loopback()
    import ray

    if not ray.is_initialized():
        try:
            ray.init(address=address, runtime_env=worker_runtime_env(key_env), log_to_driver=False,
                     logging_level="WARNING")
        except ConnectionError as e:
            raise ShardError(f"execution.backend 'ray': no Ray cluster at execution.ray_address = {address!r} "
                             f"({' '.join(str(e).split())[:200]}); start one with `rao services up --ray`, or "
                             f"set execution.ray_address to a head node's address") from None
    return {k: float(v) for k, v in ray.cluster_resources().items()}


def shard_options(ctx: Any, shard: Shard) -> dict[str, Any]:
    """The Ray task options of ``shard``'s attempt: ``execution.cpus_per_shard`` CPUs, a streaming result, no
    retry of Ray's own (:func:`run_on_ray` retries), a name ``<campaign>-<shard key>``, and the campaign's own
    :func:`worker_runtime_env` (``serving.api_key_env`` of ``ctx.config``). The last is per task because Ray keeps
    the runtime environment of a process's first ``ray.init`` (:func:`connect` joins once per process): a
    second campaign of the same process whose ``serving.api_key_env`` names another variable still hands it
    to its shards (Ray merges a task's ``env_vars`` over the job's)."""
    return {"num_cpus": ctx.config.execution.cpus_per_shard, "num_returns": "streaming", "max_retries": 0,
            "name": f"{ctx.name}-{shard.key.replace('/', '-')}",
            "runtime_env": worker_runtime_env(ctx.config.serving.api_key_env)}


def _shard_served(served: Any, shard: Shard) -> Any:
    """The served endpoint as shard ``shard`` sees it: the same pool of replicas, its ties starting at replica
    ``shard.index`` (``ServedEndpoint.replica_offset``, ``rao_core.policies.pool``), so that the shards' first
    trees do not all go to replica 0. Anything without that field is passed as it is."""
    if hasattr(served, "replica_offset") and hasattr(served, "model_copy"):
        return served.model_copy(update={"replica_offset": shard.index})
    return served


def shard_attempt(ctx: Any, iteration: int | str | None, shard: Shard, served: Any, tokenizer_path: str,
                  make_policy: PolicyFactory) -> Iterator[str | ShardResult]:
    """One attempt at ``shard`` on a Ray worker, as a streaming generator: first who grows it
    (:func:`worker_name`), so that a worker lost mid-shard can be named, then :func:`run_shard`'s result."""
    yield worker_name()
    yield run_shard(ctx, iteration, shard, served, tokenizer_path, make_policy)


def lost_line(what: str, shard: Shard, worker: str, error: BaseException, retry: int, retries: int) -> str:
    """``iteration 1 generate: shard 2/4 lost (its worker vm:4242@2dd65369 died: WorkerCrashedError); redoing
    it, retry 1 of 2 (execution.max_retries)``: the pipeline's line for a shard whose worker or node was lost."""
    where = f"its worker {worker} died" if worker else "lost before it started on a worker"
    return (f"{what}: shard {shard.index + 1}/{shard.count} lost ({where}: {type(error).__name__}); redoing it, "
            f"retry {retry} of {retries} (execution.max_retries)")


def run_on_ray(ctx: Any, iteration: int | str | None, shards: Sequence[Shard], served: Any, tokenizer_path: str,
               make_policy: PolicyFactory, on_result: Callable[[ShardResult], None] | None = None,
               what: str = "") -> list[ShardResult]:
    """Run every shard as a Ray task (:func:`shard_attempt`; ``execution.cpus_per_shard`` CPUs) on the cluster
    of :func:`connect`, calling ``on_result`` as each one completes; returns the results in shard order.

    A shard whose worker or node is lost (any Ray error but the shard's own exception) is submitted again, at
    most ``execution.max_retries`` times, each with one warning line naming the shard, the lost worker and the
    retry (:func:`lost_line`); the retries are the pipeline's, not Ray's, so that the line can be written. An
    exception of the shard's own code is not retried.

    ``make_policy`` must be importable by the workers (a module-level function): Ray sends it by reference.
    ``what`` names the stage in errors (default ``"iteration K generate"``).

    Raises:
        ShardError: a shard failed for good (one line: which shard, why); the shards still running are
            cancelled.
    """
    import ray
    from ray.exceptions import RayError, RayTaskError

    from infra.stage_io import run_logger

    ex = ctx.config.execution
    what = what or f"iteration {iteration} generate"
    connect(ex.ray_address, key_env=ctx.config.serving.api_key_env)
    task = ray.remote(shard_attempt)
    log = run_logger()

    def submit(s: Shard) -> Any:
        return task.options(**shard_options(ctx, s)).remote(
            ctx, iteration, s, _shard_served(served, s), tokenizer_path, make_policy)

    attempts = {submit(s): s for s in shards}
    worker: dict[int, str] = {}  # shard index -> the worker of its current attempt, once it said so
    retries = {s.index: 0 for s in shards}
    pending, results = list(attempts), {}
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            gen = done[0]
            s = attempts[gen]
            try:
                value = ray.get(next(gen))
            except RayError as e:
                if isinstance(e, RayTaskError) or retries[s.index] >= ex.max_retries:
                    cause = e.cause if isinstance(e, RayTaskError) and e.cause is not None else e
                    why = " ".join(f"{type(cause).__name__}: {cause}".split())[:400]
                    lost = f" (its worker {worker[s.index]})" if s.index in worker and not isinstance(
                        e, RayTaskError) else ""
                    raise ShardError(f"{what}: shard {s.index + 1}/{s.count} failed{lost} "
                                     f"({ex.max_retries} retries of a lost worker allowed): {why}") from None
                retries[s.index] += 1
                log.warning(lost_line(what, s, worker.pop(s.index, ""), e, retries[s.index], ex.max_retries))
                again = submit(s)
                attempts[again] = s
                pending.append(again)
                continue
            if isinstance(value, str):  # the attempt's worker; its result comes next
                worker[s.index] = value
                pending.append(gen)
                continue
            results[s.index] = value
            if on_result is not None:
                on_result(value)
    finally:
        for gen in pending:
            try:
                ray.cancel(gen, force=True)
            except Exception:  # noqa: BLE001 - already finished or lost
                pass
    return [results[s.index] for s in shards]
