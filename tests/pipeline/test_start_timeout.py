"""A vLLM start that times out says what the server was doing (its last start phase and log lines), and the serving
task is not retried into a second identical start: its line says why instead. Before: the error line was the log's
tail cut at 300 characters, which quoted a harmless weight-dtype warning as the cause while the server was still
compiling, and Prefect retried the task into another 15-minute start."""

from __future__ import annotations

import pytest

from infra.process import ServiceError, StartTimeout

FAKE_VLLM = """#!/bin/bash
echo "(APIServer pid=$$) WARNING 12-07 10:00:00 [model.py:1] Casting torch.bfloat16 to torch.float32 (weights dtype)"
echo "(EngineCore pid=$$) INFO 12-07 10:00:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x"
echo "(Worker pid=$$) INFO 12-07 10:00:02 [default_loader.py:1] Loading weights took 1.20 seconds"
echo "(Worker pid=$$) INFO 12-07 10:00:03 [backends.py:1] Dynamo bytecode transform time: 9.50 s"
exec sleep 600
"""


def test_a_start_that_times_out_says_it_was_still_compiling(tmp_path, tiny_model_path):
    from infra.serving import VLLMServer

    fake = tmp_path / "python"
    fake.write_text(FAKE_VLLM)
    fake.chmod(0o755)
    server = VLLMServer(tiny_model_path, python=fake, start_timeout_s=4, log_dir=tmp_path)
    with pytest.raises(StartTimeout) as e:
        server.start()
    msg = str(e.value)
    assert "\n" not in msg
    head, _, rest = msg.partition(" (the start time-out): ")
    assert head == f"vllm not healthy at {server.url}/health after 4 s"
    assert rest.startswith("still compiling (torch.compile) (reached at "), msg
    assert "its last log lines: INFO [core.py:133] Initializing a V1 LLM engine" in rest
    assert rest.index("compiling") < rest.index("Dynamo bytecode transform time") and "Casting" not in rest
    assert rest.endswith(f"; log {tmp_path}/vllm-{server.port}.log")
    assert not server.alive()


def test_a_switch_that_failed_on_a_start_time_out_is_not_retried_and_says_so(tmp_path, monkeypatch, prefect_harness):
    from prefect import flow

    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint
    from rao_core.config import load_config
    from tasks import serve

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    ctx = RunContext(config=load_config("configs/cpu-smoke.yaml", {"name": "timeout"}), s3={}, mlflow_uri="")
    calls: list[str] = []

    def failing(error):
        def serve_(*a, **k):
            calls.append(type(error).__name__)
            raise error
        return serve_

    @flow
    def switch() -> None:
        serve.serve_checkpoint(ctx, Checkpoint(name="iter-0", local=str(tmp_path)))

    monkeypatch.setattr(serve.POOL, "serve", failing(StartTimeout("vllm not healthy ... (the start time-out): still "
                                                                  "compiling (torch.compile) ...")))
    with pytest.raises(StartTimeout) as e:
        switch()
    assert calls == ["StartTimeout"]  # one start: no retry
    assert str(e.value).endswith("; not retried: a second start would wait as long again; free the CPU (other "
                                 "processes) or raise serving.start_timeout_s (900 s), then re-run to resume")
    calls.clear()
    monkeypatch.setattr(serve.POOL, "serve", failing(ServiceError("the server exited with status 1")))
    with pytest.raises(ServiceError):
        switch()
    assert calls == ["ServiceError", "ServiceError"]  # any other failure: retried once
