"""The preemption budget: once spent, the job finishes on on-demand at once (it does not wait
for spot it may no longer use), or fails with on_preemption_budget='fail'."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.exceptions import PreemptionBudgetExhausted
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command

# spot up 40 min, then down 100 min, then up (600 s ticks); at 600x a tick is one wall second
MARKET = [(True, 4), (False, 10), (True, 500)]


def _op(tmp_path: Path, action: str) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "t.json", MARKET)
    return SpotTrainingOperator(
        task_id="train",
        command=train_command(200, step_seconds=0.05, save_every=5),
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=10),
        total_steps=200,
        deadline=timedelta(seconds=40),
        changeover=timedelta(seconds=0.2),
        policy="greedy",
        max_preemptions=0,
        on_preemption_budget=action,
        backend=LocalBackend(
            trace=str(trace),
            polarity="available",
            time_scale=600.0,
            work_dir=str(tmp_path / "runs"),
            notice_s=0.2,
            grace_s=1.0,
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.05,
        deferrable=False,
    )


def test_a_spent_budget_goes_on_demand_at_once(tmp_path: Path) -> None:
    """After the one preemption the budget allows none: the next attempt is on-demand,
    launched while spot is still down (greedy would otherwise wait 100 min for it)."""
    store = FileTaskStateStore(tmp_path / "s.json")
    summary = _op(tmp_path, "on_demand").execute(make_context(store))
    attempts = store.get(STATE_KEY)["attempts"]
    assert [a["capacity"] for a in attempts] == ["spot", "on_demand"]
    assert attempts[0]["outcome"] == "preempted" and attempts[1]["outcome"] == "succeeded"
    # launched within a few looks of the preemption, long before spot returns (at 2.33 h)
    gap_h = (attempts[1]["launched_at"] - attempts[0]["ended_at"]) * 600 / 3600
    assert gap_h < 0.5
    assert summary["preemptions"] == 1 and summary["deadline_met"] is True
    decisions = store.get(STATE_KEY)["decisions"]
    assert any("spent the budget of 0" in d["reason"] for d in decisions)


def test_a_spent_budget_fails_the_task_with_fail(tmp_path: Path) -> None:
    store = FileTaskStateStore(tmp_path / "s.json")
    with pytest.raises(PreemptionBudgetExhausted, match="1 preemptions exceed max_preemptions=0"):
        _op(tmp_path, "fail").execute(make_context(store))
    assert [a["outcome"] for a in store.get(STATE_KEY)["attempts"]] == ["preempted"]
