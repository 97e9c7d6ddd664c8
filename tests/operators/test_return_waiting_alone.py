"""A return to spot still waiting for capacity when the on-demand attempt under it ends (the
trainer failed): nothing trains. The policy asks for on-demand and a look at spot; the waiting
request stays the look, and on-demand launches again. Before, the request was taken as the
look and nothing launched: the job sat idle, look after look, until its deadline could not be
met any more (a clean-clone CI run found it, under load, in test_failure_reserve)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.jobstate import AttemptHandle, AttemptRecord, JobState
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.job import Progress
from airflow_spot.policy import Capacity, Decision
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

STEPS, SPS = 100, 60.0


def _turn(tmp_path: Path, state: JobState):
    op = SpotTrainingOperator(
        task_id="train",
        command=[sys.executable, "-c", "pass"],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=STEPS * SPS),
        total_steps=STEPS,
        deadline=timedelta(hours=3),
        policy="deadline_aware",
        backend=LocalBackend(
            trace=str(scripted_trace(tmp_path / "t.json", [(False, 5000)])),
            polarity="available",
            work_dir=str(tmp_path / "runs"),
        ),
    )
    return op.turn(state, make_context(FileTaskStateStore(tmp_path / "s.json")))


@pytest.mark.parametrize("od_ended", [True, False])
def test_on_demand_launches_again_under_a_waiting_return(tmp_path: Path, od_ended) -> None:
    st = JobState(started_at=0.0, deadline_at=3 * 3600.0, total_steps=STEPS)
    turn = _turn(tmp_path, st)
    od = AttemptRecord(1, "on_demand", AttemptHandle(run_dir="/r/1"), 0.0, started_at=60.0)
    spot = AttemptRecord(2, "spot", AttemptHandle(run_dir="/r/2"), 3000.0)  # not granted
    st.attempts, st.current, st.incoming = [od, spot], 0, 1
    if od_ended:
        od.ended_at, od.outcome, st.current = 3300.0, "app_failure", None
    launched, called_off = [], []
    turn.attempt.launch = lambda cap, job, hold=False: launched.append((cap, hold))
    turn.attempt.stop_coming = called_off.append
    job = turn._job(Progress(STEPS, 80, 80, SPS, 120.0))
    turn.act(Decision(Capacity.ON_DEMAND, "dp_od", (1.8, 7.9, -0.4), look=True), job, 3400.0)
    # on-demand trains again if it ended; the waiting request is kept as the look either way
    assert launched == ([(Capacity.ON_DEMAND, False)] if od_ended else [])
    assert called_off == [] and st.coming is spot
