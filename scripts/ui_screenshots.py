"""Screenshots of the README's workflows in the Prefect and MLflow UIs, taken with headless Chromium (docs tool).

    .venv/bin/python scripts/ui_screenshots.py [--out docs/img/ui] [--home DIR]

Sets everything up itself on the embedded defaults, in a fresh RAO_HOME (a temporary folder unless
``--home``; its ``models`` link to the repository's ``var/models``): ``rao services up --prefect-server``,
``rao deploy``, the worker command it prints, then saves into ``--out``:

1. ``campaign-form.png``: the ``campaign`` deployment's run form in the Prefect UI, filled in for a cheap
   campaign ``ui-demo`` (the tiny random model ``var/models/tiny-llama``, a warm start on 4 expert
   demonstrations, 1 RL iteration of 2 tasks x 2 trees); the script then presses the form's Submit;
2. ``campaign-run.png``: that flow run's page once the worker has run it to COMPLETED;
3. ``nightly-run.png``: a run of the ``nightly-evaluation`` deployment under the name ``nightly`` on
   ``ui-demo``'s ``candidate`` (fetched by its S3 URI), COMPLETED;
4. ``registry-compare.png``: MLflow's registry Compare view of ``rao-policy-ui-demo`` versions 1 and 2
   (iterations 0 and 1, each with its own evaluation run).

Everything it started is stopped at the end (also on Ctrl-C or an error). Not run by CI: about 10 minutes on
2 CPU cores (vLLM starts twice, once per flow run). Needs Debian's ``chromium`` (``apt-get install -y
chromium``); Chromium is driven through its DevTools protocol with ``websockets`` (already installed).

The tiny random model never solves a task, so no group would carry signal, iteration 1 would change no
weight and register no second version. As in ``tests/pipeline/test_campaign.py``, rollout 0 of each
training group is therefore the scripted TextCraft expert's: a ``sitecustomize`` hook that only this
script puts on the worker's ``PYTHONPATH`` (``RAO_UI_EXPERT_ROLLOUT=1``) wraps ``run_trees`` for calls
with groups (G >= 2); evaluations and the warm start are untouched, so every score is the model's own.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.process import ManagedProcess, free_port, kill_group  # noqa: E402
from rao_core.paths import models_dir  # noqa: E402

RAO = [sys.executable, "-m", "rao_cli.main"]
CAMPAIGN = "ui-demo"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-port=0"]
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

#: The campaign form's values: configs/cpu-smoke.yaml shrunk to the tiny model.
CAMPAIGN_PARAMS = {
    "config": "configs/cpu-smoke.yaml", "name": CAMPAIGN, "iterations": 1, "tasks_per_iteration": 2, "G": 2,
    "model_path": str(models_dir() / "tiny-llama"),
    "overrides": ["tasks.pool_size=4", "warm_start.n_tasks=4", "eval.n_tasks=2", "trainer.lr=1e-3",
                  "serving.kv_cache_gib=1", "runtime.tree_timeout_s=900", "tracking.max_traces_per_iteration=8"],
}
NIGHTLY_PARAMS = {"config": "configs/cpu-smoke.yaml", "model": "candidate", "campaign": CAMPAIGN, "name": "nightly",
                  "suite": [{"env": "textcraft-synth", "difficulties": ["tier1"], "n_tasks": 2,
                             "modes": ["recursive"]}]}

EXPERT_HOOK = '''"""Loaded by scripts/ui_screenshots.py only: rollout 0 of each training group is the scripted expert's."""
import os
import sys

