"""A full checkpoint disk is the environment's trouble, not the training code's: the attempt
ends ``checkpoint_unwritable`` (exit 73), no failure budget is spent, and the operator does not
relaunch into the full disk: it probes the location before each launch and waits while the
probe fails, then trains on once there is room; if room never comes it fails the task naming
``checkpoint_uri``, the error and the free space, before the deadline is lost.

The disk is a real one: a 256 KB tmpfs filled with a file (the kernel's ENOSPC for the
training process and the operator alike). Mounting needs root with CAP_SYS_ADMIN: elsewhere
these tests skip, and ``test_storage.py`` covers the same rules without a mount."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.checkpoint.manifest import MANIFEST, checkpoint_name
from airflow_spot.exceptions import ConfigError
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command

FILLER = "filler"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KB tmpfs mounted for the test (skips where mounting is not allowed)."""
    where = tmp_path / "disk"
    where.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except OSError as e:
        pytest.skip(f"cannot mount a small tmpfs here: {e}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _fill(disk: Path) -> None:
    """Fill the disk to the last byte."""
    with open(disk / FILLER, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
        try:
            while True:
                fh.write(b"\0")
        except OSError:
            pass


def _fill_at_step(disk: Path, step: int, free_after_s: float | None) -> threading.Thread:
    """Once checkpoint ``step`` is saved, fill the disk; free it ``free_after_s`` later."""

    def run() -> None:
        manifest = disk / "ckpt" / checkpoint_name(step) / MANIFEST
        until = time.time() + 60
        while not manifest.exists() and time.time() < until:
            time.sleep(0.01)
        _fill(disk)
        if free_after_s is not None:
            time.sleep(free_after_s)
            (disk / FILLER).unlink(missing_ok=True)  # gone with the disk if the test failed

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _op(tmp_path: Path, disk: Path, deadline_s: float) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    return SpotTrainingOperator(
        task_id="train",
        command=train_command(60, step_seconds=0.05, save_every=5),
        checkpoint_uri=str(disk / "ckpt"),
        expected_compute=timedelta(seconds=3),
        total_steps=60,
        deadline=timedelta(seconds=deadline_s),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        max_failures=0,  # one application failure would fail the task
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=1.0, work_dir=str(tmp_path / "runs")
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.05,
        deferrable=False,
    )


def test_a_disk_full_for_a_while_is_waited_out_without_spending_the_failure_budget(
    tmp_path: Path, small_disk: Path
) -> None:
    """Full for 4 s after checkpoint 10: attempt 1 ends checkpoint_unwritable, no launch while
    the probe fails, attempt 2 once there is room; the job finishes with no failure counted."""
    filler = _fill_at_step(small_disk, 10, free_after_s=4.0)
    store = FileTaskStateStore(tmp_path / "s.json")
    summary = _op(tmp_path, small_disk, 60).execute(make_context(store))
    filler.join(timeout=10)
    state = store.get(STATE_KEY)
    attempts = state["attempts"]
    assert [a["outcome"] for a in attempts] == ["checkpoint_unwritable", "succeeded"]
    first, second = attempts
    assert first["exit_code"] == 73
    uri = (small_disk / "ckpt").resolve().as_uri()
    assert (
        f"checkpoint location {uri} cannot be written: No space left on device" in first["reason"]
    )
    assert state["failures"] == 0 and summary["failures"] == 0
    # not relaunched into the full disk: it waited (the disk was full for 4 s)
    assert second["launched_at"] - first["ended_at"] > 2.0
    assert second["step_start"] >= 10  # from the checkpoint kept before the disk filled
    reasons = [d["reason"] for d in state["decisions"] if d.get("event") == "warning"]
    assert any(r.startswith("not launching: checkpoint location") and "free" in r for r in reasons)
    assert any("takes writes again" in r for r in reasons)
    assert summary["deadline_met"] is True


def test_a_disk_that_stays_full_fails_the_task_naming_the_location(
    tmp_path: Path, small_disk: Path
) -> None:
    """Never freed: one attempt only (no relaunch into the full disk), then a ConfigError on
    checkpoint_uri with the error and the free space while the deadline could still be met."""
    _fill_at_step(small_disk, 10, free_after_s=None)
    store = FileTaskStateStore(tmp_path / "s.json")
    with pytest.raises(ConfigError) as failed:
        _op(tmp_path, small_disk, 20).execute(make_context(store))
    assert failed.value.field == "checkpoint_uri"
    message = str(failed.value)
    assert "cannot be written: No space left on device (ENOSPC)" in message
    assert "0 bytes free" in message or "KB free" in message
    assert "waiting longer would miss the deadline" in message
    state = store.get(STATE_KEY)
    assert [a["outcome"] for a in state["attempts"]] == ["checkpoint_unwritable"]
    assert state["failures"] == 0 and state["failed"]["error"] == "ConfigError"
