"""What the installation writes under ``$RAO_HOME`` is its owner's alone: the ``rao`` command and the services it
starts run with umask 077 (folders 0700, files 0600: S3 volume data, the SQLite databases, campaign files, logs),
and an installation left readable by others is tightened at the next start (``chmod -R go-rwx``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

RAO = [sys.executable, "-m", "rao_cli.main"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def readable_by_others(root: Path) -> list[str]:
    """Every entry under ``root`` (``root`` included, symbolic links left out) that the group or other users may
    read, write or search, as ``path mode``."""
    found = []
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink() and _mode(p) & 0o077:
            found.append(f"{p.relative_to(root)} {oct(_mode(p))}")
    return found


@pytest.fixture
def open_parent():
    """A folder under /tmp that every user may traverse (0755; pytest's own temporary folders are 0700, which
    would hide what lies below them from another user whatever its modes); removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="rao-owner-only-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def umask_022():
    """The usual umask 022 while the test makes its files (an earlier test in this process may have set the CLI's
    077, under which nothing would need tightening)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_tighten_modes_takes_the_group_and_others_off_everything_but_links(tmp_path, umask_022):
    from infra.credentials import tighten_modes

    home = tmp_path / "home"
    (home / "campaigns" / "c" / "iter-1").mkdir(parents=True)
    data = home / "campaigns" / "c" / "iter-1" / "trees.jsonl"
    data.write_text("{}\n")
    tool = home / "bin-tool"
    tool.write_text("#!/bin/sh\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours to change")
    for p, m in ((home, 0o755), (home / "campaigns", 0o775), (data, 0o644), (tool, 0o755), (outside, 0o644)):
        p.chmod(m)
    (home / "link").symlink_to(outside)

    assert tighten_modes(home) == 6  # home, campaigns, campaigns/c, iter-1 (umask 022: 0755) and the two files
    assert readable_by_others(home) == []
    assert _mode(data) == 0o600 and _mode(tool) == 0o700 and _mode(home) == 0o700
    assert _mode(outside) == 0o644  # a link is not followed
    assert tighten_modes(home) == 0  # idempotent


def test_owner_only_sets_the_umask_and_mends_the_home_once(tmp_path, monkeypatch, umask_022):
    from infra import credentials

    home = tmp_path / "home"
    (home / "mlflow").mkdir(parents=True)
    db = home / "mlflow" / "mlflow.db"
    db.write_bytes(b"SQLite format 3\0")
    db.chmod(0o644)
    (home / "mlflow").chmod(0o755)
    monkeypatch.setenv("RAO_HOME", str(home))
    monkeypatch.setattr(credentials, "_tightened", set())
    old = os.umask(0o022)
    try:
        assert credentials.owner_only() == 3  # home (made 0755 under umask 022), mlflow/, mlflow.db
        assert os.umask(0o077) == 0o077
        assert _mode(db) == 0o600 and readable_by_others(home) == []
        db.chmod(0o644)
        assert credentials.owner_only() == 0 and _mode(db) == 0o644  # once per process and home
    finally:
        os.umask(old)


def test_atomic_files_are_0600_whatever_the_umask(tmp_path):
    from rao_core.jsonl import write_jsonl

    old = os.umask(0)
    try:
        p = write_jsonl(tmp_path / "iter-1" / "samples.jsonl", ['{"a": 1}'])
    finally:
        os.umask(old)
    assert _mode(p) == 0o600 and p.read_text() == '{"a": 1}\n'


def _second_user() -> tuple[int, int, str | None] | None:
    """(uid, gid, name made here or None) of a second Unix user: one made with ``useradd`` (root only: CI and the
    development machines run as root), else None."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return None
    name = f"raotest{os.getpid() % 100000}"
    r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return None
    import pwd

    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid, name


def _as_user(uid: int, gid: int, path: Path) -> subprocess.CompletedProcess:
    """Read ``path`` as user ``uid`` (a child that drops to it before it runs ``cat``)."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return subprocess.run(["cat", str(path)], capture_output=True, preexec_fn=drop, timeout=30)


@pytest.mark.services
@pytest.mark.slow
def test_after_services_up_and_a_campaigns_files_nothing_under_rao_home_is_readable_by_others(open_parent):
    """``rao services up --mlflow-server --prefect-server`` on a fresh RAO_HOME (its parent open to everyone), an
    object stored in S3, a run logged to MLflow and a campaign's trees written by the library: every entry under
    RAO_HOME is owner-only, and a second Unix user (where ``useradd`` works) cannot read the S3 volume holding
    the object."""
    home = open_parent / "home"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "RAO_POLICY", "RAO_S3", "MLFLOW_TRACKING", "RAO_JUDGE"))}
    env |= {"RAO_HOME": str(home), "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    up = subprocess.run([*RAO, "services", "up", "--mlflow-server", "--prefect-server"], env=env,
                        capture_output=True, text=True, timeout=400)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        code = """if True:
            import json, os, mlflow
            from infra.services import apply_service_env
            from infra.storage import S3Settings
            from rao_core.tree import ExecutionTree
            from rao_core.paths import rao_home
            env = apply_service_env()
            s3 = S3Settings(endpoint_url=os.environ["RAO_S3_ENDPOINT"], bucket="rao",
                            access_key=os.environ["AWS_ACCESS_KEY_ID"],
                            secret_key=os.environ["AWS_SECRET_ACCESS_KEY"]).client()
            s3.put_object(Bucket="rao", Key="camp/iter-1/model.safetensors", Body=b"SECRET-WEIGHTS" + os.urandom(65536))
            mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
            with mlflow.start_run():
                mlflow.log_metric("reward", 0.5)
            from rao_core.jsonl import write_jsonl
            write_jsonl(rao_home() / "campaigns" / "camp" / "iter-1" / "trees.jsonl", ['{"prompt": "secret"}'])
        """
        r = subprocess.run([sys.executable, "-c", code], env={**env, "RAO_HOME": str(home)}, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        state = json.loads((home / "services" / "state.json").read_text())
        assert {"s3", "mlflow", "prefect"} <= set(state)
    finally:
        down = subprocess.run([*RAO, "services", "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr[-2000:]

    volumes = list((home / "services" / "seaweedfs").rglob("*.dat")) or list(home.rglob("*.dat"))
    assert volumes and any(b"SECRET-WEIGHTS" in v.read_bytes() for v in volumes)
    assert list(home.rglob("prefect.db")) and list(home.rglob("mlflow.db"))
    assert readable_by_others(home) == []

    user = _second_user()
    if user is None:
        return  # no second user here (not root, or no useradd): the modes above are the test
    uid, gid, name = user
    try:
        for path in (next(v for v in volumes if b"SECRET-WEIGHTS" in v.read_bytes()),
                     home / "campaigns" / "camp" / "iter-1" / "trees.jsonl", *home.rglob("mlflow.db")):
            r = _as_user(uid, gid, path)
            assert r.returncode != 0 and b"SECRET" not in r.stdout, path
            assert b"Permission denied" in r.stderr, r.stderr
    finally:
        subprocess.run(["userdel", name], capture_output=True)
