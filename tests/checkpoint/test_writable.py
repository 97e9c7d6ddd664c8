"""``checkpoint.writable``: which write errors are the location's (a full disk, S3's access
denied; not a passing S3 500), and the probe the operator writes before a relaunch, which names
the error and the free space and leaves nothing behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.checkpoint.training import STORAGE_EXIT
from airflow_spot.checkpoint.writable import REASON_FILE, probe, unwritable
from airflow_spot.testing.disks import FullDisk


def test_the_exit_and_the_reason_file_are_fixed_names() -> None:
    """What running trainers and the backends agree on: exit 73, and the reason's file name."""
    assert (STORAGE_EXIT, REASON_FILE) == (73, "checkpoint-unwritable.json")


def test_the_probe_names_the_error_and_the_free_space(tmp_path: Path) -> None:
    """A full disk fails the probe with ENOSPC and the free space; a healthy folder passes and
    keeps nothing of the probe; a checkpoint bigger than the free space does not fit."""
    disk = FullDisk(tmp_path / "ckpt")
    assert probe(disk) is None
    assert os.listdir(tmp_path / "ckpt") == []
    disk.full = True
    problem = probe(disk)
    assert problem is not None and problem.error == "No space left on device (ENOSPC)"
    assert f"checkpoint location {disk.uri} cannot be written" in str(problem)
    assert " free" in str(problem) and isinstance(problem.free_bytes, int)
    too_big = shutil.disk_usage(tmp_path).free + (1 << 30)
    roomless = probe(LocalStore(tmp_path / "other"), need_bytes=too_big)
    assert roomless is not None and "too little room" in roomless.error


def test_permission_denied_by_s3_is_the_location_s_trouble() -> None:
    """S3's AccessDenied on a write is the location's (an unwritable bucket), a 500 is not."""
    from botocore.exceptions import ClientError

    class Bucket:
        uri = "s3://bucket/prefix"

    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "Put")
    found = unwritable(Bucket(), denied)  # type: ignore[arg-type]
    assert found is not None and found.error.startswith("AccessDenied")
    assert "free space unknown" in str(found)
    busy = ClientError({"Error": {"Code": "500", "Message": "oops"}}, "PutObject")
    assert unwritable(Bucket(), busy) is None  # type: ignore[arg-type]
