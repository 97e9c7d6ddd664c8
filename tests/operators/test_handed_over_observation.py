"""What the policy sees of a spot attempt that took over from on-demand (a make-before-break
return, handed over) while it restores the checkpoint on-demand saved: running spot, as the
replay hands over only once the launch's changeover is paid, so the safety net does not call
it off for a new on-demand launch. And a return still waiting for capacity when the on-demand
attempt under it ends (a failure): the return is called off and on-demand launches again."""

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
from airflow_spot.policy.base import safety_net
from airflow_spot.policy.model import SpotView
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

STEPS, SPS, CHANGEOVER = 480, 360.0, 1800.0  # market seconds: 48 h of work


def _turn(tmp_path: Path, state: JobState):
    op = SpotTrainingOperator(
        task_id="train",
        command=[sys.executable, "-c", "pass"],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=STEPS * SPS),
        total_steps=STEPS,
        deadline=timedelta(hours=62),
        policy="deadline_aware",
        backend=LocalBackend(
            trace=str(scripted_trace(tmp_path / "t.json", [(True, 5000)])),
            polarity="available",
            work_dir=str(tmp_path / "runs"),
        ),
    )
    return op.turn(state, make_context(FileTaskStateStore(tmp_path / "s.json")))


def _attempts(st: JobState, now: float, ready: bool) -> None:
    """On-demand (attempt 1) trained; spot (attempt 2) was granted 0.4 h ago and, if
    ``ready``, took over (on-demand checkpoints and stops); it has not trained a step yet.
    Not ready: spot launched after on-demand ended, still in its changeover."""
    od = AttemptRecord(1, "on_demand", AttemptHandle(run_dir="/r/1"), 0.0, started_at=900.0)
    spot = AttemptRecord(2, "spot", AttemptHandle(run_dir="/r/2"), now - 1440.0)
    spot.granted_at = now - 1440.0
    if ready:
        spot.ready_at, od.handed_to = now - 60.0, 2
    else:
        od.ended_at, od.outcome = now - 1500.0, "preempted"
    st.attempts, st.current, st.incoming = [od, spot], 1, None


def test_a_spot_attempt_that_took_over_reads_as_running_spot(tmp_path: Path) -> None:
    p = Progress(STEPS, 400, 400, SPS, CHANGEOVER)
    for ready, left in ((True, 0.0), (False, CHANGEOVER - 1440.0)):
        st = JobState(started_at=0.0, deadline_at=62 * 3600.0, total_steps=STEPS)
        turn = _turn(tmp_path, st)
        job = turn._job(p)
        # the slack short of the net's need by half a look: the net's check fails
        need = job.work_s - 400 * SPS + job.changeover_s + job.failure_reserve_s + job.acquire_s
        now = job.deadline_s - need - 0.5 * job.tick_s
        _attempts(st, now, ready)
        obs = turn._observe(now, p, job, SpotView.now(True, 9000.0, "attempt"))
        assert (obs.capacity, obs.overlap) == (Capacity.SPOT, False)
        assert obs.changeover_left_s == left
        # spot that took over trains on; a launch still in its changeover gives way
        kept = safety_net(job, obs, Decision(Capacity.SPOT, "dp_spot", (0.0, 0.0)))
        assert kept.capacity is (Capacity.SPOT if ready else Capacity.ON_DEMAND), kept


def test_a_return_over_an_on_demand_launch_not_done_reads_without_overlap(tmp_path: Path) -> None:
    """A return granted while on-demand still pays its own launch (a gang's nodes booting):
    spot launching with nothing training under it, so the net calls it off where a slack a
    hair short would let a return over training on-demand go on. The replay missed by 2 min
    once, a return handed over at the look where on-demand's launch ended, with no progress."""
    p = Progress(STEPS, 400, 400, SPS, CHANGEOVER)
    for trains in (True, False):
        st = JobState(started_at=0.0, deadline_at=62 * 3600.0, total_steps=STEPS)
        turn = _turn(tmp_path, st)
        job = turn._job(p)
        need = job.work_s - 400 * SPS + job.changeover_s + job.failure_reserve_s + job.acquire_s
        now = job.deadline_s - need - 0.5 * job.tick_s
        od = AttemptRecord(1, "on_demand", AttemptHandle(run_dir="/r/1"), now - 2400.0)
        od.granted_at = now - 2400.0
        od.started_at = now - 600.0 if trains else None
        spot = AttemptRecord(2, "spot", AttemptHandle(run_dir="/r/2"), now - 600.0)
        spot.granted_at = now - 600.0
        st.attempts, st.current, st.incoming = [od, spot], 0, 1
        obs = turn._observe(now, p, job, SpotView.now(True, 9000.0, "attempt"))
        assert (obs.capacity, obs.overlap) == (Capacity.SPOT, trains)
        assert obs.changeover_left_s == CHANGEOVER - 600.0
        kept = safety_net(job, obs, Decision(Capacity.SPOT, "dp_spot", (0.0, 0.0)))
        assert kept.capacity is (Capacity.SPOT if trains else Capacity.ON_DEMAND), kept


@pytest.mark.parametrize("od_ended", [True, False])
def test_on_demand_launches_again_under_a_waiting_return(tmp_path: Path, od_ended) -> None:
    """The policy asks for on-demand and a look while a return to spot waits, ungranted. With
    on-demand training under it, the request is the look and nothing changes; with the
    on-demand attempt ended (its trainer failed), the return is called off and on-demand
    launches again (a launch not held removes the task's other pods on Kubernetes). Before,
    nothing launched: the job sat idle, look after look, until its deadline could not be met
    any more (CI found it under load in test_failure_reserve)."""
    st = JobState(started_at=0.0, deadline_at=62 * 3600.0, total_steps=STEPS)
    turn = _turn(tmp_path, st)
    od = AttemptRecord(1, "on_demand", AttemptHandle(run_dir="/r/1"), 0.0, started_at=60.0)
    spot = AttemptRecord(2, "spot", AttemptHandle(run_dir="/r/2"), 3000.0)  # not granted
    st.attempts, st.current, st.incoming = [od, spot], 0, 1
    if od_ended:
        od.ended_at, od.outcome, st.current = 3300.0, "app_failure", None
    launched, called_off = [], []
    turn.attempt.launch = lambda cap, job, hold=False: launched.append((cap, hold))
    turn.attempt.stop_coming = called_off.append
    job = turn._job(Progress(STEPS, 400, 400, SPS, CHANGEOVER))
    turn.act(Decision(Capacity.ON_DEMAND, "dp_od", (1.8, 7.9, -0.4), look=True), job, 3400.0)
    assert launched == ([(Capacity.ON_DEMAND, False)] if od_ended else [])
    assert len(called_off) == od_ended and st.coming is spot  # (stop_coming stubbed)
