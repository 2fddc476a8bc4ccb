"""The installation's secret, and the credentials of its local services derived from it.

Every embedded service listens on loopback, which every user of the machine can reach; each therefore requires a
credential only this installation's owner can read. One random secret is made per installation, the first time
a service needs it: ``$RAO_HOME/secrets/installation.key`` (:func:`secret_path`; 32 random bytes, hex, mode 0600
in a folder of mode 0700), then reused. Each service's credential is derived from it
(:func:`service_secret`: HMAC-SHA256 of the service's name), so that one credential seen by a service (vLLM's key,
SeaweedFS's JWT keys) tells nothing of the others: the S3 secret key of the embedded SeaweedFS, its JWT signing
keys, the Prefect API's auth string and the vLLM servers' API key.

Every file that holds a secret is created with :func:`write_private`: opened with mode 0600 from the start (no
moment at which another user could read it), written, then renamed into place.

Everything else under ``$RAO_HOME`` is owner-only too (:func:`owner_only`): the installation's processes (the
``rao`` command and the services it starts: SeaweedFS, MLflow, Prefect, vLLM, Ray) run with the umask
:data:`OWNER_UMASK`, so the folders they make are 0700 and their files 0600 (S3 volume data, the SQLite databases,
campaign files, logs), and an installation made before that rule is tightened at the start
(:func:`tighten_modes`: ``chmod -R go-rwx $RAO_HOME``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from rao_core.paths import rao_home

#: Bytes of randomness of the installation's secret.
SECRET_BYTES = 32
#: The umask of the installation's processes: nothing they create is readable, writable or searchable by the group
#: or by other users (folders 0700, files 0600).
OWNER_UMASK = 0o077

_tightened: set[Path] = set()  # the homes this process has tightened (tighten_modes once per home)


def tighten_modes(root: Path | str) -> int:
    """``chmod -R go-rwx root``: take every right of the group and of other users off ``root`` and everything
    under it that this user owns (symbolic links are neither followed nor changed; what cannot be read or
    changed is skipped). Idempotent; a tree already owner-only costs one ``lstat`` per entry. Returns the number
    of entries changed."""
    import stat

    root = Path(root)
    uid = os.getuid()
    changed = 0

    def fix(path: str, st: os.stat_result) -> None:
        nonlocal changed
        if st.st_uid == uid and st.st_mode & 0o077 and not stat.S_ISLNK(st.st_mode):
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
                changed += 1
            except OSError:
                pass

    try:
        fix(str(root), root.lstat())
    except OSError:
        return 0
    if not root.is_dir() or root.is_symlink():
        return changed
    todo = [str(root)]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            fix(e.path, st)
            if stat.S_ISDIR(st.st_mode):
                todo.append(e.path)
    return changed


def owner_only(home: Path | str | None = None) -> int:
    """Make this process and what it starts owner-only: the umask :data:`OWNER_UMASK` (children inherit it:
    every service started from here creates 0700 folders and 0600 files), and, once per process,
    :func:`tighten_modes` of the installation's home ``home`` (default ``$RAO_HOME``) when it exists, which mends
    an installation whose files were made readable by others (never ``/`` or the user's home folder). Returns the number of entries tightened (0 when
    nothing needed it or it ran before in this process)."""
    os.umask(OWNER_UMASK)
    root = Path(home) if home is not None else rao_home()
    if root in _tightened or not root.exists() or root in (Path("/"), Path.home()):
        return 0  # a home that is the user's own (or the root) is not the installation's to tighten
    _tightened.add(root)
    return tighten_modes(root)


def secrets_dir() -> Path:
    """``$RAO_HOME/secrets``, made mode 0700 (tightened when it exists with wider rights)."""
    d = rao_home() / "secrets"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    if d.stat().st_mode & 0o077:
        os.chmod(d, 0o700)
    return d


def secret_path() -> Path:
    """The installation's secret: ``$RAO_HOME/secrets/installation.key``."""
    return secrets_dir() / "installation.key"


def write_private(path: Path | str, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` as a file of mode 0600: a temporary file created with that mode (``os.open``, so
    it is never readable by others), then renamed over ``path``. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def installation_secret() -> bytes:
    """The installation's secret (:func:`secret_path`), made on first use: random, written once with
    ``O_CREAT | O_EXCL`` and mode 0600 (two processes making it at once agree on the first one written). A file
    found with wider rights is tightened to 0600. Raises RuntimeError (naming the file) when it holds no secret."""
    path = secret_path()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(SECRET_BYTES) + "\n")
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    for _ in range(50):  # another process may be between its create and its write
        text = path.read_text().strip()
        if text:
            break
        import time

        time.sleep(0.02)
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) < 16:
        raise RuntimeError(f"{path} does not hold the installation's secret (hex); delete it to make a new one "
                           "(the local services' credentials change with it)")
    return value


def service_secret(name: str) -> str:
    """The credential of local service ``name`` (``"s3"``, ``"prefect"``, ``"vllm"``, ...): HMAC-SHA256 of the
    name under the installation's secret, hex (64 characters). The same in every process of the installation."""
    return hmac.new(installation_secret(), name.encode(), hashlib.sha256).hexdigest()


def service_secret_file(name: str) -> Path:
    """A file holding :func:`service_secret` of ``name`` alone (``$RAO_HOME/secrets/<name>``, mode 0600), for a
    command line that reads it (``"$(cat FILE)"``) instead of showing it; rewritten when it differs."""
    path = secrets_dir() / name
    value = service_secret(name)
    try:
        if path.read_text() == value and not path.stat().st_mode & 0o077:
            return path
    except OSError:
        pass
    return write_private(path, value)
