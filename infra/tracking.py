"""MLflow tracking: SQLite by default, an ``mlflow server`` when several processes log, or a remote URI.

- Embedded default: ``sqlite:///$RAO_HOME/mlflow/mlflow.db`` with artifacts in ``$RAO_HOME/mlflow/artifacts``
  (MLflow 3.x no longer supports the ``./mlruns`` file store).
- ``MLflowServer``: ``mlflow server`` on 127.0.0.1 over the same SQLite file, for many writers (one SQLite
  file written by many processes locks), behind MLflow's basic authentication (the installation's credential).
- Real mode: set ``MLFLOW_TRACKING_URI`` (e.g. a team server); it overrides the default.
- Experiments are tagged for the UI's model-training view (:func:`ensure_experiment`); execution trees
  become traces with one span per node and per turn (:func:`log_trees_as_traces`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.process import ManagedProcess, ServiceMixin, pick_ports, start_on_a_fresh_port
from rao_core.paths import rao_home
from rao_core.tree import ExecutionTree, Node, unscored


def mlflow_dir() -> Path:
    return rao_home() / "mlflow"


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the project's SQLite file."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    mlflow_dir().mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{mlflow_dir() / 'mlflow.db'}"


def configure_mlflow(tracking_uri: str | None = None) -> str:
    """Point the mlflow client at ``tracking_uri`` (or the default) and return it."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def artifact_root() -> str:
    """Default artifact location for experiments created by the project (a local folder)."""
    p = mlflow_dir() / "artifacts"
    p.mkdir(parents=True, exist_ok=True)
    return p.as_uri()


#: Experiment tag read by MLflow's UI (3.x before its workflow switch) to choose the experiment page:
#: ``custom_model_development`` opens the model-training view (runs, metrics, registry); without it the UI
#: infers ``genai_development_inferred`` from the traces. Values ending in ``_inferred`` are the UI's own guess.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: The query string of an MLflow UI link that opens the model-training view (runs, metrics, registry). MLflow 3.17's
#: UI chooses the view from a browser-wide switch ("GenAI apps & agents" / "Model training" in its sidebar,
#: stored in the browser as ``mlflow.workflowType``, GenAI by default) or this query parameter, and then
#: ignores the experiment's kind tag above (read from its JavaScript bundle: the kind comes from the switch
#: whenever the switch is shown); the tag is kept for MLflow versions and tools that read it.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_ui_command(uri: str) -> str:
    """The shell command that serves the MLflow UI (port 5000) on the tracking store ``uri``: the ``mlflow``
    executable beside this Python (the project's ``.venv/bin/mlflow``) as an absolute path, so the command works
    from any folder (a tutorial's own folder included), the path shell-quoted where it needs it."""
    import shlex

    return f"{shlex.quote(str(Path(sys.executable).parent / 'mlflow'))} ui --backend-store-uri {uri}"


