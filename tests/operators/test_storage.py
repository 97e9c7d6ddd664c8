"""The rules of ``operators.storage`` without a mount: no launch while the location the last
attempt could not write still fails the probe, a launch once it passes, a ConfigError naming
``checkpoint_uri``, the error and the free space once waiting would miss the deadline (or when
attempts keep failing where the probe can write), and checkpoints that vanished are said (log
and decision log) and the task's claim written back."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.exceptions import ConfigError
from airflow_spot.jobstate import AttemptHandle, AttemptRecord, JobState
from airflow_spot.operators.location import claim_key, restore_claim
from airflow_spot.operators.storage import hold_back, saw_checkpoint, saw_progress
from airflow_spot.policy import JobSpec
from airflow_spot.testing.disks import FullDisk

NOW = 1_000_000.0
IDENT = TaskIdentity("dag", "train", "run")


def _state(*outcomes: str, deadline_s: float = 3600.0) -> JobState:
    st = JobState(started_at=NOW - 60, deadline_at=NOW - 60 + deadline_s, total_steps=100)
    for i, outcome in enumerate(outcomes, 1):
        rec = AttemptRecord(i, "spot", AttemptHandle(run_dir=f"/r/{i}"), NOW - 50, exit_code=73)
        rec.ended_at, rec.outcome, rec.reason = NOW - 40 + i, outcome, f"attempt {i} ended"
        st.attempts.append(rec)
    return st


def _job(work_s: float = 600.0) -> JobSpec:
    return JobSpec(work_s, 3000.0, 30.0, tick_s=60.0)


def _saved(tmp_path: Path, step: int) -> Checkpoints:
    ckpts = Checkpoints(LocalStore(tmp_path / "ckpt"))
    ckpts.save(step, {"w": b"weights"}, now=NOW, total_steps=100)
    return ckpts


def test_no_launch_while_the_probe_fails_and_a_launch_once_it_passes(tmp_path: Path) -> None:
    """Full: held back, said once in the decision log with the error and the free space;
    room again: launched, and said."""
    disk = FullDisk(tmp_path / "ckpt", full=True)
    st = _state("checkpoint_unwritable")
    assert hold_back(st, Checkpoints(disk), "/x/ckpt", _job(), None, NOW) is True
    assert hold_back(st, Checkpoints(disk), "/x/ckpt", _job(), None, NOW + 60) is True
    events = [d["reason"] for d in st.decisions if d.get("event") == "warning"]
    assert events == [
        f"not launching: checkpoint location {disk.uri} cannot be written: No space left on "
        f"device (ENOSPC); {events[0].split('; ')[1]}; looking again at the next decision"
    ]
    assert events[0].split("; ")[1].endswith(" free")
    disk.full = False
    assert hold_back(st, Checkpoints(disk), "/x/ckpt", _job(), None, NOW + 120) is False
    assert st.decisions[-1]["reason"] == "checkpoint location /x/ckpt takes writes again: launching"


def test_nothing_is_probed_after_an_attempt_that_could_write(tmp_path: Path) -> None:
    """Only an attempt that ended checkpoint_unwritable holds the next launch back."""
    for outcomes in ((), ("preempted",), ("checkpoint_unwritable", "app_failure")):
        st = _state(*outcomes)
        assert (
            hold_back(st, Checkpoints(FullDisk(tmp_path / "c", full=True)), "/x", _job(), None, NOW)
            is False
        )
    assert not (tmp_path / "c").exists()  # not even a probe was written


def test_waiting_that_would_miss_the_deadline_fails_naming_the_location(tmp_path: Path) -> None:
    """600 s of work and a 30 s changeover, 640 s left, 60 s decisions: no time to wait."""
    st = _state("checkpoint_unwritable", deadline_s=700.0)
    with pytest.raises(ConfigError) as failed:
        hold_back(st, Checkpoints(FullDisk(tmp_path / "ckpt", full=True)), "/x", _job(), None, NOW)
    assert failed.value.field == "checkpoint_uri"
    text = str(failed.value)
    assert (
        "cannot be written: No space left on device (ENOSPC);" in text and " free, since " in text
    )
    assert "attempt 1 stopped there (exit 73)" in text and "miss the deadline" in text


def test_attempts_that_keep_failing_where_the_probe_writes_fail_the_task(tmp_path: Path) -> None:
    """Three in a row although the operator can write: the trainer sees another location."""
    st = _state(*["checkpoint_unwritable"] * 3)
    with pytest.raises(ConfigError, match="3 attempts in a row could not write"):
        hold_back(st, Checkpoints(LocalStore(tmp_path / "ckpt")), "/x", _job(), None, NOW)


def test_vanished_checkpoints_are_said_and_the_claim_written_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 95 seen, then the folder deleted: a warning in the log and the decision log
    ("saved checkpoints at X vanished: step 95 to 0"), and both claim records are back."""
    ckpts = _saved(tmp_path, 95)
    restore_claim(ckpts, IDENT)  # the claims a new job makes (location.claim_location)
    st = _state()
    saw_progress(st, 95)
    shutil.rmtree(tmp_path / "ckpt")
    with caplog.at_level(logging.WARNING):
        saw_checkpoint(st, ckpts, IDENT, "/x/ckpt", ckpts.latest_manifest(), NOW)
    said = "saved checkpoints at /x/ckpt vanished: step 95 to 0"
    assert any(said in r.getMessage().lower() for r in caplog.records)
    assert st.decisions[-1]["event"] == "warning" and said in st.decisions[-1]["reason"]
    assert st.checkpoint_seen == 0
    me = {"dag_id": "dag", "task_id": "train", "run_id": "run", "map_index": -1}
    assert ckpts.owner() == me and ckpts.owner(claim_key(me)) == me


def test_a_location_that_only_grows_says_nothing(tmp_path: Path) -> None:
    ckpts = _saved(tmp_path, 10)
    st = _state()
    saw_checkpoint(st, ckpts, IDENT, "/x", ckpts.latest_manifest(), NOW)
    ckpts.save(20, {"w": b"more"}, now=NOW, total_steps=100)
    saw_checkpoint(st, ckpts, IDENT, "/x", ckpts.latest_manifest(), NOW)
    assert st.checkpoint_seen == 20 and st.decisions == []
    assert ckpts.owner() is None  # nothing vanished: no claim is written
