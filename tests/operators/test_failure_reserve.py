"""The reserve for application failures the operator hands the policy: the checkpoint interval
measured, the reserve for the failures the budget still allows, and a whole local run in which
a job that waited out a long outage still meets its deadline when its trainer then fails once,
losing a whole checkpoint interval and paying a new changeover."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.jobstate import AttemptRecord, JobState
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.failure_reserve import checkpoint_interval_s, saved_steps
from airflow_spot.operators.job import Progress
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command

# the example training, failing once (exit 3, on healthy capacity) on on-demand at the step
# before its last save: the failure loses a whole checkpoint interval
FAIL_ONCE = """
import os, sys
from pathlib import Path
from airflow_spot.checkpoint.training import TrainingSession
from airflow_spot.examples import train_logreg

marker, real = Path(sys.argv[1]), TrainingSession.step_done

def step_done(self, step, state, **kw):
    if (
        os.environ.get("AIRFLOW_SPOT_CAPACITY") == "on_demand"
        and step == self.total_steps - 1
        and not marker.exists()
    ):
        marker.write_text(str(step))
        sys.exit(3)
    return real(self, step, state, **kw)

TrainingSession.step_done = step_done
sys.exit(train_logreg.main(sys.argv[2:]))
"""

SCALE = 600.0  # market seconds a wall second: a trace tick (600 s) a wall second
STEPS, EVERY, STEP_S = 100, 20, 0.1  # 60 market seconds a step, a save every 20 min
# spot up 80 min (two saves and a third on the notice), then down for good
MARKET = [(True, 8), (False, 500)]


def _op(tmp_path: Path) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "t.json", MARKET)
    train = train_command(STEPS, step_seconds=STEP_S, save_every=EVERY)
    return SpotTrainingOperator(
        task_id="train",
        command=[sys.executable, "-c", FAIL_ONCE, str(tmp_path / "failed"), *train[3:]],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=STEPS * STEP_S),
        total_steps=STEPS,
        # 3.5 market hours for 1.67 h of work: the outage leaves about an hour to wait
        deadline=timedelta(seconds=21),
        changeover=timedelta(seconds=0.2),
        policy="deadline_aware",
        max_failures=2,
        backend=LocalBackend(
            trace=str(trace),
            polarity="available",
            time_scale=SCALE,
            work_dir=str(tmp_path / "runs"),
            notice_s=0.1,
            grace_s=1.0,
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.05,
        deferrable=False,
    )


def test_a_failure_after_a_long_outage_still_meets_the_deadline(tmp_path: Path) -> None:
    """Spot is reclaimed for good after two saves; the job waits for it, then goes on-demand
    early enough to keep the reserve for the two failures allowed (two changeovers and two
    20-minute intervals), and meets the deadline though the on-demand trainer dies once at
    the step before a save. Without the reserve the job waited until only a changeover and
    a look were left, and the failure made the deadline infeasible (about 0.25 h short)."""
    store = FileTaskStateStore(tmp_path / "s.json")
    summary = _op(tmp_path).execute(make_context(store))
    state = store.get(STATE_KEY)
    # (a spot request waiting in the outage, as the job's look at spot, is called off untrained)
    attempts = [a for a in state["attempts"] if a["step_end"] > a["step_start"]]
    assert [(a["capacity"], a["outcome"]) for a in attempts] == [
        ("spot", "preempted"),
        ("on_demand", "app_failure"),
        ("on_demand", "succeeded"),
    ], state["attempts"]
    assert attempts[1]["step_end"] - attempts[1]["ckpt_step_end"] == EVERY - 2  # a whole save
    assert summary["failures"] == 1 and summary["deadline_met"] is True
    # the first move to on-demand kept the reserve (two changeovers and two saves' work) and
    # its own changeover: deadline_aware plans to the deadline less what the net keeps, so its
    # floor goes first (before that, the net's "kept for application failures" did)
    first = next(d for d in state["decisions"] if d["capacity"] == "on_demand")
    deadline_h, step_h = 21 * SCALE / 3600, STEP_S * SCALE / 3600
    slack_h = deadline_h - first["market_h"] - (STEPS - first["step"]) * step_h
    reserve_h = (2 * 0.2 * SCALE + 2 * EVERY * STEP_S * SCALE) / 3600
    assert slack_h >= reserve_h + 0.2 * SCALE / 3600, (slack_h, first)


def _ended(outcome: str, start: int, end: int, ckpt: int) -> AttemptRecord:
    return AttemptRecord(
        1,
        "spot",
        {},
        launched_at=0.0,
        step_start=start,
        ended_at=1.0,
        outcome=outcome,
        step_end=end,
        ckpt_step_end=ckpt,
    )


@pytest.mark.parametrize(
    ("saved", "attempts", "reported", "steps"),
    [
        ([40, 60, 80], [], 95, 20),  # the gaps between checkpoints, not the lead of the run
        ([40, 60, 65], [_ended("preempted", 0, 65, 65)], 65, 20),  # the notice's save left out
        ([60, 65, 80], [_ended("preempted", 0, 65, 65)], 90, 20),  # not read short after it
        ([60, 65, 80], [_ended("cancelled", 0, 65, 65)], 90, 20),  # nor after a stop's save
        ([60, 80, 100], [_ended("app_failure", 60, 98, 80)], 100, 20),  # a failure's save kept
        ([40, 50, 60], [_ended("app_failure", 0, 68, 50)], 60, 18),  # the work a failure lost
        ([20], [], 33, 13),  # one checkpoint: the run's lead over it (above the least)
        ([], [], 0, 5),  # nothing measured: the least, one decision interval (5 steps here)
    ],
)
def test_the_checkpoint_interval_is_measured(saved, attempts, reported, steps) -> None:
    """The work one failure may lose: the largest gap between kept checkpoints on the
    trainer's schedule or a failure's loss; before two are kept, the running attempt's lead,
    at least one decision interval."""
    assert checkpoint_interval_s(saved, attempts, reported, 60.0, 300.0) == steps * 60.0


def test_checkpoint_steps_are_read_from_their_names() -> None:
    """Steps come from ``ckpt-<step>`` names, oldest first; other names are skipped."""
    names = ["ckpt-000000000060", "ckpt-000000000020", "ckpt-x", "ckpt-000000000040"]
    assert saved_steps(names) == [20, 40, 60]


def test_the_policy_job_keeps_the_reserve_for_the_failures_left(tmp_path: Path) -> None:
    """Two failures allowed, none spent, checkpoints every 20 steps of 60 s, a 300 s
    changeover: the policy's job keeps 2 x (300 + 1200) s; one failure spent, half; the
    budget spent, none (the next failure fails the task, however much time is left)."""
    ckpts = Checkpoints(LocalStore(tmp_path / "ckpt"))
    for step in (20, 40, 60):
        ckpts.save(step, {"w.bin": b"w"}, now=0.0, total_steps=STEPS)
    state = JobState(started_at=0.0, deadline_at=4 * 3600.0, total_steps=STEPS)
    ctl = _op(tmp_path).turn(state, make_context(FileTaskStateStore(tmp_path / "s.json")))
    p = Progress(STEPS, 60, 70, 60.0, 300.0)
    assert ctl._job(p).failure_reserve_s == 2 * (300.0 + 20 * 60.0)
    state.failures = 1
    assert ctl._job(p).failure_reserve_s == 300.0 + 20 * 60.0
    state.failures = 2
    assert ctl._job(p).failure_reserve_s == 0.0
