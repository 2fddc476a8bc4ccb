"""``rao campaigns list`` / ``rao campaigns rm NAME`` on a real S3 server (SeaweedFS) and an
MLflow registry (SQLite): sizes local and on S3, and a registered champion never deleted without ``--force``;
``rao campaigns fetch NAME`` brings checkpoints back to the folders the records name, checked against S3."""

from __future__ import annotations

import uuid

import pytest

from tests.cli import run_cli

pytestmark = pytest.mark.services


@pytest.fixture
def env(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("COLUMNS", "250")
    for k, v in s3_server.settings().env().items():
        monkeypatch.setenv(k, v)
    return tmp_path


def _make(s3_server, tmp_path, name: str, iterations=(1, 2)) -> None:
    """A campaign: checkpoints (1000 + 2 bytes each) with manifests and a marker on S3, 500 bytes locally."""
    from infra.storage import ArtifactStore
    from rao_core.paths import rao_home

    store = ArtifactStore(s3_server.settings(), name)
    for k in iterations:
        src = tmp_path / f"src-{name}-{k}"
        src.mkdir()
        (src / "config.json").write_text("{}")
        (src / "model.safetensors").write_bytes(b"w" * 1000)
        store.put_checkpoint(src, f"iter-{k}/checkpoint")
        store.put_bytes(b"{}", f"iter-{k}/_done/train.json")
    local = rao_home() / "campaigns" / name / "iter-1"
    local.mkdir(parents=True)
    (local / "trees.jsonl").write_bytes(b"t" * 500)


def test_list_and_rm_keep_the_champion_without_force(env, s3_server, capsys):
    import mlflow

    from infra.storage import ArtifactStore
    from infra.tracking import configure_mlflow

    a, b = f"camp-{uuid.uuid4().hex[:6]}", f"camp-{uuid.uuid4().hex[:6]}"
    _make(s3_server, env, a)
    _make(s3_server, env, b, iterations=(1,))
    configure_mlflow()
    c = mlflow.MlflowClient()
    c.create_registered_model(f"rao-policy-{a}")
    v1 = c.create_model_version(f"rao-policy-{a}", source=f"s3://rao/{a}/iter-1/checkpoint").version
    v2 = c.create_model_version(f"rao-policy-{a}", source=f"s3://rao/{a}/iter-2/checkpoint").version
    c.set_registered_model_alias(f"rao-policy-{a}", "champion", v1)
    c.set_model_version_tag(f"rao-policy-{a}", v2, "rao.campaign", a)
    exp = c.create_experiment(f"rao-{a}")
    mine = c.create_run(exp, tags={"rao.campaign": a, "rao.kind": "campaign"}).info.run_id
    other = c.create_run(exp, tags={"rao.campaign": b, "rao.kind": "campaign"}).info.run_id

    code, out, err = run_cli(capsys, "campaigns", "list")
    assert code == 0, err
    row = next(ln for ln in out.splitlines() if a in ln)
    assert "iter-1, iter-2" in row and f"rao-policy-{a} v{v1} (iter-1)" in row
    assert any(b in ln and "iter-1" in ln for ln in out.splitlines())

    code, out, err = run_cli(capsys, "campaigns", "rm", a)
    assert code == 0, err
    assert "freed 0.0 MB local" in out and "kept s3://rao/" + a + "/iter-1/checkpoint" in out and "--force" in out
    store = ArtifactStore(s3_server.settings(), a)
    assert sorted(store.list()) == ["iter-1/checkpoint.manifest.json", "iter-1/checkpoint/config.json",
                                    "iter-1/checkpoint/model.safetensors"]
    assert store.verify_manifest("iter-1/checkpoint.manifest.json") == []  # the champion can still be loaded
    assert c.get_model_version(f"rao-policy-{a}", v2).tags.get("rao.pruned") == "true"
    assert c.get_model_version(f"rao-policy-{a}", v1).tags.get("rao.pruned") is None
    # the runs and versions stay, detached from the name: a new campaign `a` starts fresh instead of resuming into them
    from tasks.tracking import find_campaign_run

    assert find_campaign_run(exp, a) is None and find_campaign_run(exp, b) == other
    tags = c.get_run(mine).data.tags
    assert tags["rao.removed_campaign"] == a and tags["rao.campaign"].startswith(f"{a}~removed-")
    assert c.get_model_version(f"rao-policy-{a}", v2).tags["rao.campaign"].startswith(f"{a}~removed-")
    assert "MLflow: 1 runs and 1 model versions" in out
    # the kept champion keeps its alias; an alias on a deleted checkpoint would have been removed
    assert c.get_registered_model(f"rao-policy-{a}").aliases == {"champion": int(v1)}

    code, out, err = run_cli(capsys, "campaigns", "rm", a, "--force")
    assert code == 0 and "deleted the champion" in out, err
    assert c.get_registered_model(f"rao-policy-{a}").aliases == {}  # no alias on a deleted checkpoint
    assert f"aliases removed (their checkpoints are deleted): rao-policy-{a}@champion" in out
    assert store.list() == [] and c.get_model_version(f"rao-policy-{a}", v1).tags.get("rao.pruned") == "true"
    assert ArtifactStore(s3_server.settings(), b).list() != []  # the other campaign is untouched

    code, out, err = run_cli(capsys, "campaigns", "rm", a)
    assert code == 2 and err.strip().startswith(f"error: no campaign '{a}'") and len(err.strip().splitlines()) == 1

    # files gone but runs still tagged with the name (a removal whose MLflow step failed): rm detaches them
    left = c.create_run(exp, tags={"rao.campaign": a}).info.run_id
    code, out, err = run_cli(capsys, "campaigns", "rm", a)
    assert code == 0 and "no files left; MLflow: 1 runs and 0 model versions detached" in out, err
    assert c.get_run(left).data.tags["rao.campaign"].startswith(f"{a}~removed-")


def test_every_page_of_an_mlflow_search_is_read():
    """MLflow's search_* calls return a page (100 registered models, 1000 experiments); the command follows the
    page tokens, or a campaign past the first page keeps its runs tagged and its champion unprotected."""
    from rao_cli.campaigns_cmd import _all

    class Page(list):
        def __init__(self, items, token):
            super().__init__(items)
            self.token = token

    pages = {None: Page([1, 2], "t1"), "t1": Page([3], "t2"), "t2": Page([4, 5], None)}
    calls = []

    def search(*args, page_token=None, **kw):
        calls.append((args, page_token, kw))
        return pages[page_token]

    assert _all(search, "x", max_results=2) == [1, 2, 3, 4, 5]
    assert [(a, t, k) for a, t, k in calls] == [(("x",), None, {"max_results": 2}), (("x",), "t1", {"max_results": 2}),
                                                (("x",), "t2", {"max_results": 2})]


def test_fetch_brings_checkpoints_back_where_the_records_name_them(env, s3_server, capsys):
    """Retention removed the local copies (as `local_copies: none` does): fetch puts each checkpoint back at
    campaigns/NAME/checkpoints/iter-K, byte for byte; a second fetch downloads nothing; a corrupted object is
    refused and leaves no folder that reads as a checkpoint; unknown iterations and names are one error line."""
    from infra.storage import ArtifactStore
    from rao_core.paths import rao_home
    from tests.cli import one_error_line

    name = f"camp-{uuid.uuid4().hex[:6]}"
    _make(s3_server, env, name)
    folder = rao_home() / "campaigns" / name / "checkpoints"
    code, out, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "2")
    assert code == 0, err
    assert f"campaign {name} iter-2: fetched " in out and not (folder / "iter-1").exists()
    assert (folder / "iter-2" / "model.safetensors").read_bytes() == b"w" * 1000
    assert (folder / "iter-2" / "config.json").read_text() == "{}"
    store = ArtifactStore(s3_server.settings(), name)
    store.put_bytes(b"half", "iter-3/checkpoint/model.safetensors")  # an upload still running: no manifest yet
    code, out, err = run_cli(capsys, "campaigns", "fetch", name)  # every complete checkpoint; iter-2 is there already
    assert code == 0, err
    assert f"iter-1: fetched " in out and f"iter-2: already here ({folder / 'iter-2'})" in out and "iter-3" not in out
    assert (folder / "iter-1" / "model.safetensors").read_bytes() == b"w" * 1000

    (folder / "iter-2" / "model.safetensors").write_bytes(b"w" * 10)  # a copy cut short: fetched again, whole
    code, out, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "2")
    assert code == 0 and "iter-2: fetched " in out and (folder / "iter-2" / "model.safetensors").stat().st_size == 1000
    store.client.put_object(Bucket=store.settings.bucket, Key=f"{name}/iter-1/checkpoint/model.safetensors",
                            Body=b"x" * 1000)  # differs from the manifest's SHA-256
    import shutil

    shutil.rmtree(folder / "iter-1")
    code, out, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "1")
    assert code == 1 and one_error_line(err).startswith(
        f"error: checksum mismatch for s3://rao/{name}/iter-1/checkpoint/model.safetensors: SHA-256 "), err
    assert not (folder / "iter-1").exists() and not (folder / "iter-1.partial").exists()
    code, _, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "7")
    assert code == 2 and one_error_line(err) == (f"error: campaign {name!r} has no checkpoint of iteration 7 on "
                                                 f"s3://rao/{name}/ (it has: iter-1, iter-2; `rao campaigns list` "
                                                 "shows them)")
    code, _, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "3")
    assert code == 2 and "no checkpoint of iteration 3" in one_error_line(err) and "it has: iter-1, iter-2;" in err
    src = env / "src-opt"  # a checkpoint with its optimizer state: --weights-only leaves that out
    (src / "optimizer").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"m" * 100)
    (src / "optimizer" / "state.pt").write_bytes(b"o" * 200)
    store.put_checkpoint(src, "iter-5/checkpoint")
    code, out, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "5", "--weights-only")
    assert code == 0 and "iter-5: fetched 0.0 MB" in out and not (folder / "iter-5" / "optimizer").exists(), (out, err)
    assert (folder / "iter-5" / "model.safetensors").read_bytes() == b"m" * 100
    code, out, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "5", "--weights-only")
    assert code == 0 and "iter-5: already here" in out
    code, out, err = run_cli(capsys, "campaigns", "fetch", name, "--iteration", "5")  # the whole checkpoint now
    assert code == 0 and "iter-5: fetched" in out and (folder / "iter-5" / "optimizer" / "state.pt").stat().st_size == 200
    code, _, err = run_cli(capsys, "campaigns", "fetch", "camp-none")
    assert code == 2 and one_error_line(err) == ("error: campaign 'camp-none' has no checkpoint on s3://rao/camp-none/ "
                                                 "(`rao campaigns list` shows the campaigns and their checkpoints)")
    code, _, err = run_cli(capsys, "campaigns", "fetch", "Bad_Name")
    assert code == 2 and "is not a campaign name" in err
