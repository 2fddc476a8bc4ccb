"""A full disk, named: which path, how much is free, and what to do.

A full disk reaches the pipeline in three shapes: an ``OSError`` with ``errno.ENOSPC`` (a write, a checkpoint
save), a ``shutil.Error`` whose list of ``(src, dst, why)`` holds a ``[Errno 28]`` (a folder copied with
``copytree``), and, from the embedded S3 server, a ``ClientError`` / ``S3UploadFailedError`` "InternalError"
(SeaweedFS answers a write it cannot store that way and says "no space left on device" only in its log; boto3
retries it for about 30 s first). :func:`full_disk` finds the full path in any of them (following
``__cause__`` / ``__context__``); :func:`disk_full_message` makes the one line the user reads.

The reserve. On a full disk nothing more can be written there, not even the bookkeeping of the failure: MLflow's
SQLite file (``$RAO_HOME/mlflow``) cannot mark a run FAILED ("database or disk is full", seen on a full tmpfs),
so the runs stayed RUNNING. A campaign keeps :data:`RESERVE_BYTES` in ``$RAO_HOME/.disk-reserve``
(:func:`keep_reserve`); when the disk is full the failure hooks delete it first (:func:`release_reserve`), so
that the runs can be closed, and the next campaign makes it again once there is room.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

#: Space held back under ``$RAO_HOME`` for the bookkeeping of a failure on a full disk (an MLflow run's status
#: in SQLite, Prefect's state): a few pages each, 16 MiB leaves room for both and their journals.
RESERVE_BYTES = 16 << 20
RESERVE_NAME = ".disk-reserve"
#: Headroom above SeaweedFS's floor (:func:`seaweedfs_floor_bytes`) under which the embedded S3 server's data
#: folder counts as full when SeaweedFS answers an InternalError (its log is the other sign).
LOW_FREE_BYTES = 64 << 20
#: SeaweedFS's volume server marks every volume read-only while its disk has less than this fraction of its size
#: free (its ``-minFreeSpace`` default of 1 %, which ``weed mini`` does not expose): every S3 write then fails
#: with an InternalError although the disk still has gigabytes free (on a 252 GB disk, under 2.5 GB). Seen in
#: CI: a test suite whose S3 writes all failed, each after boto3's retries, ran past its 90 minutes.
SEAWEEDFS_MIN_FREE_FRACTION = 0.01
_NO_SPACE = ("[Errno 28]", "No space left on device", "no space left on device")


class DiskFullError(OSError):
    """No space left on a device, as one line (``str``): the path, its free space, what to do. An ``OSError``
    with ``errno.ENOSPC``: ``DiskFullError(errno.ENOSPC, line, path)``."""

    def __str__(self) -> str:
        return str(self.strerror)


def human_bytes(n: float) -> str:
    """``0 B``, ``812 KB``, ``1.4 GB`` (powers of 1000, as ``df -H``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") or n >= 100 else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (a file that could not be written may not exist)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: str | Path) -> tuple[int, int]:
    """(free, total) bytes of the file system holding ``path`` (its nearest existing parent)."""
    usage = shutil.disk_usage(_existing(Path(path)))
    return usage.free, usage.total


def seaweedfs_floor_bytes(total: int) -> int:
    """Free bytes under which the embedded S3 server stops writing on a disk of ``total`` bytes: SeaweedFS's
    read-only floor (:data:`SEAWEEDFS_MIN_FREE_FRACTION` of the disk) plus :data:`LOW_FREE_BYTES` of headroom.
    ``seaweedfs_floor_bytes(252e9)`` is about 2.6 GB."""
    return int(total * SEAWEEDFS_MIN_FREE_FRACTION) + LOW_FREE_BYTES


def seaweedfs_low_disk(data: str | Path) -> str | None:
    """One line saying that the disk holding the embedded S3 server's folder ``data`` is under
    :func:`seaweedfs_floor_bytes` (S3 reads work, every write fails), or None when there is room."""
    free, total = free_bytes(data)
    floor = seaweedfs_floor_bytes(total)
    if free >= floor:
        return None
    return (f"the disk holding the embedded S3 store {_existing(Path(data))} has {human_bytes(free)} of "
            f"{human_bytes(total)} free, under the {human_bytes(floor)} SeaweedFS needs (1% of the disk, under "
            f"which it makes every volume read-only): S3 reads work, every write fails; free space (`rao campaigns "
            f"list` shows what each campaign holds, `rao campaigns rm NAME` removes one) or set RAO_HOME to a "
            f"folder on a disk with room")


def _seaweedfs_says_full(home: Path) -> Path | None:
    """The embedded S3 server's data folder when it looks full: under :func:`seaweedfs_floor_bytes` free, or
    its newest log (``$RAO_HOME/services/seaweedfs-*.log``) says "no space left on device" near its end."""
    data = home / "services" / "seaweedfs"
    if not data.exists():
        return None
    if seaweedfs_low_disk(data) is not None:
        return data
    logs = sorted((home / "services").glob("seaweedfs-*.log"), key=lambda p: p.stat().st_mtime)
    if logs:
        with open(logs[-1], "rb") as f:
            f.seek(max(0, logs[-1].stat().st_size - (256 << 10)))
            if b"no space left on device" in f.read().lower():
                return data
    return None


def _s3_internal_error(e: BaseException) -> bool:
    """An S3 "InternalError": a botocore ``ClientError`` with that code, or boto3's ``S3UploadFailedError``
    (a failed upload, the ClientError only in its text)."""
    response = getattr(e, "response", None)
    if isinstance(response, dict) and response.get("Error", {}).get("Code") == "InternalError":
        return True
    return type(e).__name__ == "S3UploadFailedError" and "InternalError" in str(e)


def full_disk(e: BaseException, home: Path | None = None) -> Path | None:
    """The path whose disk is full when ``e`` (or an exception it was raised from) says so, else None: the
    file of an ENOSPC ``OSError`` (``home`` when it names none), the destination of a ``shutil.Error`` entry
    with ``[Errno 28]``, or the embedded S3 server's data folder for an S3 InternalError when that folder is
    full (:func:`_seaweedfs_says_full`). ``home``: ``$RAO_HOME`` (default ``rao_core.paths.rao_home()``)."""
    if home is None:
        from rao_core.paths import rao_home

        home = rao_home()
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, shutil.Error) and cur.args and isinstance(cur.args[0], list):
            for item in cur.args[0]:
                if isinstance(item, tuple) and len(item) == 3 and any(s in str(item[2]) for s in _NO_SPACE):
                    return Path(item[1])
        if isinstance(cur, OSError) and cur.errno == errno.ENOSPC:
            return Path(str(cur.filename or cur.filename2 or home))
        if _s3_internal_error(cur):
            found = _seaweedfs_says_full(home)
            if found is not None:
                return found
        cur = cur.__cause__ or cur.__context__
    return None


