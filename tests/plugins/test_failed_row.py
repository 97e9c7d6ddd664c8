"""A failed job's row shows the progress its checkpoints hold, not ``0.0``: the job failed
before it decided again, so its last decision still says step 0."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.exceptions import FailureBudgetExhausted
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.plugins.data import row
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

# saves checkpoints 5 to 25 of 60, then fails
FAILS_AT_25 = (
    "from airflow_spot.checkpoint.training import TrainingSession\n"
    "s = TrainingSession.from_env(total_steps=60, save_every=5)\n"
    "for i in range(25):\n"
    "    s.step_done(i + 1, lambda: {'w.bin': b'weights'})\n"
    "raise SystemExit(1)\n"
)


def test_a_job_that_failed_shows_the_checkpoints_it_saved(tmp_path: Path) -> None:
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    op = SpotTrainingOperator(
        task_id="train",
        command=[sys.executable, "-c", FAILS_AT_25],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=3),
        total_steps=60,
        deadline=timedelta(seconds=60),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        max_failures=0,
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=1.0, work_dir=str(tmp_path / "runs")
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.05,
        deferrable=False,
    )
    store = FileTaskStateStore(tmp_path / "s.json")
    with pytest.raises(FailureBudgetExhausted):
        op.execute(make_context(store))
    state = store.get(STATE_KEY)
    assert state["failed"] and state["decisions"][-1]["step"] == 0
    shown = row("dag", "run", "train", -1, "failed", state, None)
    assert shown["now"] == "failed" and shown["progress"] == 41.7  # 25 of 60 steps


def test_a_state_stored_before_checkpoint_seen_uses_its_attempts() -> None:
    """An older stored state (no ``checkpoint_seen``): its attempts' newest checkpoint."""
    state = {
        "total_steps": 420,
        "decisions": [{"step": 0, "capacity": "spot", "reason": "go"}],
        "attempts": [{"ckpt_step_end": 95, "ended_at": 5.0}, {"ckpt_step_end": None}],
        "failed": {"error": "FailureBudgetExhausted", "message": "..."},
    }
    assert row("d", "r", "t", -1, "failed", state, None)["progress"] == 22.6
