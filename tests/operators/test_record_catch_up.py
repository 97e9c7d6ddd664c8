"""An attempt's verdict can come before the save it makes on the notice (a real Eviction API
writes DisruptionTarget while the container still saves): the next launch credits it."""

from __future__ import annotations

from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.jobstate import AttemptHandle, AttemptRecord, JobState
from airflow_spot.operators.attempt import LiveAttempt


def _live(attempts: list[AttemptRecord]) -> LiveAttempt:
    live = LiveAttempt.__new__(LiveAttempt)  # _catch_up reads only the state
    live.state = JobState(started_at=0.0, deadline_at=100.0, attempts=attempts)
    return live


def _ended(step_start: int, step_end: int, ckpt: int) -> AttemptRecord:
    rec = AttemptRecord(1, "spot", AttemptHandle(run_dir="/r/1"), 1.0, step_start=step_start)
    rec.ended_at, rec.step_end, rec.ckpt_step_end, rec.outcome = 9.0, step_end, ckpt, "preempted"
    rec.started_at = 2.0  # it trained (only an attempt that trained can have saved)
    return rec


def _manifest(step: int) -> Manifest:
    return Manifest(step=step, total_steps=100, created=9.5, files={})


def test_a_checkpoint_saved_after_the_verdict_is_credited_to_the_ended_attempt() -> None:
    rec = _ended(step_start=10, step_end=30, ckpt=30)
    _live([rec])._catch_up(_manifest(32))
    assert (rec.ckpt_step_end, rec.step_end) == (32, 32)


def test_nothing_changes_when_the_record_already_holds_the_newest_checkpoint() -> None:
    rec = _ended(step_start=10, step_end=34, ckpt=30)
    _live([rec])._catch_up(_manifest(30))
    assert (rec.ckpt_step_end, rec.step_end) == (30, 34)
    _live([rec])._catch_up(None)
    assert rec.ckpt_step_end == 30


def test_a_live_attempt_is_left_to_its_own_reads() -> None:
    rec = _ended(step_start=10, step_end=30, ckpt=30)
    rec.ended_at = None  # still training (a make-before-break launch comes while it trains)
    _live([rec])._catch_up(_manifest(40))
    assert rec.ckpt_step_end == 30


def test_a_held_attempt_that_never_trained_is_not_credited_with_a_checkpoint() -> None:
    """A make-before-break spot attempt that ended before it was ready (on-demand trained on)
    saved nothing: a newer checkpoint is the last attempt that trained, not that one's."""
    trained = _ended(0, 30, 30)
    held = AttemptRecord(2, "spot", AttemptHandle(run_dir="/r/2"), 5.0, step_start=30)
    held.ended_at, held.outcome = 8.0, "preempted"
    live = _live([trained, held])
    live._catch_up(_manifest(32))
    assert (trained.ckpt_step_end, held.ckpt_step_end) == (32, None)
