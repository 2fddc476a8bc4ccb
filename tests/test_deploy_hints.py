"""``rao deploy`` prints one worker command, the right one: Prefect's own hints
(``prefect worker start --pool 'rao-pool'``, without ``PREFECT_API_URL``: pasted elsewhere it starts a worker
on another API) are dropped, its other ``$ prefect ...`` hints get the API URL (``rao_cli.prefect_hints``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rao_cli.main import main

API = "http://127.0.0.1:4242/api"

# what `prefect work-pool create` and `prefect deploy` print, piped (prefect/cli/work_pool.py,
# prefect/cli/deploy/_core.py of the pinned Prefect)
PREFECT_OUTPUT = """Updated work pool 'rao-pool'!

To start a worker for this work pool, run:

\tprefect worker start --pool rao-pool

└── UUID: 0f6a
└── Type: process
Deploying all flows with an existing deployment configuration...
Deployment 'rao-campaign/campaign' successfully created with id '1234'.

To execute flow runs from these deployments, start a worker in a separate terminal that pulls work from the 'rao-pool' work pool:

\t$ prefect worker start --pool 'rao-pool'

To schedule a run for this deployment, use the following command:

\t$ prefect deployment run 'rao-campaign/campaign'

"""


def test_prefect_still_prints_the_hints_that_are_filtered():
    """The filter matches Prefect's wording: a Prefect upgrade that changes it fails here, not in a browser."""
    import prefect

    root = Path(prefect.__file__).parent / "cli"
    pool = (root / "work_pool.py").read_text()
    deploy = (root / "deploy" / "_core.py").read_text()
    assert "To start a worker for this work pool, run:" in pool and "prefect worker start --pool" in pool
    assert "start a worker in a" in deploy and "$ prefect worker start --pool" in deploy
    assert "$ prefect deployment run" in deploy


# the same sentence as rich wraps it in 80 columns (piped output, no COLUMNS)
WRAPPED = PREFECT_OUTPUT.replace("start a worker in a separate terminal", "start a worker in a separate \nterminal")


@pytest.mark.parametrize("text", [PREFECT_OUTPUT, WRAPPED], ids=["wide", "wrapped"])
def test_the_filter_drops_the_worker_hints_and_completes_the_other_commands(text):
    from rao_cli.prefect_hints import HintFilter

    hints = HintFilter(API, "/x/.venv/bin/prefect")
    out = [o for line in text.splitlines() for o in hints.feed(line)] + hints.close()
    assert not [ln for ln in out if "work pool:" in ln or "separate" in ln], out
    assert not [ln for ln in out if "worker" in ln], out
    assert "\t$ PREFECT_API_URL=http://127.0.0.1:4242/api /x/.venv/bin/prefect deployment run 'rao-campaign/campaign'" \
        in out
    assert "Deployment 'rao-campaign/campaign' successfully created with id '1234'." in out
    assert all(a.strip() or b.strip() for a, b in zip(out, out[1:])), out  # no two blank lines in a row


@pytest.fixture
def deploy_env(tmp_path, monkeypatch):
    saved_env, saved_term = dict(os.environ), signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREFECT_API_URL", API)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    signal.signal(signal.SIGTERM, saved_term)


def test_rao_deploy_prints_one_worker_command_with_the_api_url(capfd, monkeypatch, deploy_env):
    """The children of ``rao deploy`` (here one that prints what Prefect prints) write to file descriptor 1:
    what reaches stdout has one worker command, the last line, with PREFECT_API_URL (checked against a real
    Prefect server by tests/infra/test_deploy.py, which pastes that line)."""
    import infra.orchestration

    seen_columns = []

    def fake_deploy(pool):
        seen_columns.append(os.environ.get("COLUMNS"))
        return subprocess.run([sys.executable, "-c", f"import sys; sys.stdout.write({PREFECT_OUTPUT!r})"],
                              env=dict(os.environ)).returncode

    columns = os.environ.get("COLUMNS")
    monkeypatch.setattr(infra.orchestration, "check_api", lambda url: url)
    monkeypatch.setattr(infra.orchestration, "deploy", fake_deploy)
    with pytest.raises(SystemExit) as e:
        main(["deploy"])
    out = capfd.readouterr().out
    assert e.value.code == 0, out
    workers = [ln for ln in out.splitlines() if "worker start" in ln]
    prefect = str(Path(sys.executable).parent / "prefect")
    assert workers == [f"deployments created; start a worker: PREFECT_API_URL={API} {prefect} worker start --pool "
                       "rao-pool"], out
    assert out.strip().splitlines()[-1] == workers[0]
    assert f"$ PREFECT_API_URL={API} {prefect} deployment run 'rao-campaign/campaign'" in out
    assert "successfully created" in out and seen_columns == [columns] and os.environ.get("COLUMNS") == columns


def test_a_sentence_without_its_command_is_printed_after_all():
    """Held lines that no worker command follows are not lost."""
    from rao_cli.prefect_hints import HintFilter

    hints = HintFilter(API, "prefect")
    text = ["Use this to start a worker later:", "one", "two", "three", "four", "five", "end"]
    out = [o for line in text for o in hints.feed(line)] + hints.close()
    assert out == text[1:]
