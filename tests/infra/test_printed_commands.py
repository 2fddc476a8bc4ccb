"""The commands ``rao deploy`` prints work as printed against the installation's own Prefect server: the worker
command and Prefect's "to schedule a run" hint (``prefect deployment run ...``, which lacked the auth string and
failed with 401) both carry ``PREFECT_API_AUTH_STRING`` read from its owner-only file when pasted in a shell."""

from __future__ import annotations

import subprocess

API = "http://127.0.0.1:4242/api"


def _pasted(line: str, tmp_path) -> list[str]:
    """Run ``line`` as a user pastes it (``bash -c``), ``prefect`` being a stub that prints what it was given."""
    stub = tmp_path / "prefect"
    stub.write_text('#!/bin/bash\necho "$PREFECT_API_URL"\necho "$PREFECT_API_AUTH_STRING"\necho "$@"\n')
    stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no credential in the environment: the line brings it
    return subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_schedule_hint_and_the_worker_command_carry_the_auth_string(tmp_path, monkeypatch):
    import infra.orchestration as orch
    from rao_cli.prefect_hints import HintFilter

    secret = tmp_path / "prefect.secret"
    secret.write_text("user:s3cret")
    secret.chmod(0o600)
    monkeypatch.setattr(orch, "own_api", lambda url: url == API)
    monkeypatch.setattr(orch, "service_secret_file", lambda name: secret)
    monkeypatch.setattr(orch, "prefect_bin", lambda: str(tmp_path / "prefect"))

    hints = HintFilter(API, orch.prefect_bin(), orch.auth_prefix(API))
    (hint,) = [o for o in hints.feed("\t$ prefect deployment run 'rao-campaign/campaign'") if o.strip()]
    assert "s3cret" not in hint  # the file is named, its content is not printed
    assert _pasted(hint.split("$ ", 1)[1], tmp_path) == [API, "user:s3cret", "deployment run rao-campaign/campaign"]
    assert _pasted(orch.worker_command(API), tmp_path) == [API, "user:s3cret", "worker start --pool rao-pool"]

    other = "https://api.example.com/api"  # another API: no credential of this installation is sent to it
    assert orch.auth_prefix(other) == ""
    assert _pasted(HintFilter(other, orch.prefect_bin(), orch.auth_prefix(other)).feed(
        "$ prefect deployment run x")[0].split("$ ", 1)[1], tmp_path) == [other, "", "deployment run x"]