def _holds_embedded_s3(folder: Path, home: Path | None = None) -> bool:
    """True when the embedded S3 server's data folder (``$RAO_HOME/services/seaweedfs``; ``home``: ``$RAO_HOME``)
    exists on the file system that holds ``folder``; never raises."""
    if home is None:
        from rao_core.paths import rao_home

        home = rao_home()
    try:
        data = home / "services" / "seaweedfs"
        return data.is_dir() and data.stat().st_dev == _existing(folder).stat().st_dev
    except OSError:
        return False


def disk_full_message(path: Path, resume: str = "", home: Path | None = None) -> str:
    """``no space left on device under PATH (FREE of SIZE free); free space (...) and re-run: the campaign
    resumes at the RESUME stage``: ``PATH`` the folder (a file's parent folder), ``resume`` e.g. ``iteration 2 train``
    (empty: where it stopped). When the folder's disk is under the embedded S3 server's floor
    (:func:`seaweedfs_floor_bytes`) the line names the floor: "(2.1 GB of 252 GB free, under the 2.6 GB the
    embedded S3 store needs)", so that the space freed is enough for it too; on a disk that is full (under
    :data:`LOW_FREE_BYTES` free) only when the embedded S3 store's folder is on it (``home``: ``$RAO_HOME``,
    default ``rao_core.paths.rao_home()``)."""
    folder = path if path.is_dir() else path.parent
    free, total = free_bytes(folder)
    where = f"at the {resume} stage" if resume else "where it stopped"
    floor = seaweedfs_floor_bytes(total)
    named = free < floor and (free >= LOW_FREE_BYTES or _holds_embedded_s3(folder, home))
    under = f", under the {human_bytes(floor)} the embedded S3 store needs" if named else ""
    return (f"no space left on device under {folder} ({human_bytes(free)} of {human_bytes(total)} free{under}); free "
            f"space (`rao campaigns list` shows what each campaign holds, `rao campaigns rm NAME` removes one) and "
            f"re-run: the campaign resumes {where}")


def as_disk_full(e: BaseException, resume: str = "", home: Path | None = None) -> DiskFullError | None:
    """``e`` as a :class:`DiskFullError` (its line by :func:`disk_full_message`) when it says a disk is full,
    else None; a DiskFullError already made is returned as it is."""
    if isinstance(e, DiskFullError):
        return e
    path = full_disk(e, home)
    if path is None:
        return None
    return DiskFullError(errno.ENOSPC, disk_full_message(path, resume, home), str(path))


def _reserve(home: Path | None) -> Path:
    if home is None:
        from rao_core.paths import rao_home

        home = rao_home()
    return home / RESERVE_NAME


def keep_reserve(home: Path | None = None) -> bool:
    """Make the reserve ``$RAO_HOME/.disk-reserve`` (:data:`RESERVE_BYTES` of zeros, written, not sparse) when
    it is missing and the disk has room for it (at least 4 times its size free); returns whether it is there.
    Never raises."""
    path = _reserve(home)
    try:
        if path.exists():
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        if free_bytes(path.parent)[0] < 4 * RESERVE_BYTES:
            return False
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            for _ in range(RESERVE_BYTES >> 20):
                f.write(bytes(1 << 20))
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            path.with_name(path.name + ".tmp").unlink(missing_ok=True)
        except OSError:
            pass
        return False


def release_reserve(home: Path | None = None, *, only_when_full: bool = True) -> bool:
    """Delete the reserve (when the disk under it has less free space than the reserve holds, unless
    ``only_when_full`` is False); returns whether it was deleted. Never raises."""
    path = _reserve(home)
    try:
        if not path.exists() or (only_when_full and free_bytes(path.parent)[0] >= RESERVE_BYTES):
            return False
        path.unlink()
        return True
    except OSError:
        return False
