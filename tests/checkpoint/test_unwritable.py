"""A checkpoint location that takes no writes (a full disk, a path through a file) stops the
training process with exit 73 (EX_CANTCREAT), not 1, and it says why beside its progress file
(``checkpoint-unwritable.json``): the operator then waits for the location instead of counting
an application failure. The checkpoints saved before are kept."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.checkpoint.training import TrainingSession
from airflow_spot.testing import train_command
from airflow_spot.testing.disks import FullDisk

REASON_FILE = "checkpoint-unwritable.json"  # beside the progress file (checkpoint.writable)


def test_a_full_disk_stops_training_with_exit_73_and_says_why(tmp_path: Path) -> None:
    """The save at step 20 meets a full disk: exit 73 (not 1), the reason beside the progress
    file (location, error, free space), and checkpoint step 10 is kept whole."""
    session = TrainingSession(
        str(tmp_path / "ckpt"),
        total_steps=100,
        save_every=10,
        progress_file=str(tmp_path / "run" / "progress.json"),
    )
    (tmp_path / "run").mkdir()
    disk = FullDisk(tmp_path / "ckpt")
    session.checkpoints = Checkpoints(disk)
    session.step_done(10, lambda: {"w.bin": b"ten"})
    disk.full = True
    with pytest.raises(SystemExit) as stopped:
        session.step_done(20, lambda: {"w.bin": b"twenty"})
    assert stopped.value.code == 73
    reason = json.loads((tmp_path / "run" / REASON_FILE).read_text())
    assert reason["error"] == "No space left on device (ENOSPC)"
    assert reason["location"] == disk.uri and (reason["step"], reason["checkpoint_step"]) == (
        20,
        10,
    )
    assert isinstance(reason["free_bytes"], int)
    latest = Checkpoints(LocalStore(tmp_path / "ckpt")).latest_valid()
    assert latest is not None and latest.step == 10


def test_a_real_trainer_whose_location_runs_through_a_file_exits_73(tmp_path: Path) -> None:
    """The example trainer, its location under a regular file (ENOTDIR, which no chmod or
    root can write through): exit 73 and the reason, where it used to exit 1."""
    (tmp_path / "file").write_text("not a folder")
    env = {
        **os.environ,
        "AIRFLOW_SPOT_CHECKPOINT_URI": str(tmp_path / "file" / "ckpt"),
        "AIRFLOW_SPOT_PROGRESS_FILE": str(tmp_path / "progress.json"),
    }
    done = subprocess.run(
        train_command(20, save_every=5), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 73, done.stderr[-2000:]
    assert "Could not save checkpoint step 5" in done.stderr
    reason = json.loads((tmp_path / REASON_FILE).read_text())
    assert reason["error"] == "Not a directory (ENOTDIR)"
    assert reason["location"] == (tmp_path / "file" / "ckpt").as_uri()


def test_a_progress_report_that_cannot_be_written_does_not_stop_training(tmp_path: Path) -> None:
    """The progress file cannot be written (its folder is a device here; a full run folder
    alike): progress is not reported, the training goes on, and its saves still land."""
    session = TrainingSession(
        str(tmp_path / "ckpt"), total_steps=10, save_every=5, progress_file="/dev/full/progress"
    )
    assert session.step_done(1, lambda: {"w": b"1"}) is None
    saved = session.step_done(5, lambda: {"w": b"5"})
    assert saved is not None and saved.step == 5
