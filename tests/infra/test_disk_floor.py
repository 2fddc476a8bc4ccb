"""A disk full below SeaweedFS's own free-space floor: the error line names the floor (freeing a few hundred MB
would leave the embedded S3 store read-only), also when the disk is completely full, as long as the store's
folder is on that disk."""

from __future__ import annotations

import errno

import infra.disk as disk
from infra.disk import as_disk_full, disk_full_message

TOTAL = 252 * 10**9


def _home(tmp_path, with_store: bool):
    home = tmp_path / "home"
    (home / "services" / ("seaweedfs" if with_store else "other")).mkdir(parents=True)
    return home


def test_a_full_disk_that_holds_the_embedded_s3_store_names_its_floor(tmp_path, monkeypatch):
    home = _home(tmp_path, with_store=True)
    monkeypatch.setattr(disk, "free_bytes", lambda path: (12 * 10**6, TOTAL))  # 12 MB: under LOW_FREE_BYTES
    e = as_disk_full(OSError(errno.ENOSPC, "No space left on device", str(home / "campaigns" / "x.bin")),
                     resume="iteration 1 train", home=home)
    line = str(e)
    assert line.startswith(f"no space left on device under {home / 'campaigns'} (12.0 MB of 252 GB free, under the "
                           "2.6 GB the embedded S3 store needs); free space (")
    assert line.endswith("re-run: the campaign resumes at the iteration 1 train stage")


def test_a_full_disk_without_the_store_does_not_name_its_floor(tmp_path, monkeypatch):
    home = _home(tmp_path, with_store=False)
    monkeypatch.setattr(disk, "free_bytes", lambda path: (12 * 10**6, TOTAL))
    line = disk_full_message(tmp_path / "elsewhere", home=home)
    assert line.startswith(f"no space left on device under {tmp_path} (12.0 MB of 252 GB free); free space (")
    assert "needs" not in line


def test_over_the_floor_nothing_is_said_of_it(tmp_path, monkeypatch):
    home = _home(tmp_path, with_store=True)
    monkeypatch.setattr(disk, "free_bytes", lambda path: (int(2.7e9), TOTAL))
    assert "needs" not in disk_full_message(home, home=home)
