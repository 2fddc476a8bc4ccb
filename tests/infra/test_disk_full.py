"""A full disk is named (``infra/disk.py``): one ``error:`` line with the path, its free space
and the stage the campaign resumes at, for each shape the fault takes (an ENOSPC ``OSError``, a ``shutil.Error``
list holding one, the embedded S3 server's "InternalError"); and the MLflow runs end FAILED although the disk is
full (the reserve under ``$RAO_HOME``), checked on a real full tmpfs where this machine lets the test mount one.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.disk import (RESERVE_BYTES, RESERVE_NAME, DiskFullError, as_disk_full, disk_full_message, full_disk,
                        keep_reserve, release_reserve)
from infra.stage_records import GenerateOutput, StageRecord

SEAWEED_LOG = ("E1203 10:02:11 volume_write.go:118] failed to write to volume 7: write "
               "/rao/services/seaweedfs/volume/rao_7.dat: no space left on device\n")


def _copy_error(dst: Path) -> shutil.Error:
    """What ``shutil.copytree`` raised on the 600 MB tmpfs: a list of five (src, dst, why) tuples."""
    rows = [(f"/src/model-0000{i}.safetensors", str(dst / f"model-0000{i}.safetensors"),
             f"[Errno 28] No space left on device: '{dst / f'model-0000{i}.safetensors'}'") for i in range(4)]
    rows.append(("/src/tokenizer.json", str(dst / "tokenizer.json"), "[Errno 28] No space left on device"))
    return shutil.Error(rows)


def _internal_error():
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": "InternalError", "Message": "We encountered an internal error, please "
                                  "try again."}}, "UploadPart")


def _upload_failed():
    from boto3.exceptions import S3UploadFailedError

    return S3UploadFailedError("Failed to upload /rao/campaigns/x/checkpoints/iter-2/model.safetensors to "
                               "rao/x/iter-2/checkpoint/model.safetensors: An error occurred (InternalError) when "
                               "calling the UploadPart operation (reached max retries: 4): We encountered an "
                               "internal error, please try again.")


def _seaweed_home(tmp_path: Path, log: str) -> Path:
    home = tmp_path / "home"
    (home / "services" / "seaweedfs").mkdir(parents=True)
    (home / "services" / "seaweedfs-8333.log").write_text("I1203 started\n" + log)
    return home


def test_a_full_disk_is_found_in_each_shape_it_takes(tmp_path):
    home = tmp_path / "home"
    f = "/data/rao/campaigns/x/checkpoints/iter-2/model.safetensors"
    assert full_disk(OSError(errno.ENOSPC, "No space left on device", f), home) == Path(f)
    assert full_disk(OSError(errno.ENOSPC, "No space left on device"), home) == home  # a write names no file
    dst = tmp_path / "checkpoints" / "iter-2"
    assert full_disk(_copy_error(dst), home) == dst / "model-00000.safetensors"
    try:  # raised while handling one, or from one
        try:
            raise OSError(errno.ENOSPC, "No space left on device", f)
        except OSError as e:
            raise RuntimeError("checkpoint save failed") from e
    except RuntimeError as e:
        assert full_disk(e, home) == Path(f)
    for other in (OSError(errno.ENOENT, "No such file", f), ValueError("x"), shutil.Error([("a", "b", "[Errno 13]")])):
        assert full_disk(other, home) is None


def test_an_s3_internal_error_is_a_full_disk_only_when_the_embedded_server_says_so(tmp_path, monkeypatch):
    full = _seaweed_home(tmp_path / "a", SEAWEED_LOG)
    assert full_disk(_internal_error(), full) == full / "services" / "seaweedfs"
    assert full_disk(_upload_failed(), full) == full / "services" / "seaweedfs"
    fine = _seaweed_home(tmp_path / "b", "I1203 wrote needle 7,01\n")
    assert full_disk(_internal_error(), fine) is None  # a disk with room, a log without it: another fault
    assert full_disk(_internal_error(), tmp_path / "no-embedded-s3") is None
    import infra.disk as disk

    monkeypatch.setattr(disk, "free_bytes", lambda path: (10 << 20, 1 << 30))  # under LOW_FREE_BYTES
    assert full_disk(_upload_failed(), fine) == fine / "services" / "seaweedfs"


def test_under_one_percent_free_the_embedded_s3_store_counts_as_full(tmp_path, monkeypatch):
    """SeaweedFS makes every volume read-only under 1% of its disk free (seen: 1.1 GB free of 252 GB, every
    PutObject an InternalError): that is a full disk for the S3 store, named with the floor, not 'another fault'."""
    import infra.disk as disk

    home = _seaweed_home(tmp_path, "I1203 wrote needle 7,01\n")  # the log says nothing of space
    total = 252 * 10**9
    assert disk.seaweedfs_floor_bytes(total) == 2_520_000_000 + (64 << 20)
    monkeypatch.setattr(disk, "free_bytes", lambda path: (int(1.1e9), total))
    assert full_disk(_internal_error(), home) == home / "services" / "seaweedfs"
    low = disk.seaweedfs_low_disk(home / "services" / "seaweedfs")
    assert low.startswith(f"the disk holding the embedded S3 store {home / 'services' / 'seaweedfs'} has 1.1 GB of "
                          "252 GB free, under the 2.6 GB SeaweedFS needs")
    line = disk_full_message(home / "services" / "seaweedfs")
    assert "(1.1 GB of 252 GB free, under the 2.6 GB the embedded S3 store needs); free space (" in line
    monkeypatch.setattr(disk, "free_bytes", lambda path: (int(2.7e9), total))  # just over the floor
    assert disk.seaweedfs_low_disk(home) is None and full_disk(_internal_error(), home) is None
    assert "needs" not in disk_full_message(home)


def test_the_line_names_the_folder_its_free_space_and_the_stage_to_resume_at(tmp_path):
    line = str(as_disk_full(_copy_error(tmp_path), resume="iteration 2 train", home=tmp_path))
    assert line.startswith(f"no space left on device under {tmp_path} (")  # the folder, not the file
    assert " free); free space (" in line and "rao campaigns rm NAME" in line
    assert line.endswith("re-run: the campaign resumes at the iteration 2 train stage")
    assert "\n" not in line and len(line) < 400 and "[Errno" not in line
    e = as_disk_full(OSError(errno.ENOSPC, "No space left on device"), home=tmp_path)
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and str(e).endswith("resumes where it stopped")
    assert as_disk_full(e) is e and as_disk_full(KeyError("x"), home=tmp_path) is None
    assert disk_full_message(tmp_path / "gone.bin").startswith(f"no space left on device under {tmp_path} (")


class _Out(StageRecord):
    pass


class _Store:
    def __init__(self):
        self.written: list[str] = []

    def exists(self, key: str) -> bool:
        return False

    def put_bytes(self, data: bytes, key: str) -> dict:
        self.written.append(key)
        return {}


def test_a_stage_that_fills_the_disk_fails_with_one_line_naming_it_and_writes_no_marker(tmp_path, monkeypatch):
    from infra.stage_io import stage

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    store = _Store()
    ctx = SimpleNamespace(store=lambda: store)

    @stage("train")
    def train(ctx, iteration: int) -> _Out:
        raise _copy_error(tmp_path / "checkpoints" / f"iter-{iteration}")

    @stage("warm_start")
    def warm(ctx, iteration: str = "iter-0") -> _Out:
        raise OSError(errno.ENOSPC, "No space left on device")

    @stage("judge")
    def judge(ctx, iteration: int) -> _Out:
        raise ValueError("not a disk")

    with pytest.raises(DiskFullError) as e:
        train.fn(ctx, 2)
    assert str(e.value).endswith("the campaign resumes at the iteration 2 train stage")
    assert isinstance(e.value.__cause__, shutil.Error) and store.written == []  # no marker: the re-run redoes it
    with pytest.raises(DiskFullError, match="resumes at the warm start stage"):
        warm.fn(ctx)
    with pytest.raises(ValueError, match="not a disk"):  # any other error is raised as it was
        judge.fn(ctx, 1)


@pytest.fixture
def in_process_run(tmp_path, monkeypatch):
    """``rao run`` in this process: its environment defaults and SIGTERM handler restored afterwards."""
    import os
    import signal

    saved_env, saved_term = dict(os.environ), signal.getsignal(signal.SIGTERM)
    monkeypatch.delenv("RAO_DEBUG", raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    signal.signal(signal.SIGTERM, saved_term)


@pytest.mark.parametrize("make", [lambda tmp: _copy_error(tmp / "ckpt"), lambda tmp: _upload_failed()],
                         ids=["copy", "s3-upload"])
def test_rao_run_prints_one_line_for_a_full_disk(capsys, monkeypatch, tmp_path, in_process_run, make):
    """The two raw lines a full disk used to give (a 1,590-character list of tuples;
    ``S3UploadFailedError ... (unexpected; ...)``), raised out of the campaign where no stage named them, are
    now the disk line."""
    import flows.campaign
    import rao_cli.pipeline_cmd as pipeline_cmd
    from rao_cli.main import main

    monkeypatch.setenv("RAO_HOME", str(_seaweed_home(tmp_path, SEAWEED_LOG)))
    ckpt = tmp_path / "start"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")

    def full(params):
        raise make(tmp_path)

    monkeypatch.setattr(pipeline_cmd, "completed_campaign", lambda cfg: None)
    monkeypatch.setattr(flows.campaign, "rao_campaign", full)
    with pytest.raises(SystemExit) as e:
        main(["run", "--set", "warm_start.mode=checkpoint", "--set", f"warm_start.checkpoint={ckpt}"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("error: no space left on device under ") and "unexpected" not in err[0]
    assert err[0].endswith("re-run: the campaign resumes where it stopped") and len(err[0]) < 400


def test_the_reserve_is_kept_and_released_only_on_a_full_disk(tmp_path, monkeypatch):
    import infra.disk as disk
    from flows.campaign import FLOW_END_HOOKS, ITERATION_END_HOOKS, release_disk_reserve

    reserve = tmp_path / RESERVE_NAME
    assert keep_reserve(tmp_path) and reserve.stat().st_size == RESERVE_BYTES
    assert keep_reserve(tmp_path)  # kept, not written again
    assert not release_reserve(tmp_path) and reserve.exists()  # room on the disk: kept
    monkeypatch.setattr(disk, "free_bytes", lambda path: (4096, 1 << 30))
    assert not keep_reserve(tmp_path / "other")  # no room to make one
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    release_disk_reserve(None, None, None)
    assert not reserve.exists()
    for hooks in (FLOW_END_HOOKS, ITERATION_END_HOOKS):  # freed before the MLflow runs are closed
        assert all(hooks[k][0] is release_disk_reserve for k in ("on_failure", "on_crashed"))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 96 MiB tmpfs the test mounts (root only; skipped where mounting is refused), unmounted after."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: Path) -> OSError:
    """Write ``path`` until the disk is full; returns the ENOSPC error."""
    try:
        with open(path, "wb") as f:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
    except OSError as e:
        return e
    raise AssertionError("the disk never filled")


@pytest.mark.timeout(300)
def test_on_a_full_tmpfs_the_runs_are_closed_failed_thanks_to_the_reserve(small_tmpfs, monkeypatch):
    """RAO_HOME and MLflow's SQLite file on a 96 MiB tmpfs that fills up: without the reserve MLflow cannot
    mark a run FAILED ("database or disk is full", why such runs stay RUNNING); with it released by the
    failure hook, it can. The error names the tmpfs."""
    import mlflow

    from flows.campaign import release_disk_reserve
    from infra.tracking import configure_mlflow, ensure_experiment

    home = small_tmpfs / "rao"
    monkeypatch.setenv("RAO_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    configure_mlflow()
    client = mlflow.MlflowClient()
    exp = ensure_experiment("full")
    first, second = (client.create_run(exp).info.run_id for _ in range(2))
    assert keep_reserve(home)
    (home / "campaigns").mkdir()
    err = _fill(home / "campaigns" / "iter-1.bin")
    assert err.errno == errno.ENOSPC and shutil.disk_usage(small_tmpfs).free < RESERVE_BYTES
    line = str(as_disk_full(err, resume="iteration 1 train", home=home))
    assert line.startswith(f"no space left on device under {home} (") and " MB free)" in line
    with pytest.raises(Exception, match="disk is full"):  # no reserve: the run cannot be closed
        client.set_terminated(first, status="FAILED")
    release_disk_reserve(None, None, None)  # the failure hook
    client.set_terminated(second, status="FAILED")
    assert client.get_run(second).info.status == "FAILED" and not (home / RESERVE_NAME).exists()


@pytest.mark.services
@pytest.mark.timeout(600)
def test_a_campaign_whose_stage_fills_the_disk_fails_on_one_line_and_closes_its_runs_failed(
        small_tmpfs, tiny, s3_server, prefect_harness, monkeypatch):
    """The real flow on a full tmpfs: the generate stage fills ``$RAO_HOME`` and fails with ENOSPC; the campaign
    raises the disk line naming the stage to resume at, writes no marker for it, and both MLflow runs (SQLite on
    the same full tmpfs) end FAILED, not RUNNING."""
    import mlflow

    import flows.campaign as fc
    from infra.stage_io import done_key, stage
    from infra.stage_records import Checkpoint, ServedEndpoint, WarmStartOutput

    home = small_tmpfs / "rao"
    monkeypatch.setenv("RAO_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    for k, v in s3_server.settings().env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(fc, "warm_start", lambda ctx: WarmStartOutput(checkpoint=Checkpoint(name="base",
                                                                                            local=str(tiny)),
                                                                      mode="none"))
    monkeypatch.setattr(fc, "serve_checkpoint", lambda ctx, ckpt: ServedEndpoint())

    @stage("generate", name="generate-trees")
    def fills_the_disk(ctx, iteration: int, served, tokenizer: str) -> GenerateOutput:
        raise _fill(ctx.local(f"iter-{iteration}/trees.partial.jsonl"))

    monkeypatch.setattr(fc, "generate_trees", fills_the_disk)
    params = fc.CampaignParams(config="configs/cpu-smoke.yaml", name="full", iterations=1, model_path=str(tiny),
                               overrides=["warm_start.mode=none", "eval.enabled=false"])
    with pytest.raises(DiskFullError) as e:
        fc.rao_campaign(params)
    assert str(e.value).startswith(f"no space left on device under {home}")
    assert str(e.value).endswith("the campaign resumes at the iteration 1 generate stage")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string="tags.`rao.campaign` = 'full'")
    assert sorted((r.data.tags["rao.kind"], r.info.status) for r in runs) == [("campaign", "FAILED"),
                                                                              ("iteration", "FAILED")]
    from infra.storage import ArtifactStore

    assert not ArtifactStore(s3_server.settings(), "full").exists(done_key(1, "generate"))
