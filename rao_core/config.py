"""The campaign configuration: one validated object composed of each stage's config.

YAML files under ``configs/`` load into :class:`CampaignConfig` with :func:`load_config`. A bad value
raises :class:`ConfigError` whose one-line message names the file, the field path, the value and what
was expected, e.g. ``configs/x.yaml: algo.G = 1: Input should be greater than or equal to 2`` (or the
``--set algo.G=1`` the value came from); a key given twice in one mapping is refused with its line. Loading
also checks what a campaign would otherwise find out only after its services started: every listed
difficulty is one the environment's generator knows (``tasks``, ``eval`` and ``warm_start``, and each benchmark of
the evaluation suite, ``eval.benchmarks``, on its own environment), the environments accept their options, and
the folders and files the config names exist (:meth:`CampaignConfig.check_paths`).
Environment variables override endpoints and secrets (never stored in YAML): ``RAO_POLICY_BASE_URL``,
``RAO_S3_ENDPOINT``, ``RAO_S3_BUCKET``, ``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``; the judge reads its
own (see ``rao_core.judge.config``).

Stage configs: ``runtime`` -> :class:`rao_core.runtime.RuntimeConfig`, ``trainer`` ->
:class:`rao_core.train.TrainerConfig`, ``judge`` -> :class:`rao_core.judge.JudgeConfig`.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rao_core.evaluation import (BENCHMARK_NAME_PATTERN, STANDARD_BENCHMARKS, Benchmark, DevSet, EvalConfig, Mode,
                                 benchmark_name)
from rao_core.jsonl import one_line_error, short_repr
from rao_core.judge.config import JudgeConfig
from rao_core.paths import default_model_path
from rao_core.runtime.config import RuntimeConfig
from rao_core.samples import AlgoSettings
from rao_core.train.config import TrainerConfig


def checkpoint_config_problem(folder: Path | str) -> str | None:
    """What is wrong with the ``config.json`` of checkpoint folder ``folder``, in words (``"its config.json is
    not JSON (line 1, column 2: Expecting property name ...)"``, ``"... is not a JSON object"``, ``"... is not
    readable"``), or None when it holds a JSON object (a missing file is the caller's own case). Never raises."""
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        return (f"its config.json is not JSON (line {e.lineno}, column {e.colno}: {e.msg}); a checkpoint folder "
                "holds the model's config.json as save_pretrained writes it")
    except (OSError, UnicodeDecodeError) as e:
        return f"its config.json is not readable ({getattr(e, 'strerror', None) or e})"
    if not isinstance(data, dict):
        return f"its config.json is not a JSON object (it holds a {type(data).__name__})"
    return None


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message is one line naming file, field and value."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, then keys that override it: fine
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"line {key_node.start_mark.line + 1}: duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(path: Path, e: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: the file, the line and column where PyYAML found the problem (1-based,
    as editors count), the problem and what it was reading (``while scanning a quoted scalar``), e.g.
    ``configs/x.yaml: line 4, column 7: not valid YAML: mapping values are not allowed here``."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    context = getattr(e, "context", None)
    return f"{path}: {where}not valid YAML: {problem}" + (f" ({context})" if context else "")


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The YAML file at ``path``, parsed; ConfigError (one line naming the file, and the line where known)
    for a missing file, a folder, text that is not UTF-8 or not YAML, a key given twice in one mapping, and a
    file with no content (0 bytes, only comments, ``---`` or ``null``: it would silently mean all defaults)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a folder, not a config file") from None
    except yaml.constructor.ConstructorError as e:
        if e.problem and "duplicate key" in e.problem:
            raise ConfigError(f"{p}: {e.problem}") from None
        raise ConfigError(_yaml_error(p, e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_error(p, e)) from None
    if data is None:  # nothing, only comments, a bare `---` or `null`: never "all defaults" by accident
        raise ConfigError(f"{p}: the config file is empty")
    return data


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSettings(_Strict):
    """The policy checkpoint that starts the campaign."""

    path: Path = Field(default_factory=default_model_path, description="HF checkpoint folder of the initial "
                       "policy (SmolLM2-135M-Instruct by default; Qwen3-4B-Instruct on GPUs).")
    registered_model: str = Field("rao-policy-{campaign}", description="MLflow registered-model name for "
                                  "checkpoints; {campaign} = the campaign name, so each campaign has its own "
                                  "model and champion (a name without it is shared: campaigns compete).")


class ServingSettings(_Strict):
    """How the policy is served during rollouts and evaluation."""

    base_url: str | None = Field(None, description="An external OpenAI-compatible server (then nothing is "
                                 "started and checkpoints are not switched). Env RAO_POLICY_BASE_URL overrides "
                                 "(it replaces base_urls and replicas too).")
    base_urls: list[str] = Field(default_factory=list, description="A pool of external OpenAI-compatible servers "
                                 "serving the same weights (nothing is started), e.g. ['http://h1:8000/v1', "
                                 "'http://h2:8000/v1']: each tree is pinned to one of them for its whole life, "
                                 "trees are spread by load (rao_core/policies/pool.py); LoRA adapters go to every one of them. "
                                 "Not with base_url (use one or the other) nor with replicas > 1.")
    api_key_env: str = Field("OPENAI_API_KEY", description="The environment variable holding the API key sent to "
                             "the external servers of base_url / base_urls (Ray workers get it too); 'EMPTY' when "
                             "it is unset. The servers the pipeline starts, RAO_POLICY_BASE_URL's and loopback "
                             "ones get this installation's key (RAO_POLICY_API_KEY) instead, which no other server "
                             "gets (rao_core.policies.openai_policy.policy_client_key).")
    replicas: int = Field(1, ge=1, description="vLLM servers the serve stage starts (a pool of replicas of the "
                          "same checkpoint), each on its own port with its share of gpus.serve "
                          "(tensor_parallel_size x data_parallel_size GPUs each) or, on CPU, of this machine's "
                          "cores (and its own kv_cache_gib); each tree is pinned to one replica for its whole "
                          "life (prefix cache), new trees go to the replica with the fewest trees in flight; a "
                          "checkpoint switch reaches every replica before the next stage. 1: one server.")
    cpus: list[int] = Field(default_factory=list, description="On CPU, the cores the embedded vLLM server binds "
                            "(VLLM_CPU_OMP_THREADS_BIND), split among serving.replicas; with trainer.cpus, the core "
                            "split that lets asynchronous RL (algo.max_staleness >= 1) generate and train at once "
                            "(e.g. serving.cpus [1], trainer.cpus [0]). Empty: every core. Unused on GPUs.")
    served_model_name: str = Field("policy", description="Model name sent in requests.")
    max_model_len: int = Field(8192, ge=256, description="vLLM context length, tokens (>= runtime.context_window).")
    kv_cache_gib: int = Field(2, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU, GiB.")
    switch: Literal["reload", "restart", "lora", "none"] = Field(
        "reload", description="Checkpoint switch between iterations: 'reload' copies new weights over the served "
        "folder and reloads in place (fast, full fine-tuning); 'restart' restarts the server; 'lora' hot-loads "
        "the adapter (trainer.lora must be set; also on an external base_url server, which must then read the "
        "adapter folder); 'none' (external base_url only): the server keeps its own weights, so rollouts do not "
        "follow training (tests, fixed-policy runs). An external server with 'reload'/'restart' is refused.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM --tensor-parallel-size (GPUs per model replica).")
    data_parallel_size: int = Field(1, ge=1, description="vLLM --data-parallel-size (model replicas); "
                                    "tensor x data parallel = the GPUs of gpus.serve when it is set.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization: the "
                                          "fraction of each serving GPU vLLM takes (weights + KV cache).")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="vLLM --dtype: 'auto' = the checkpoint's on GPUs, bfloat16 on a CPU with native bf16 "
        "(2x the fp32 throughput there), else float32. The trainer computes in fp32 on CPU; the mismatch is "
        "logged as train/kl_mismatch.")
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        "processed_logprobs", description="Which log-probs the policy server returns for sampled tokens: "
        "'processed_logprobs' (after temperature / top-k / top-p: the distribution the tokens were drawn from; "
        "the server is started with it) or 'raw_logprobs' (vLLM's default, before them). For an external server "
        "(base_url) say how it was started. With 'raw_logprobs' only runtime.temperature = 1 and top_p = 1 are "
        "accepted, since otherwise the behaviour log-probs are not those of the sampling distribution.")
    extra_args: list[str] = Field(default_factory=list, description="More vLLM flags, e.g. ['--max-num-seqs', "
                                  "'256'] (parallelism, memory, LoRA and sleep flags come from the fields above).")
    start_timeout_s: float = Field(900.0, gt=0, description="Seconds to wait for the server to be healthy.")
    request_seeds: bool | None = Field(
        None, description="Send each rollout and evaluation request its sampling seed (rao_core.runtime.agent.request_seed) so a "
        "tree's tokens depend on its seed only. None (auto): to servers started on GPUs and to external "
        "endpoints, never to a vLLM started on CPU: vLLM 0.32's CPU engine dies on a seeded request whose "
        "prompt is prefilled in chunks (it rewinds the request's CPU generator, which has no offset: "
        "'CPU Generator does not use offset'). The trees' seeds are recorded either way.")

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, v: str) -> str:
        from rao_core.policies.openai_policy import check_key_env

        return check_key_env(v)

    @field_validator("base_urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        import httpx

        for u in v:
            try:
                url = httpx.URL(u)
            except (httpx.InvalidURL, TypeError) as e:
                raise ValueError(f"{u!r} is not a URL ({e})") from None
            if url.scheme not in ("http", "https") or not url.host:
                raise ValueError(f"{u!r} is not an http(s) URL with a host, e.g. 'http://10.0.0.5:8000/v1'")
        if len(set(v)) != len(v):
            twice = next(u for u in v if v.count(u) > 1)
            raise ValueError(f"{twice!r} is listed twice (each replica once)")
        return v

    @model_validator(mode="after")
    def _one_pool(self) -> ServingSettings:
        if self.base_url and self.base_urls:
            raise ValueError("serving.base_url and serving.base_urls are both set: give one external server as "
                             "base_url or a pool as base_urls, not both")
        if self.replicas > 1 and self.external_urls:
            raise ValueError(f"serving.replicas = {self.replicas} with an external server ("
                             f"serving.{'base_urls' if self.base_urls else 'base_url'}): replicas counts the vLLM "
                             "servers the campaign starts; list external replicas in serving.base_urls instead")
        return self

    @property
    def external_urls(self) -> list[str]:
        """The external servers (``base_urls``, or ``[base_url]``); empty when the campaign starts its own."""
        return list(self.base_urls) or ([self.base_url] if self.base_url else [])

    @property
    def pool_size(self) -> int:
        """Policy server replicas of a campaign: the external servers, else ``replicas``."""
        return len(self.external_urls) or self.replicas


class GpuPlacement(_Strict):
    """Which GPUs each process gets (``rao run --plan`` prints the placement and checks that it fits).
    Empty lists: no placement (CPU machines; on GPUs, whatever CUDA_VISIBLE_DEVICES says)."""

    serve: list[int] = Field(default_factory=list, description="CUDA devices of the vLLM server "
                             "(CUDA_VISIBLE_DEVICES): serving.tensor_parallel_size x data_parallel_size of them.")
    train: list[int] = Field(default_factory=list, description="CUDA devices of the training processes, one "
                             "`accelerate launch` process each: the gpu_ids and num_processes of "
                             "trainer.accelerate_config (checked by the plan).")
    sleep_while_training: bool = Field(False, description="Start vLLM with --enable-sleep-mode and put it to "
                                       "sleep (level 1: weights to CPU memory, KV cache freed) while the trainer "
                                       "runs; for serve and train sharing GPUs.")

    @model_validator(mode="after")
    def _check(self) -> GpuPlacement:
        for name, ids in (("serve", self.serve), ("train", self.train)):
            if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
                raise ValueError(f"gpus.{name} = {ids}: GPU indices must be distinct and >= 0")
        return self


class CheckpointSettings(_Strict):
    """Retention of iteration checkpoints: ``infra.retention.prune_campaign`` after every iteration.

    The default keeps what users come back to and what resume needs, and bounds the disk: on S3 iteration 0
    (the warm start), the newest iteration (the parent of the next one), every version a registry alias
    (champion, candidate) points at; the optimizer state of the newest checkpoint only; no local copy of a
    checkpoint whose upload is verified (a stage that needs one fetches it from S3)."""

    keep_last: int | None = Field(1, ge=1, description="Keep the newest N iteration checkpoints on S3; older "
                                  "ones are deleted (S3 and the local cache), except iteration 0 (the warm start, "
                                  "the base of LoRA adapters) and every version a registry alias (champion, "
                                  "candidate) points at. None: keep all.")
    optimizer_state: Literal["latest", "all"] = Field(
        "latest", description="Whose optimizer state (the checkpoint's `optimizer/` folder, twice the weights "
        "with Adam) is kept: 'latest': the newest checkpoint's only (the next iteration continues from it); "
        "'all': every kept checkpoint's.")
    local_copies: Literal["none", "latest", "all"] = Field(
        "none", description="Local copies (RAO_HOME/campaigns/NAME/checkpoints) kept after an iteration: 'none': "
        "each one is removed once its upload to S3 is verified (S3 is the store; a stage that needs one fetches "
        "it); 'latest': the newest iteration's stays; 'all': none is removed.")


class TaskSettings(_Strict):
    """Where RL tasks come from and how many are used per iteration."""

    env: str = Field("textcraft-synth", description="Environment name (see rao_core.envs.ENV_NAMES).")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the environment.")
    train_file: Path | None = Field(None, description="JSONL task file; None = generate with the seeded generator.")
    difficulties: list[str] = Field(default_factory=lambda: ["easy"], min_length=1, description="Training "
                                    "difficulties (names of the environment's ``difficulties``).")
    pool_size: int = Field(64, ge=1, description="Generated training tasks per difficulty.")
    tasks_per_iteration: int = Field(4, ge=1, description="RL tasks sampled per iteration (each gets G rollouts).")
    generator_options: dict[str, Any] = Field(default_factory=dict, description="Extra generate_tasks options.")


def _default_sft() -> TrainerConfig:
    from rao_core.warmstart import default_sft_trainer_config

    return default_sft_trainer_config()


class WarmStartSettings(_Strict):
    """How the campaign's iteration-0 checkpoint is made."""

    mode: Literal["none", "demos", "checkpoint"] = Field(
        "none", description="'none': start from model.path; 'demos': SFT on expert demonstrations built through "
        "the runtime; 'checkpoint': start from a registered model version (`checkpoint`).")
    checkpoint: str | None = Field(None, description="For mode 'checkpoint': 'models:/NAME@ALIAS', "
                                   "'models:/NAME/VERSION', an s3:// URI or a local folder (copied to the "
                                   "campaign's iter-0/checkpoint on S3, so it resumes on another machine).")
    n_tasks: int = Field(16, ge=1, description="Demonstration tasks (mode 'demos'), split over difficulties.")
    difficulties: list[str] = Field(default_factory=lambda: ["easy", "medium"], min_length=1,
                                    description="Difficulties of the demonstration tasks (mode 'demos').")
    options: dict[str, Any] = Field(default_factory=dict, description="Extra rao_core.warmstart.DemoConfig fields.")
    trainer: TrainerConfig = Field(default_factory=lambda: _default_sft(),
                                   description="Trainer settings of the SFT step (loss_type 'sft'); default "
                                   "rao_core.warmstart.default_sft_trainer_config().")

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_ref(cls, v: str | None) -> str | None:
        if v and v.startswith("models:/") and not re.fullmatch(r"models:/[^/@]+(@[^/@]+|/\d+)", v):
            raise ValueError(f"{v!r} is not 'models:/NAME@ALIAS' or 'models:/NAME/VERSION'")
        if v and v.startswith("s3://") and not re.fullmatch(r"s3://[^/]+/.+", v):
            raise ValueError(f"{v!r} is not 's3://BUCKET/KEY'")
        return v

    @model_validator(mode="after")
    def _check(self) -> WarmStartSettings:
        if self.mode == "checkpoint" and not self.checkpoint:
            raise ValueError("warm_start.mode 'checkpoint' needs warm_start.checkpoint")
        if self.checkpoint and self.mode != "checkpoint":  # it would be silently ignored
            raise ValueError(f"warm_start.checkpoint is set but warm_start.mode is {self.mode!r}; set "
                             "warm_start.mode=checkpoint to start from it")
        return self


class Endpoint(_Strict):
    """The preregistered endpoint of an experiment: which point is compared with which, by which test, at
    which n; written in the config and committed before the first run, and copied into the experiment's
    record (``docs/results/<experiment>.json``, key ``endpoint``). Other comparisons are exploratory."""

    arm: str = Field(min_length=1, description="Arm whose point is the endpoint (an arm of `rao experiment`, "
                     "e.g. 'recursive').")
    difficulty: str = Field(min_length=1, description="Evaluated difficulty of the endpoint (one of "
                            "eval.difficulties).")
    mode: Literal["recursive", "single"] = Field(description="Evaluation mode of the endpoint's point.")
    iteration: int | Literal["last"] = Field("last", description="RL iteration of the endpoint: 'last' or a "
                                             "number (0 = the warm start).")
    against: str = Field("warm_start", min_length=1, description="What it is compared with: 'warm_start' (the "
                         "same arm's iteration 0) or another arm's name (that arm's point at the same iteration).")
    test: str = Field(min_length=1, description="Name of the preregistered test, e.g. 'two_proportion_z' "
                      "(one-sided pooled z-test, rao_core.evaluation.two_proportion_test), 'mcnemar' (paired "
                      "on per-task outcomes) or a test over seeds.")
    n: int = Field(ge=1, description="Evaluation tasks per point at the endpoint (per seed).")
    min_difference: float | None = Field(None, ge=-1, le=1, description="Smallest difference of success rates "
                                         "(the endpoint's point minus `against`'s, pooled over seeds) the endpoint "
                                         "also needs to be supported; None = the test alone decides "
                                         "(research.records.seed_comparison).")

    @field_validator("iteration")
    @classmethod
    def _iteration(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"iteration must be 'last' or >= 0, got {v}")
        return v


class BenchmarkSettings(_Strict):
    """One benchmark of the campaign's evaluation suite besides the training one (``eval.benchmarks.<name>``,
    the name its metric keys carry: ``eval/<name>/<mode>/<difficulty>/success``). A field left unset is the
    ``eval`` section's own (n_tasks, seed, split, modes, graded, stored_trees) or, for a name of the standard
    suite (``rao_core.evaluation.STANDARD_BENCHMARKS``: textcraft, oolong, deepdive, arte), the standard entry's
    (env, difficulties)."""

    env: str | None = Field(None, description="Environment (rao_core.envs); unset: the standard benchmark's of this "
                            "name (required for another name).")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the environment.")
    generator_options: dict[str, Any] = Field(default_factory=dict, description="Extra generate_tasks options "
                                              "(e.g. Oolong's target_tokens).")
    difficulties: list[str] | None = Field(None, description="Difficulties evaluated; unset: the standard "
                                           "benchmark's (required for another name).")
    n_tasks: int | None = Field(None, ge=1, description="Tasks per difficulty; unset: eval.n_tasks.")
    seed: int | None = Field(None, description="Seed of its evaluation tasks; unset: eval.seed.")
    split: str | None = Field(None, description="Task split; unset: eval.split.")
    modes: list[Mode] | None = Field(None, description="'recursive' and/or 'single'; unset: eval.modes.")
    graded: bool | None = Field(None, description="Graded success (mean verifier value); unset: eval.graded.")
    stored_trees: int | None = Field(None, ge=0, description="Compact trees kept per row; unset: eval.stored_trees.")
    at: Literal["every", "ends"] = Field("every", description="Which evaluation points of a campaign evaluate it: "
                                         "'every' (each one eval.every asks for) or 'ends' (iteration 0, the "
                                         "starting checkpoint, and the last iteration only: the CPU smoke run's "
                                         "setting, to keep its time).")
    regression_n_tasks: int | None = Field(None, ge=1, description="Tasks per difficulty in the nightly "
                                           "regression; unset: eval.regression_n_tasks.")


class SuiteBenchmark(Benchmark):
    """A benchmark of a campaign's suite, resolved (:meth:`CampaignConfig.suite`): a
    ``rao_core.evaluation.Benchmark`` with its campaign schedule and its nightly task count."""

    at: Literal["every", "ends"] = Field("every", description="'every' evaluation point or the 'ends' only (iteration "
                                         "0 and the last).")
    regression_n_tasks: int = Field(100, ge=1, description="Tasks per difficulty in the nightly regression.")


class EvalSettings(EvalConfig):
    """Evaluation after each iteration and for the nightly regression, as a suite of benchmarks: the fields of
    :class:`rao_core.evaluation.EvalConfig` (difficulties, n_tasks, seed, split, modes, graded, stored_trees)
    are the training benchmark's evaluation (``tasks.env``, its options and generator options), ``benchmarks``
    the others (:class:`BenchmarkSettings`; by default the standard suite's other three), each run by
    ``rao_core.evaluation.evaluate_suite`` with the campaign's ``runtime``
    (:meth:`CampaignConfig.suite`); plus the pipeline's own fields and the experiment's preregistration
    (``endpoint``) and development set (``dev``)."""

    enabled: bool = Field(True, description="Evaluate every new checkpoint.")
    benchmarks: dict[str, BenchmarkSettings] | None = Field(
        None, description="The suite's benchmarks besides the training one (tasks.env, evaluated by the fields "
        "above), by name (the name in their metric keys: eval/<name>/<mode>/<difficulty>/success). Unset: the "
        "standard suite's (textcraft, oolong, deepdive, arte) other than the training benchmark, each with its "
        "standard difficulties and the fields above, when tasks.env is one of theirs; none for another "
        "environment. {}: the training benchmark alone.")
    primary_benchmark: str | None = Field(None, description="The benchmark whose rows decide: the champion rule's "
                                          "default primary metric and the collapse guard's tested rows (the "
                                          "others are reported); unset: the training benchmark. It must be "
                                          "evaluated at every point (at: every).")
    tolerance: float = Field(0.05, ge=0, description="A drop of success larger than this vs the champion is a "
                             "regression.")
    primary_metric: str | None = Field(None, description="Metric that ranks checkpoints for the champion alias "
                                       "(default: the primary benchmark's success in its first mode on its first "
                                       "difficulty: eval/<benchmark>/<mode>/<difficulty>/success; a "
                                       "key without the benchmark, eval/<mode>/<difficulty>/success, is the "
                                       "primary benchmark's).")
    regression_alpha: float = Field(0.05, gt=0, lt=1, description="The nightly regression's level: a candidate "
                                    "within the tolerance fails at most this share of nights (rao_core.regression: "
                                    "a one-sided paired test of 'drop > tolerance' on per-task outcomes).")
    regression_n_tasks: int = Field(100, ge=1, description="Tasks per difficulty of the nightly regression (its own "
                                    "evaluation, same seed and split; the first eval.n_tasks of them are the "
                                    "campaign's). 100 = rao_core.regression.choose_n on the CPU budget: both "
                                    "checkpoints in ~15 min; at tolerance 0.1 and alpha 0.05 a drop of 0.27 is "
                                    "caught with 80% power (detectable_drop, a conservative model).")
    dev: DevSet | None = Field(None, description="The development set for probes and design decisions "
                               "(rao_core.evaluation.DevSet: its own seed, n_tasks per difficulty; disjoint from "
                               "the evaluation set by construction). None: no development set.")
    endpoint: Endpoint | None = Field(None, description="The preregistered endpoint (Endpoint), copied into the "
                                      "experiment's record. None: none registered.")
    co_primary: list[Endpoint] = Field(default_factory=list, description="Further preregistered primary "
                                       "endpoints, judged with `endpoint` under Holm's correction over all of them "
                                       "(research.records.primary_verdict): every one holds -> supported, some -> "
                                       "mixed, none -> not supported. Empty: `endpoint` alone decides.")

    @model_validator(mode="after")
    def _check_sets(self) -> EvalSettings:
        for name in self.benchmarks or {}:
            if not re.fullmatch(BENCHMARK_NAME_PATTERN, name):
                raise ValueError(f"eval.benchmarks.{name}: not a benchmark name (lowercase letters, digits, '-' "
                                 "and '_', starting with a letter or digit): it is the second part of its metric "
                                 "keys")
        if self.dev is not None and self.dev.seed == self.seed:
            raise ValueError(f"eval.dev.seed = {self.dev.seed} is eval.seed: the development set needs its own seed")
        if self.co_primary and self.endpoint is None:
            raise ValueError("eval.co_primary is set without eval.endpoint: name the first primary endpoint there")
        for key, e in self.primary_endpoints():
            if e.difficulty not in self.difficulties:
                raise ValueError(f"{key}.difficulty = {e.difficulty!r} is not one of eval.difficulties "
                                 f"{self.difficulties}")
        return self

    def primary_endpoints(self) -> list[tuple[str, Endpoint]]:
        """The preregistered primary endpoints with their config keys: ``eval.endpoint`` (when set), then
        ``eval.co_primary[i]``."""
        first = [("eval.endpoint", self.endpoint)] if self.endpoint is not None else []
        return first + [(f"eval.co_primary[{i}]", e) for i, e in enumerate(self.co_primary)]


class ExecutionSettings(_Strict):
    """Where the generate stage grows its trees (``infra/ray_rollouts.py``). 'local': in the flow's own
    process, as one ``run_trees`` call (no Ray process is started). 'ray': its groups (a task and its G rollouts;
    a group is never split, the leave-one-out baseline needs all its trees) are cut into ``shards``, each one a
    Ray task that grows its trees with its own REPL sandboxes and policy client and writes them to one S3 object;
    the stage then reads exactly those objects. Every tree has the same task and sampling seed whatever the
    backend and the shard count (``rao_core.task_sampling.rollout_seed``)."""

    backend: Literal["local", "ray"] = Field("local", description="'local' (one process) or 'ray' (shards on a "
                                             "Ray cluster).")
    ray_address: str = Field("auto", min_length=1, description="Ray cluster to connect to: 'auto' (the cluster "
                             "`rao services up --ray` or `ray start` runs on this machine) or a head node's "
                             "address, e.g. 10.0.0.5:6379 (ray.init's address).")
    shards: int = Field(4, ge=1, description="Shards per generate stage (at most one per group: min(shards, "
                        "tasks.tasks_per_iteration)); Ray runs as many at once as its CPUs allow (cpus_per_shard).")
    cpus_per_shard: float = Field(1.0, gt=0, description="Ray CPUs one shard holds (its rollout loop; the REPL "
                                  "sandboxes it starts are not counted by Ray).")
    max_retries: int = Field(2, ge=0, description="Ray task retries of a shard whose worker was lost (process "
                                "killed, node gone); the retried shard regrows all its trees and overwrites its "
                                "own object. An exception raised by the shard's code is not retried.")
    ray_replicas: bool = Field(True, description="With backend 'ray', the serve stage's vLLM servers (every "
                               "replica of serving.replicas) are Ray actors placed by Ray on a node with the "
                               "resources they ask for (cpus_per_replica CPUs; on a cluster with GPUs, tensor x "
                               "data parallel GPUs: gpus.serve's when set and on the flow's node, else those Ray "
                               "assigns), spread over the nodes, each holding its server process "
                               "(infra/ray_serving.py). False: processes of the flow on its own machine.")
    cpus_per_replica: float = Field(0.0, ge=0, description="Ray CPUs a policy server replica's actor reserves "
                                    "while it lives (ray_replicas). 0 (default): the replicas are placed by their "
                                    "GPUs (on a cluster with GPUs) and spread over the nodes, and the shards keep "
                                    "every Ray CPU (on a CPU machine the servers' cores are theirs by "
                                    "VLLM_CPU_OMP_THREADS_BIND, outside Ray's count); > 0 reserves them, and the "
                                    "cluster must keep cpus_per_shard for one shard besides.")


class StorageSettings(_Strict):
    """Artifacts on S3. Default: the embedded SeaweedFS server."""

    bucket: str = Field("rao", description="Bucket (env RAO_S3_BUCKET overrides).")
    endpoint_url: str | None = Field(None, description="S3 endpoint; None = embedded SeaweedFS (or env "
                                     "RAO_S3_ENDPOINT; use 'aws' for AWS S3 with the standard credentials chain).")


class TrackingSettings(_Strict):
    """MLflow. Default: SQLite under RAO_HOME (env MLFLOW_TRACKING_URI overrides)."""

    tracking_uri: str | None = None
    experiment: str = Field("rao", description="MLflow experiment name.")
    log_traces: bool = Field(True, description="Log every execution tree as an MLflow trace.")
    max_traces_per_iteration: int = Field(64, ge=0, description="Cap of traces logged per iteration.")


class GuardSettings(_Strict):
    """The collapse guard (``rao_core.guard``): after each RL iteration, the held-out evaluation is compared
    task by task with the evaluation of the checkpoint the iteration trained from (a one-sided exact sign test
    on the discordant tasks, per mode and difficulty); a significant drop is a collapse, whose checkpoint never
    becomes ``champion``. Without ``eval.enabled`` there is nothing to compare: every verdict is 'no_reference'."""

    enabled: bool = Field(True, description="Judge every RL iteration (False: every checkpoint is registered and "
                          "ranked by the champion rule alone, as before the guard).")
    alpha: float = Field(0.05, gt=0, lt=1, description="One-sided level of the exact sign test, shared by the "
                         "evaluation's rows (each row's p is compared with alpha / rows: at most alpha false "
                         "alarms per iteration).")
    min_drop: float = Field(0.1, ge=0, le=1, description="Smallest drop of held-out success rate (reference minus "
                            "new, over the tasks scored in both) that counts as a collapse, besides significance: "
                            "a smaller significant dip is the nightly regression's matter (eval.tolerance).")
    action: Literal["rollback", "stop", "warn"] = Field(
        "rollback", description="After a collapse (never promoted in any case): 'rollback' (default) trains the "
        "next iteration from the last good checkpoint, so the remaining iterations are spent on a policy that "
        "still has the skill instead of waiting for it to return (textcraft-nested: of two seeds that lost theirs "
        "in one iteration, one never regained it), and nobody needs to watch the campaign; 'stop' ends the "
        "campaign after the collapsed iteration (not "
        "marked complete: a re-run with another action goes on); 'warn' only reports and trains on from the "
        "collapsed checkpoint. With overlapped iterations (algo.max_staleness >= 1) the next iteration has "
        "already trained from the collapsed checkpoint when it is judged, so 'rollback' stops as 'stop' does.")


#: A campaign's (or experiment's) name: an S3 prefix, MLflow run name and resume key.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"


class CampaignConfig(_Strict):
    """Everything a campaign needs. Field groups are documented in their own classes."""

    name: str = Field("smoke", pattern=NAME_PATTERN, description="Campaign name: S3 prefix, MLflow "
                      "run name, resume key (lowercase letters, digits, dashes).")
    iterations: int = Field(2, ge=0, description="RL iterations to run.")
    seed: int = Field(0, description="Master seed (task sampling, rollout sampling seeds).")
    model: ModelSettings = Field(default_factory=ModelSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    tasks: TaskSettings = Field(default_factory=TaskSettings)
    algo: AlgoSettings = Field(default_factory=AlgoSettings)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    judge: JudgeConfig = Field(default_factory=lambda: JudgeConfig(enabled=False))
    warm_start: WarmStartSettings = Field(default_factory=WarmStartSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    gpus: GpuPlacement = Field(default_factory=GpuPlacement)
    checkpoints: CheckpointSettings = Field(default_factory=CheckpointSettings)
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings)
    guard: GuardSettings = Field(default_factory=GuardSettings)

    @field_validator("tasks")
    @classmethod
    def _known_env(cls, v: TaskSettings) -> TaskSettings:
        from rao_core.envs import env_class

        try:
            env_class(v.env)  # a registry name, an alias, or an import path 'module:Class' (registered here)
        except ValueError as e:
            raise ValueError(f"tasks.env = {v.env!r}: {e}") from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> CampaignConfig:
        if self.runtime.context_window > self.serving.max_model_len:
            raise ValueError(f"runtime.context_window ({self.runtime.context_window}) exceeds "
                             f"serving.max_model_len ({self.serving.max_model_len})")
        if self.serving.switch == "lora" and self.trainer.lora is None:
            raise ValueError("serving.switch 'lora' needs trainer.lora")
        self._serving_placement()
        self._one_sampling_temperature()
        self._difficulties_fit_env()
        self._suite_fits()
        self._endpoints_evaluated()
        return self

    # -- the evaluation suite --------------------------------------------------------------------------------
    def training_benchmark_name(self) -> str:
        """The training benchmark's name: ``rao_core.evaluation.benchmark_name`` of ``tasks.env``
        (``textcraft-synth`` -> ``textcraft``)."""
        return benchmark_name(self.tasks.env)

    def other_benchmarks(self) -> dict[str, BenchmarkSettings]:
        """``eval.benchmarks`` as given, or unset: the standard suite's other benchmarks, with no field set, when
        ``tasks.env`` is one of the standard suite's environments; none for another environment (a campaign on
        one's own task evaluates that task alone unless it lists benchmarks)."""
        if self.eval.benchmarks is not None:
            return dict(self.eval.benchmarks)
        from rao_core.envs import canonical_name

        train = canonical_name(self.tasks.env)
        standard = {name: canonical_name(spec["env"]) for name, spec in STANDARD_BENCHMARKS.items()}
        if train not in standard.values():
            return {}
        return {name: BenchmarkSettings() for name, env in standard.items() if env != train}

    def suite(self) -> list[SuiteBenchmark]:
        """The campaign's evaluation suite, training benchmark first: ``tasks.env`` (its options and generator
        options) with the ``eval`` section's own fields, then each of :meth:`other_benchmarks` with its fields,
        those it leaves unset taken from the standard entry of its name (env, difficulties) and from the ``eval``
        section (n_tasks, seed, split, modes, graded, stored_trees, regression_n_tasks). Raises ValueError
        naming ``eval.benchmarks.<name>`` for an entry that cannot be resolved (a name outside the standard suite
        without env or difficulties, an empty or repeated list)."""
        ev = self.eval
        inherited = {f: getattr(ev, f) for f in ("n_tasks", "seed", "split", "modes", "graded", "stored_trees")}
        out = [SuiteBenchmark(name=self.training_benchmark_name(), env=self.tasks.env,
                              env_options=dict(self.tasks.env_options),
                              generator_options=dict(self.tasks.generator_options), difficulties=list(ev.difficulties),
                              regression_n_tasks=ev.regression_n_tasks, **inherited)]
        for name, b in self.other_benchmarks().items():
            std = STANDARD_BENCHMARKS.get(name, {})
            env, difficulties = b.env or std.get("env"), b.difficulties or std.get("difficulties")
            if env is None or difficulties is None:
                raise ValueError(f"eval.benchmarks.{name}: not a standard benchmark "
                                 f"({', '.join(STANDARD_BENCHMARKS)}): set its env and difficulties")
            given = {f: v for f in inherited if (v := getattr(b, f)) is not None}
            try:
                out.append(SuiteBenchmark(name=name, env=env, env_options=dict(b.env_options),
                                          generator_options=dict(b.generator_options), difficulties=list(difficulties),
                                          at=b.at, regression_n_tasks=b.regression_n_tasks or ev.regression_n_tasks,
                                          **{**inherited, **given}))
            except ValidationError as e:
                raise ValueError(f"eval.benchmarks.{name}: {one_line_error(e)}") from None
        return out

    def suite_at(self, iteration: int | str | None = None) -> list[SuiteBenchmark]:
        """The benchmarks evaluated after iteration ``iteration``: every one at iteration 0 and the last
        (``iterations``), those with ``at`` 'every' in between; all for None or a label (an evaluation outside
        the campaign's iterations)."""
        suite = self.suite()
        if not isinstance(iteration, int):
            return suite
        ends = iteration == 0 or iteration >= self.iterations
        return [b for b in suite if ends or b.at == "every"]

    def primary_benchmark(self) -> str:
        """The deciding benchmark's name: ``eval.primary_benchmark``, else the training benchmark's."""
        return self.eval.primary_benchmark or self.training_benchmark_name()

    def _suite_fits(self) -> None:
        """With evaluation on, the suite resolves (:meth:`suite`), no other benchmark takes the training
        benchmark's name, every benchmark's environment exists and accepts its options and knows its
        difficulties, and ``eval.primary_benchmark`` names a benchmark evaluated at every point."""
        if not self.eval.enabled:
            return
        from rao_core.envs import get_env

        train = self.training_benchmark_name()
        if train in (self.eval.benchmarks or {}):
            raise ValueError(f"eval.benchmarks.{train}: {train!r} is the training benchmark (tasks.env = "
                             f"{self.tasks.env!r}), evaluated by eval's own fields (eval.difficulties, "
                             "eval.n_tasks, ...): list only the other benchmarks there, or give this one another name")
        suite = self.suite()
        for b in suite[1:]:
            key = f"eval.benchmarks.{b.name}"
            try:
                env = get_env(b.env, **b.env_options)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{key}: environment {b.env!r} with options {b.env_options!r}: "
                                 f"{one_line_error(e)}") from None
            for d in b.difficulties:
                try:
                    env.check_difficulty(d)
                except ValueError as e:
                    raise ValueError(f"{key}.difficulties = {b.difficulties!r}: {e}") from None
        names = {b.name: b for b in suite}
        primary = self.primary_benchmark()
        if primary not in names:
            raise ValueError(f"eval.primary_benchmark = {primary!r} is not a benchmark of the suite "
                             f"({', '.join(names)})")
        if names[primary].at != "every":
            raise ValueError(f"eval.primary_benchmark = {primary!r} is evaluated only at the ends (at: ends): the "
                             "champion rule and the collapse guard need it at every evaluation point")

    def _endpoints_evaluated(self) -> None:
        """A preregistered endpoint (``eval.endpoint``, ``eval.co_primary``) that names an iteration names one
        the campaign evaluates (``eval.every``; at most ``iterations``): an endpoint without a point cannot be
        judged, and a run would find out only at its end."""
        if not self.eval.enabled:
            return
        for key, e in self.eval.primary_endpoints():
            if not isinstance(e.iteration, int):
                continue
            if e.iteration > self.iterations or not self.eval.evaluates(e.iteration, self.iterations):
                raise ValueError(f"{key}.iteration = {e.iteration} is not evaluated: a campaign of {self.iterations} "
                                 f"iterations with eval.every {self.eval.every} evaluates after "
                                 f"{self.eval.evaluated_iterations(self.iterations)}")

    def _difficulties_fit_env(self) -> None:
        """Every difficulty the campaign generates tasks for is one its environment's generator knows
        (``Environment.check_difficulty``), and the environment accepts ``tasks.env_options``. Lists that
        are not used are not checked: ``tasks`` with a ``train_file``, ``eval`` when disabled,
        ``warm_start`` outside mode 'demos'."""
        from rao_core.envs import get_env

        try:
            env = get_env(self.tasks.env, **self.tasks.env_options)
        except (TypeError, ValueError) as e:
            raise ValueError(f"tasks.env_options = {self.tasks.env_options!r}: not accepted by {self.tasks.env}: "
                             f"{one_line_error(e)}") from None
        used = [("tasks.difficulties", self.tasks.difficulties, self.tasks.train_file is None),
                ("eval.difficulties", self.eval.difficulties, self.eval.enabled),
                ("warm_start.difficulties", self.warm_start.difficulties, self.warm_start.mode == "demos")]
        for key, names, active in used:
            for d in names if active else []:
                try:
                    env.check_difficulty(d)
                except ValueError as e:
                    raise ValueError(f"{key} = {names!r}: {e} (tasks.env = {self.tasks.env!r})") from None

    def check_paths(self) -> CampaignConfig:
        """Raise ConfigError (one line naming the key) when a folder or file the config names is missing:
        ``model.path`` when set (the default is checked by ``rao run``, which says how to build it),
        ``tasks.train_file`` when set, a local ``warm_start.checkpoint`` in mode 'checkpoint'. Registry
        (``models:/``) and ``s3://`` references are resolved when the campaign runs."""
        problems = self.path_problems()
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    def path_problems(self) -> list[str]:
        """What :meth:`check_paths` refuses: one ``KEY = 'VALUE': what is wrong`` per missing path, a model folder
        whose ``config.json`` is not a JSON object (:func:`checkpoint_config_problem`), a task file that is a
        folder."""
        ckpt = self.warm_start.checkpoint
        problems = []
        if "path" in self.model.model_fields_set:
            if not (self.model.path / "config.json").is_file():
                problems.append(f"model.path = '{self.model.path}': model not found (no config.json there)")
            elif (bad := checkpoint_config_problem(self.model.path)) is not None:
                problems.append(f"model.path = '{self.model.path}': {bad}")
        if self.tasks.train_file is not None and self.tasks.train_file.is_dir():
            problems.append(f"tasks.train_file = '{self.tasks.train_file}': is a folder, not a task file (JSON lines, "
                            "one task per line; `rao tasks generate` writes one)")
        elif self.tasks.train_file is not None and not self.tasks.train_file.is_file():
            problems.append(f"tasks.train_file = '{self.tasks.train_file}': file not found")
        if (self.warm_start.mode == "checkpoint" and ckpt and not ckpt.startswith(("models:/", "s3://"))
                and not any((Path(ckpt) / f).is_file() for f in ("config.json", "adapter_config.json"))):
            problems.append(f"warm_start.checkpoint = '{ckpt}': no checkpoint folder there (config.json or "
                            "adapter_config.json); expected a folder, models:/NAME@ALIAS, models:/NAME/VERSION "
                            "or s3://BUCKET/KEY")
        ref = self.trainer.kl_reference
        if (self.trainer.kl_coef > 0 and ref not in (None, "warm_start")
                and not (Path(str(ref)) / "config.json").is_file()):
            problems.append(f"trainer.kl_reference = '{ref}': no checkpoint folder there (config.json); expected a "
                            "folder or 'warm_start'")
        return problems

    def _one_sampling_temperature(self) -> None:
        """ONE temperature for sampler and trainer: ``runtime.temperature`` (docs/algorithm.md).

        The trainer's log-probs must be those of the distribution the rollout tokens were drawn from, as
        recorded by the server. So ``trainer.temperature`` is set from ``runtime.temperature`` (an explicit
        different value is an error), and combinations whose behaviour log-probs the trainer cannot
        reproduce are refused: greedy sampling (temperature 0) and, with raw server log-probs, any
        temperature other than 1 or top_p < 1.
        """
        rt, tr = self.runtime, self.trainer
        if rt.temperature <= 0:
            raise ValueError("runtime.temperature = 0 (greedy) cannot be trained with a policy gradient: the "
                             "sampled tokens have no log-prob to reproduce; use a temperature > 0")
        if "temperature" in tr.model_fields_set and tr.temperature != rt.temperature:
            raise ValueError(f"trainer.temperature ({tr.temperature}) differs from runtime.temperature "
                             f"({rt.temperature}): set only runtime.temperature, the trainer follows it")
        if self.serving.logprobs_mode == "raw_logprobs" and (rt.temperature != 1.0 or rt.top_p != 1.0):
            raise ValueError(f"serving.logprobs_mode 'raw_logprobs' with runtime.temperature = {rt.temperature}, "
                             f"top_p = {rt.top_p}: raw log-probs are not those of the sampling distribution; "
                             "use 'processed_logprobs' (or temperature 1 and top_p 1)")
        tr.temperature = rt.temperature

    def _serving_placement(self) -> None:
        """vLLM's parallelism, memory, LoRA and sleep flags have one source; gpus.serve matches TP x DP.
        (An external server's switch is checked by :func:`load_config`: :func:`external_switch_problem`.)"""
        s = self.serving
        if self.algo.max_staleness >= 1 and self.gpus.sleep_while_training:
            raise ValueError("algo.max_staleness >= 1 (asynchronous RL) generates while the trainer runs: serving "
                             "cannot sleep for training (gpus.sleep_while_training); give them separate GPUs "
                             "(gpus.serve, gpus.train) or set algo.max_staleness 0")
        if s.switch == "none" and not s.external_urls:
            raise ValueError("serving.switch 'none' needs serving.base_url (an embedded server always follows "
                             "the trained checkpoint)")
        owned = {"--tensor-parallel-size", "--data-parallel-size", "--gpu-memory-utilization", "--max-lora-rank",
                 "--enable-lora", "--enable-sleep-mode"}
        for a in s.extra_args:
            if a.split("=")[0] in owned:
                raise ValueError(f"serving.extra_args has {a}: it is set from the config (serving."
                                 "tensor_parallel_size / data_parallel_size / gpu_memory_utilization, trainer.lora, "
                                 "gpus.sleep_while_training)")
        n = s.tensor_parallel_size * s.data_parallel_size
        if self.gpus.serve and s.replicas == 1 and len(self.gpus.serve) != n:
            raise ValueError(f"gpus.serve has {len(self.gpus.serve)} GPUs but serving.tensor_parallel_size x "
                             f"data_parallel_size = {s.tensor_parallel_size} x {s.data_parallel_size} = {n}")
        if self.gpus.serve and s.replicas > 1 and len(self.gpus.serve) != s.replicas * n:
            raise ValueError(f"gpus.serve has {len(self.gpus.serve)} GPUs but serving.replicas x "
                             f"tensor_parallel_size x data_parallel_size = {s.replicas} x {s.tensor_parallel_size} "
                             f"x {s.data_parallel_size} = {s.replicas * n} (each replica gets "
                             f"{n} consecutive GPUs of gpus.serve)")

    def with_env_overrides(self) -> CampaignConfig:
        """Copy with endpoints taken from the environment variables listed in the module docstring."""
        upd = self.model_copy(deep=True)
        for var, section, field in (("RAO_POLICY_BASE_URL", upd.serving, "base_url"),
                                    ("RAO_S3_ENDPOINT", upd.storage, "endpoint_url"),
                                    ("RAO_S3_BUCKET", upd.storage, "bucket"),
                                    ("MLFLOW_TRACKING_URI", upd.tracking, "tracking_uri")):
            if os.environ.get(var):
                setattr(section, field, os.environ[var])
        if os.environ.get("RAO_POLICY_BASE_URL"):  # one external server replaces any pool
            upd.serving.base_urls, upd.serving.replicas = [], 1
        return upd


def external_switch_problem(cfg: CampaignConfig) -> str | None:
    """Why the external policy server (``serving.base_url``) of a campaign that trains cannot follow training,
    or None when it can: weights reach it only as LoRA adapters (``POST /v1/load_lora_adapter``) of the
    weights it serves, or never (switch 'none'). Checked by :func:`load_config`, not by the model validator:
    an evaluation-only use of a campaign config (``RAO_POLICY_BASE_URL`` for the nightly evaluation) is fine;
    :func:`infra.serving_pool.plan_switch` refuses the first full-weight switch to an external server at run time."""
    s = cfg.serving
    if not s.external_urls or cfg.iterations == 0:
        return None
    key = "base_urls" if s.base_urls else "base_url"
    if s.switch in ("reload", "restart"):
        return (f"serving.{key} is set with serving.switch {s.switch!r}: new full weights cannot be sent to an "
                "external server, so rollouts would come from its initial policy; use switch 'lora' (the server "
                "started with --enable-lora, --max-lora-rank >= trainer.lora.r, VLLM_ALLOW_RUNTIME_LORA_UPDATING="
                "True, and able to read the adapter folders) or switch 'none' (fixed policy, not on-policy RL)")
    if s.switch == "lora" and cfg.warm_start.mode == "demos":
        return (f"serving.{key} with warm_start.mode 'demos': the external server does not serve the "
                "warm-started weights the adapters are trained on; warm-start first, serve that checkpoint and "
                "use warm_start.mode 'none'")
    return None


def _given(text: str, sets: dict[str, str]) -> str | None:
    """``--set KEY=VALUE`` when ``text`` (``FIELD = ...``, or a message that starts with the field) is about
    an overridden field, one inside it or one holding it; None when the value came from the file."""
    field = (re.match(r"[\w.]+", text) or [""])[0]
    return next((f"--set {given}" for key, given in sets.items()
                 if field == key or field.startswith(key + ".") or key.startswith(field + ".")), None)


def _origin(text: str, sets: dict[str, str], source: str) -> str:
    """Prefix of a check across fields: its --set (:func:`_given`), else the file ``with --set ...`` (the
    combination that failed may involve either)."""
    return _given(text, sets) or source + "".join(f" with --set {given}" for given in sets.values())


def _joined(parts: list[tuple[str, str]]) -> str:
    """``origin: part; part; other origin: part``: each run of parts from one origin under one prefix."""
    out: list[str] = []
    last = None
    for origin, text in parts:
        out.append(text if origin == last else f"{origin}: {text}")
        last = origin
    return "; ".join(out)


def _fmt_error(source: str, err: ValidationError, sets: dict[str, str] | None = None) -> str:
    sets = sets or {}
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        val = e.get("input")
        val_s = short_repr(val) if not isinstance(val, dict) else "{...}"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        if e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            if isinstance(val, dict):  # a check across fields names its own keys
                parts.append((_origin(msg, sets, source), msg))
                continue
        parts.append((_given(loc, sets) or source, f"{loc} = {val_s}: {msg}"))
    return _joined(parts)


def _deep_set(d: dict[str, Any], dotted: str, value: Any, given: str) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise ConfigError(f"--set {given}: {k} is not a section")
    d[keys[-1]] = value


def _override_items(overrides: dict[str, Any] | list[str]) -> list[tuple[str, Any, str]]:
    """(dotted key, value, ``KEY=VALUE`` as given) of each override; ``KEY=VALUE`` values are YAML scalars."""
    if isinstance(overrides, dict):
        return [(k, v, f"{k}={v if isinstance(v, (str, os.PathLike)) else json.dumps(v, default=str)}")
                for k, v in overrides.items()]
    items = []
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"--set {o}: expected KEY=VALUE")
        k, v = o.split("=", 1)
        try:
            items.append((k.strip(), yaml.safe_load(v), o))
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {o}: not a YAML value: {str(e).splitlines()[0]}") from None
    return items


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | list[str] | None = None,
                *, check_paths: bool = True, data: Any = None) -> CampaignConfig:
    """Load a YAML config (or defaults if ``path`` is None), apply overrides, validate.

    ``overrides``: ``{"algo.G": 8}`` or ``["algo.G=8", ...]`` (values parsed as YAML scalars).
    ``check_paths``: also check that the folders and files the config names exist
    (:meth:`CampaignConfig.check_paths`); False for a config prepared for another machine.
    ``data``: the content of ``path`` as the caller already read it (:func:`read_yaml`), possibly respelled
    (an older section name); validated instead of reading the file again, errors still naming ``path``.
    Raises ConfigError (one line: file, field path, value, expectation).
    """
    source = str(path) if path else "<defaults>"
    loaded: Any = copy.deepcopy(data) if data is not None else (read_yaml(path) if path else {})
    if not isinstance(loaded, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(loaded).__name__}")
    data = loaded
    sets: dict[str, str] = {}  # dotted key -> "KEY=VALUE" as given: errors about it name the --set
    for k, v, given in _override_items(overrides or []):
        _deep_set(data, k, v, given)
        sets[k] = given
    try:
        cfg = CampaignConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_fmt_error(source, e, sets)) from None
    problem = external_switch_problem(cfg)
    if problem:
        raise ConfigError(_joined([(_origin(problem, sets, source), problem)]))
    if check_paths and (problems := cfg.path_problems()):
        raise ConfigError(_joined([(_given(p, sets) or source, p) for p in problems]))
    return cfg