def ensure_experiment(name: str) -> str:
    """Create the experiment if missing (artifacts under ``artifact_root()``); returns its id.

    The experiment is tagged for MLflow's model-training view (:data:`EXPERIMENT_KIND`); an existing one
    is tagged too unless a person chose a kind (a value the UI inferred is replaced)."""
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        uri = mlflow.get_tracking_uri()
        loc = artifact_root() if uri.startswith("sqlite") else None
        return mlflow.create_experiment(name, artifact_location=loc, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    kind = exp.tags.get(EXPERIMENT_KIND_TAG)
    if kind is None or kind.endswith("_inferred"):
        mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def log_trees_as_traces(run_id: str, experiment_id: str, trees: Sequence[ExecutionTree], limit: int = 64) -> int:
    """One MLflow trace per tree (the first ``limit``), linked to ``run_id``; returns the number logged.

    Spans: the trace's root span is the root node; each node's span (type AGENT) holds one span per turn
    (type LLM: inputs the cell the model wrote and outputs what the REPL printed, each a fenced markdown code
    block (:func:`_fenced`: MLflow renders span strings as markdown), the turn's token usage in
    ``mlflow.chat.tokenUsage``, which MLflow sums into the trace's tokens column) and its children's spans,
    so the spans nest like the execution tree. Status: a node span is ERROR only when the node ended by an
    infrastructure failure (:data:`rao_core.judge.stage.INFRA_END_REASONS`); the trace is ERROR only when
    its root did (the trees judging leaves unscored) or the rollout crashed (``tree.error``). A wrong
    answer, a step limit or a full context is OK, with its end reason and verifier value in the outputs.
    """
    import mlflow

    client = mlflow.MlflowClient()
    logged = list(trees)[:limit]
    for tree in logged:
        _log_tree(client, run_id, experiment_id, tree)
    mlflow.flush_trace_async_logging()
    return len(logged)


def _log_tree(client: Any, run_id: str, experiment_id: str, tree: ExecutionTree) -> None:
    root = tree.root
    root_span = client.start_trace(
        name=f"tree {tree.tree_id}", span_type="AGENT", inputs={"task_id": tree.task_id} | _node_inputs(root),
        attributes={"env": tree.env, "group_id": tree.group_id, "rollout_index": str(tree.rollout_index),
                    "policy": tree.policy},
        tags={"rao.tree_id": tree.tree_id, "rao.task_id": tree.task_id, "rao.end_reason": str(root.end_reason)},
        experiment_id=experiment_id, run_id=run_id, start_time_ns=_ns(root.timings.started_at))
    trace_id = root_span.trace_id
    span_of = {root.node_id: root_span.span_id}
    for node in tree.walk():  # pre-order: a parent's span exists before its children's
        if node.node_id != root.node_id:
            span_of[node.node_id] = client.start_span(
                name=f"node {node.node_id} (depth {node.depth})", trace_id=trace_id,
                parent_id=span_of[node.parent_id], span_type="AGENT", inputs=_node_inputs(node),
                start_time_ns=_ns(node.timings.started_at)).span_id
        _log_turns(client, trace_id, span_of[node.node_id], node)
    for node in reversed(list(tree.walk())):  # children end before their parent
        end = dict(outputs=_node_outputs(node), attributes=_node_attributes(node), status=_node_status(node),
                   end_time_ns=_ns(node.timings.started_at, node.timings.wall_s))
        if node.node_id == root.node_id:
            if tree.error:
                end["status"] = _error_status(f"rollout crashed: {tree.error}")
            client.end_trace(trace_id, **end)
        else:
            client.end_span(trace_id, span_of[node.node_id], **end)


def _log_turns(client: Any, trace_id: str, parent_id: str, node: Node) -> None:
    """One leaf span per turn, laid end to end from the node's start (queue + generation + execution)."""
    from mlflow.tracing.constant import SpanAttributeKey, TokenUsageKey

    t = node.timings.started_at
    for i, turn in enumerate(node.turns):
        dt = turn.queue_s + turn.generation_s + turn.execution_s
        usage = {TokenUsageKey.INPUT_TOKENS: len(turn.prompt_token_ids),
                 TokenUsageKey.OUTPUT_TOKENS: len(turn.completion_token_ids),
                 TokenUsageKey.TOTAL_TOKENS: len(turn.prompt_token_ids) + len(turn.completion_token_ids)}
        attrs = {"turn": i, "finish_reason": turn.finish_reason, "cell_status": turn.cell_status,
                 "queue_s": turn.queue_s, "generation_s": turn.generation_s, "execution_s": turn.execution_s,
                 SpanAttributeKey.CHAT_USAGE: usage}
        cell = _fenced(_short(turn.code), "python") if turn.code is not None else _short(turn.text)
        span = client.start_span(name=f"turn {i}", trace_id=trace_id, parent_id=parent_id, span_type="LLM",
                                 inputs={"code": cell}, attributes={k: v for k, v in attrs.items() if v is not None},
                                 start_time_ns=_ns(t))
        client.end_span(trace_id, span.span_id, outputs={"output": _fenced(_short(turn.observation), "text")},
                        end_time_ns=_ns(t, dt))
        if t:  # unknown start (0): every span takes MLflow's "now"
            t += dt


def _node_inputs(node: Node) -> dict[str, Any]:
    return {"goal": _short(node.goal)} | ({"goal_args": node.goal_args} if node.goal_args else {})


def _node_outputs(node: Node) -> dict[str, Any]:
    out = {"result": _short(node.result), "end_reason": str(node.end_reason), "verifier": node.verifier}
    return out | ({"error": _short(node.error)} if node.error else {})


def _node_attributes(node: Node) -> dict[str, Any]:
    attrs = {"node_id": node.node_id, "depth": node.depth, "end_reason": str(node.end_reason),
             "verifier": node.verifier, "success": node.success, "success_source": node.success_source,
             "reward": node.reward, "turns": len(node.turns), "children": len(node.children),
             "prompt_tokens": node.num_prompt_tokens, "completion_tokens": node.num_completion_tokens,
             "wall_s": node.timings.wall_s}
    return {k: v for k, v in attrs.items() if not unscored(v)}


def _node_status(node: Node) -> Any:
    """ERROR for an infrastructure failure (the server, the sandbox, the wall clock), else OK."""
    from rao_core.judge.stage import INFRA_END_REASONS

    if node.end_reason in INFRA_END_REASONS:
        return _error_status(f"{node.end_reason}: {node.error or 'no detail'}")
    return "OK"


def _error_status(description: str) -> Any:
    from mlflow.entities import SpanStatus, SpanStatusCode

    return SpanStatus(SpanStatusCode.ERROR, description=description[:1000])


def _ns(t: float, plus: float = 0.0) -> int | None:
    """UNIX seconds ``t`` (+ ``plus``) as nanoseconds; None (MLflow uses "now") when ``t`` is unknown (0)."""
    return int((t + plus) * 1e9) if t else None


def _fenced(text: str | None, lang: str) -> str | None:
    """``text`` as a fenced markdown code block (```` ```python ... ``` ````; None and "" unchanged). MLflow's
    trace view renders a span's string inputs and outputs as markdown, so a bare cell showed as one run-on
    paragraph with its ``# comments`` as headings; fenced, it shows as code, lines and indentation
    kept (the maintainers' advice, mlflow/mlflow#17863). The fence is longer than any run of backticks inside
    (CommonMark), so a cell containing ````` ``` ````` cannot close it early."""
    if not text:
        return text
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _short(x: Any, limit: int = 2000) -> Any:
    """``x`` unchanged when short, else cut to ``limit`` characters (a non-string: its JSON)."""
    s = x if isinstance(x, str) else json.dumps(x, default=str)
    return x if len(s) <= limit else s[:limit] + "..."


#: The user of the MLflow server's basic authentication (:class:`MLflowServer`); its password is the installation's
#: credential ``mlflow`` (``infra.credentials.service_secret``, also in ``$RAO_HOME/secrets/mlflow``).
MLFLOW_USER = "rao"


@dataclass
class MLflowServer(ServiceMixin):
    """``mlflow server`` bound to 127.0.0.1 (a free port outside the kernel's ephemeral range), backed by the
    project's SQLite file.

    With ``auth`` (the default) it runs MLflow's basic-auth app (``--app-name basic-auth``): every request but
    ``/health`` and the static files needs the user :data:`MLFLOW_USER` and the installation's ``mlflow``
    credential (HTTP 401 otherwise); the users live in ``$RAO_HOME/mlflow/basic_auth.db``, its settings in
    ``basic_auth.ini`` beside it (mode 0600), the admin user is made at the first start. Clients get them from
    :meth:`client_env` (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, which MLflow's client
    sends), recorded by ``rao services up`` in its owner-only state file."""

    port: int = 0
    backend_uri: str | None = None
    log_dir: Path | None = None
    process: ManagedProcess | None = None
    auth: bool = True

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def password(self) -> str:
        """The password of :data:`MLFLOW_USER` (the installation's ``mlflow`` credential)."""
        from infra.credentials import service_secret

        return service_secret("mlflow")

    def client_env(self) -> dict[str, str]:
        """The variables that point an MLflow client at this server: ``MLFLOW_TRACKING_URI`` and
        ``MLFLOW_REGISTRY_URI`` (a registry URI left in the environment, e.g. by ``mlflow.set_registry_uri``, would
        send the registry's calls elsewhere) and, with ``auth``, ``MLFLOW_TRACKING_USERNAME`` /
        ``MLFLOW_TRACKING_PASSWORD``."""
        env = {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_REGISTRY_URI": self.tracking_uri}
        if self.auth:
            env |= {"MLFLOW_TRACKING_USERNAME": MLFLOW_USER, "MLFLOW_TRACKING_PASSWORD": self.password}
        return env

    def _auth_env(self) -> dict[str, str]:
        """The server's environment for the basic-auth app: its settings file (written here, mode 0600), the
        admin user of the first start and the Flask session key (both derived from the installation's secret)."""
        from infra.credentials import service_secret, write_private

        ini = write_private(mlflow_dir() / "basic_auth.ini", "[mlflow]\ndefault_permission = READ\n"
                            f"database_uri = sqlite:///{mlflow_dir() / 'basic_auth.db'}\n"
                            f"admin_username = {MLFLOW_USER}\n"
                            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        return {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_USERNAME": MLFLOW_USER,
                "MLFLOW_AUTH_ADMIN_PASSWORD": self.password,
                "MLFLOW_FLASK_SERVER_SECRET_KEY": service_secret("mlflow-flask")}

    def start(self) -> "MLflowServer":
        """Start ``mlflow server`` and wait for its health check. A port picked here (``port`` 0) that was taken
        before the server bound it restarts it on a fresh one, at most ``infra.process.PORT_ATTEMPTS`` starts.
        Raises ServiceError naming the log (:class:`infra.process.PortInUseError` naming the port and what
        holds it when every start found its port taken)."""
        return start_on_a_fresh_port("MLflow server", self, self.port)

    def _start_once(self) -> "MLflowServer":
        self.port = self.port or pick_ports(1)[0]
        backend = self.backend_uri or f"sqlite:///{mlflow_dir() / 'mlflow.db'}"
        mlflow_dir().mkdir(parents=True, exist_ok=True)
        cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend-store-uri", backend,
               "--default-artifact-root", artifact_root(), "--workers", "1"]
        env = {"MLFLOW_DISABLE_TELEMETRY": "true"}
        if self.auth:
            cmd += ["--app-name", "basic-auth"]
            env |= self._auth_env()
        log_dir = Path(self.log_dir or rao_home() / "services")
        self.process = ManagedProcess("mlflow", cmd, log_dir / f"mlflow-{self.port}.log",
                                      health_url=f"{self.tracking_uri}/health", start_timeout_s=120,
                                      env=env, ports=(self.port,))
        self.process.start()
        return self