if os.environ.get("RAO_UI_EXPERT_ROLLOUT") == "1":
    import importlib.abc
    import importlib.machinery

    def _patch(rt):
        real = rt.run_trees

        async def run_trees(env, tasks_with_rollouts, policy, config, *, tokenizer, progress=None):
            items = list(tasks_with_rollouts)
            if all(n < 2 for _, n in items):  # evaluation: the model alone
                return await real(env, items, policy, config, tokenizer=tokenizer, progress=progress)
            from rao_core.policies.textcraft_expert import TextCraftExpert

            expert = await real(env, [(t, 1) for t, _ in items], TextCraftExpert(seed=0), config, tokenizer=tokenizer)
            model = await real(env, [(t, n - 1) for t, n in items], policy, config, tokenizer=tokenizer,
                               progress=progress)
            out = []
            for t, _ in items:
                group = [x for x in expert + model if x.task_id == t.task_id]
                for g, tree in enumerate(group):
                    tree.rollout_index = g
                out += group
            return out

        rt.run_trees = run_trees

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "rao_core.runtime":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
'''


#: MLflow 3 opens an "MLflow Assistant" side panel: press the Close button beside its Settings button.
CLOSE_ASSISTANT = """(() => {
  for (let p = document.querySelector('button[aria-label="Settings"]'); p; p = p.parentElement) {
    const close = p.querySelector('button[aria-label="Close"]');
    if (close) { close.click(); return true; }
  }
  return false;
})()"""


class Browser:
    """Headless Chromium driven over its DevTools protocol (one page)."""

    def __init__(self, profile: Path, width: int = 1440, height: int = 900):
        from websockets.sync.client import connect

        self.width, self.height = width, height
        self.proc = subprocess.Popen(["/usr/bin/chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=open(profile.parent / "chromium.log", "w"),
                                     start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"chromium did not start; log {profile.parent / 'chromium.log'}")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        page = next(p for p in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if p["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None)
        self.ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params):
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def goto(self, url: str, ready: str, timeout_s: float = 300) -> None:
        """Open ``url`` and wait until the JavaScript expression ``ready`` is true."""
        self.call("Page.navigate", url=url)
        self.wait(ready, timeout_s)

    def wait(self, condition: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.js(f"Boolean({condition})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{condition} not true after {timeout_s:.0f} s at {self.js('location.href')}")
            time.sleep(0.5)

    def text_present(self, text: str) -> str:
        return f"document.body && document.body.innerText.includes({json.dumps(text)})"

    def screenshot(self, path: Path, full_page: bool = True, settle_s: float = 2.0, height: int | None = None) -> None:
        """Save a PNG of the page: ``height`` pixels tall, else the whole page (``full_page``) or the window."""
        time.sleep(settle_s)  # charts and fonts finish drawing
        h = height or self.height
        if full_page and not height:  # the tallest scrolling element (the apps scroll inside a container, not the body)
            h = max(h, min(4000, int(self.js(
                "Math.max(document.documentElement.scrollHeight, ...Array.from(document.querySelectorAll('*'))"
                ".filter(e => e.scrollHeight > e.clientHeight + 10 && getComputedStyle(e).overflowY != 'visible')"
                ".map(e => e.scrollHeight + e.getBoundingClientRect().top))"))))
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=h, deviceScaleFactor=1, mobile=False)
        time.sleep(0.5)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)
        path.write_bytes(base64.b64decode(data))
        print(f"saved {path} ({self.width}x{h})", flush=True)

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            kill_group(self.proc.pid, timeout_s=5)


def api(method: str, url: str, **kw):
    """One Prefect API call, retried for up to 10 minutes: a busy machine makes the server slow, not wrong."""
    deadline = time.monotonic() + 600
    while True:
        try:
            r = httpx.request(method, url, timeout=60, **kw)
            r.raise_for_status()
            return r.json()
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(5)


def submitted_run(api_url: str, deployment_id: str, name: str, timeout_s: float = 120) -> str:
    """The id of the deployment's flow run whose form named the campaign ``name``."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = api("POST", f"{api_url}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}})
        found = [r["id"] for r in runs if (r["parameters"].get("params") or {}).get("name") == name]
        if found or time.monotonic() > deadline:
            return found[0]
        time.sleep(2)


def completed(run: dict, what: str, worker_log: Path) -> bool:
    """True when flow run ``run`` ended COMPLETED; otherwise print one ``error:`` line naming ``what``, its
    final state and message, and the worker's log."""
    if run["state"]["type"] == "COMPLETED":
        return True
    print(f"error: {what} ended {run['state']['type']}: {run['state'].get('message')}; worker log {worker_log}",
          file=sys.stderr)
    return False


def wait_flow_run(api_url: str, run_id: str, timeout_s: float) -> dict:
    """Poll a flow run until it reaches a final state (printing state changes); returns it."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        run = api("GET", f"{api_url}/flow_runs/{run_id}")
        if run["state"]["type"] != last:
            last = run["state"]["type"]
            print(f"  flow run {run['name']}: {last}", flush=True)
        if last in FINAL or time.monotonic() > deadline:
            return run
        time.sleep(3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs/img/ui", help="where the PNGs go")
    ap.add_argument("--home", type=Path, help="RAO_HOME to use (default: a new temporary folder, removed after "
                    "a success)")
    ap.add_argument("--form-only", action="store_true", help="only the form screenshot; submit nothing (~1 min)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what was started on SIGTERM too
    if not Path("/usr/bin/chromium").exists():
        print("error: /usr/bin/chromium missing: apt-get install -y chromium", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rao-ui-"))
    home = (args.home or tmp / "home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "models").exists():
        (home / "models").symlink_to(models_dir())
    hook = tmp / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(EXPERT_HOOK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAO_S3", "MLFLOW_TRACKING"))}
    env.update(RAO_HOME=str(home), PREFECT_WORKER_QUERY_SECONDS="3", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               MLFLOW_DISABLE_TELEMETRY="true")
    worker = browser = mlflow_ui = None
    ok = False
    t0 = time.monotonic()
    try:
        up = subprocess.run(RAO + ["services", "up", "--prefect-server"], env=env, capture_output=True, text=True,
                            cwd=ROOT)
        print(up.stdout, up.stderr, flush=True)
        if up.returncode:
            return 1
        api_url = re.search(r"PREFECT_API_URL:\s+(\S+)", up.stdout).group(1)
        ui = api_url.removesuffix("/api")
        worker_cmd = shlex.split(re.search(r"worker:\s+(.*)", up.stdout).group(1))
        dep = subprocess.run(RAO + ["deploy"], env=env, capture_output=True, text=True, cwd=ROOT)
        print(dep.stdout[-1500:], dep.stderr[-1500:], flush=True)
        if dep.returncode:
            return 1
        worker_env = {**env, **dict(a.split("=", 1) for a in worker_cmd if re.match(r"^[A-Z_]+=", a)),
                      "RAO_UI_EXPERT_ROLLOUT": "1",
                      "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))}
        worker = subprocess.Popen([a for a in worker_cmd if not re.match(r"^[A-Z_]+=", a)], env=worker_env,
                                  cwd=tmp, stdout=open(tmp / "worker.log", "w"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        deps = {d["name"]: d["id"] for d in api("POST", f"{api_url}/deployments/filter", json={})}
        (tmp / "chromium").mkdir()
        browser = Browser(tmp / "chromium" / "profile")

        # 1. The campaign form, filled in (the UI reads the values from its `parameters` query), submitted.
        form = f"{ui}/deployments/deployment/{deps['campaign']}/run?parameters=" + quote(
            quote(json.dumps({"params": CAMPAIGN_PARAMS}), safe=""), safe="")
        browser.goto(form, f"{browser.text_present('Submit')} && Array.from(document.querySelectorAll('input, textarea'))"
                     f".some(e => e.value == '{CAMPAIGN}')")
        browser.screenshot(args.out / "campaign-form.png")
        if args.form_only:
            ok = True
            return 0
        browser.js("Array.from(document.querySelectorAll('button')).find(b => b.innerText.trim() == 'Submit').click()")
        browser.wait("!location.pathname.endsWith('/run')")  # the UI goes back to the deployment's page
        run_id = submitted_run(api_url, deps["campaign"], CAMPAIGN)
        print(f"campaign submitted from the form: flow run {run_id}", flush=True)
        run = wait_flow_run(api_url, run_id, 3600)
        if not completed(run, "the campaign", tmp / "worker.log"):
            return 1

        # 2. Its run page.
        browser.goto(f"{ui}/runs/flow-run/{run_id}", browser.text_present("Completed"))
        browser.screenshot(args.out / "campaign-run.png", settle_s=5)

        # 3. The nightly evaluation of ui-demo's candidate, under the name `nightly`.
        r = api("POST", f"{api_url}/deployments/{deps['nightly-evaluation']}/create_flow_run",
                json={"parameters": {"params": NIGHTLY_PARAMS}})
        nightly = wait_flow_run(api_url, r["id"], 3600)
        if not completed(nightly, "the nightly evaluation", tmp / "worker.log"):
            return 1
        browser.goto(f"{ui}/runs/flow-run/{nightly['id']}", browser.text_present("Completed"))
        browser.screenshot(args.out / "nightly-run.png", settle_s=5)

        # 4. MLflow's registry Compare view of the campaign's versions (each linked to its own run).
        db = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
        import mlflow

        model = f"rao-policy-{CAMPAIGN}"
        versions = sorted(mlflow.MlflowClient(db).search_model_versions(f"name = '{model}'"),
                          key=lambda v: int(v.version))
        print(f"{model}: versions {[v.version for v in versions]}", flush=True)
        port = free_port()
        mlflow_ui = ManagedProcess("mlflow-ui", [str(Path(sys.executable).parent / "mlflow"), "server", "--host",
                                                 "127.0.0.1", "--port", str(port), "--backend-store-uri", db,
                                                 "--workers", "1"],
                                   tmp / "mlflow-ui.log", health_url=f"http://127.0.0.1:{port}/health",
                                   env={"MLFLOW_DISABLE_TELEMETRY": "true"}, start_timeout_s=120).start()
        runs = {v.version: v.run_id for v in versions[-2:]}
        url = (f"http://127.0.0.1:{port}/#/compare-model-versions?name={quote(json.dumps(model))}"
               f"&runs={quote(json.dumps(runs))}")
        browser.goto(url, f"{browser.text_present('Comparing')} && {browser.text_present('eval/')}", 300)
        browser.js(CLOSE_ASSISTANT)
        browser.screenshot(args.out / "registry-compare.png", settle_s=8, height=1520)  # its tables scroll inside
        print(f"done in {time.monotonic() - t0:.0f} s; screenshots in {args.out}")
        ok = True
        return 0
    finally:
        if browser and not ok:  # what the page showed when it went wrong
            try:
                browser.screenshot(tmp / "failure.png", settle_s=0)
            except Exception:
                pass
        for stop in (lambda: browser and browser.close(),
                     lambda: worker and (kill_group(worker.pid), worker.wait(timeout=30)),
                     lambda: mlflow_ui and mlflow_ui.stop(),
                     lambda: subprocess.run(RAO + ["services", "down"], env=env, capture_output=True, cwd=ROOT)):
            try:
                stop()
            except Exception as e:  # keep stopping the others
                print(f"warning: while stopping: {e}", file=sys.stderr)
        if ok and args.home is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs (worker, chromium, MLflow UI): {tmp}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
