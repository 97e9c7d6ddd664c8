"""The replay and the omniscient optimum reproduce the published per-window results."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from airflow_spot.ledger import Phase
from airflow_spot.policy import HOUR, Capacity, JobSpec, get_policy
from airflow_spot.simulate import Trace, load_traces, replay
from airflow_spot.simulate.omniscient import omniscient_costs
from airflow_spot.simulate.traces import bundled

SETTINGS = [(52, 0.2), (60, 0.2), (80, 0.2), (60, 0.02), (60, 0.5)]


@pytest.fixture(scope="module")
def windows() -> list[Trace]:
    return load_traces(
        [bundled("cant-be-late/us-west-2a_k80_1"), bundled("cant-be-late/us-west-2a_v100_1")],
        polarity="unavailable",
    )


@pytest.fixture(scope="module")
def reference() -> dict:
    with bundled("cant-be-late/reference_results_sample.csv").open() as fh:
        return {
            (r["env"], r["idx"], float(r["deadline_h"]), float(r["overhead_h"])): r
            for r in csv.DictReader(fh)
        }


def _job(dl: float, co: float) -> JobSpec:
    return JobSpec(48 * HOUR, dl * HOUR, co * HOUR)


@pytest.mark.parametrize(("deadline", "changeover"), SETTINGS)
@pytest.mark.parametrize(("policy", "column"), [("greedy", "greedy"), ("uniform_progress", "up")])
def test_replay_matches_reference(windows, reference, policy, column, deadline, changeover) -> None:
    """Greedy and Uniform Progress cost, spot and on-demand work equal the reference per window."""
    for t in windows:
        env, idx = t.name.split("/")
        ref = reference[(env, idx, float(deadline), changeover)]
        r = replay(get_policy(policy), t, _job(deadline, changeover), observe="oracle")
        assert r.cost == pytest.approx(float(ref[f"{column}_cost"]), rel=1e-3), t.name
        assert r.spot_work_hours == pytest.approx(float(ref[f"{column}_spot_h"]), abs=1e-3)
        assert r.on_demand_work_hours == pytest.approx(float(ref[f"{column}_od_h"]), abs=1e-3)
        assert r.met == (ref[f"{column}_met"] == "1")


@pytest.mark.parametrize(("deadline", "changeover"), SETTINGS)
def test_omniscient_matches_reference(windows, reference, deadline, changeover) -> None:
    """The omniscient DP equals the reference optimum on every bundled window."""
    costs = omniscient_costs(np.stack([t.available for t in windows]), _job(deadline, changeover))
    want = [
        float(reference[(*t.name.split("/"), float(deadline), changeover)]["omniscient_cost"])
        for t in windows
    ]
    assert costs == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize(
    "policy",
    ["greedy", "uniform_progress", "deadline_aware", "last_attempt_on_demand", "on_demand"],
)
def test_no_online_policy_beats_the_optimum(windows, policy) -> None:
    """Omniscient is a lower bound of every online policy on every window."""
    job = _job(56, 0.2)
    best = omniscient_costs(np.stack([t.available for t in windows]), job)
    for t, b in zip(windows, best, strict=True):
        assert replay(get_policy(policy), t, job).cost >= b - 1e-9


def test_changeover_is_billed_on_the_first_launch_too() -> None:
    """All on-demand on an empty market costs (work + one changeover) at the on-demand price."""
    job = JobSpec(10 * HOUR, 20 * HOUR, 0.5 * HOUR, tick_s=600.0)
    r = replay(get_policy("on_demand"), Trace("x", 600.0, np.zeros(200, bool)), job)
    assert r.cost == pytest.approx(10.5 * 3.06)  # 63 ticks of 600 s
    assert r.ledger.hours(phase=Phase.LAUNCHING) == pytest.approx(0.5)


def test_preemption_at_tick_boundary_keeps_the_interval() -> None:
    """Spot up 5 ticks then down: the 5th interval's progress counts and one preemption is recorded."""
    avail = np.array([True] * 5 + [False] * 200)
    job = JobSpec(2 * HOUR, 10 * HOUR, 600.0, tick_s=600.0)
    r = replay(get_policy("greedy"), Trace("x", 600.0, avail), job)
    assert r.spot_work_hours == pytest.approx(4 * 600 / HOUR)  # 5 ticks minus one of changeover
    assert r.preemptions == 1
    assert r.ledger.segments[1].ended_by == "preempted"
    idle = [s for s in r.ledger.segments if s.phase is Phase.IDLE]
    assert idle and all(s.cost == 0 for s in idle)


def test_trace_prices_are_billed_when_asked() -> None:
    """With use_trace_prices spot is billed at each tick's own price."""
    avail = np.ones(20, bool)
    t = Trace("x", 600.0, avail, prices=np.array([1.0] * 10 + [2.0] * 10))
    job = JobSpec(3000.0, 3 * HOUR, 0.0, tick_s=600.0)
    flat = replay(get_policy("greedy"), t, job)
    live = replay(get_policy("greedy"), t, job, use_trace_prices=True)
    assert flat.cost == pytest.approx(5 * 600 / HOUR * 0.9731)
    assert live.cost == pytest.approx(5 * 600 / HOUR * 1.0)
    assert live.ledger.segments[0].capacity is Capacity.SPOT


def test_replay_reports_the_last_runs_seen_whole() -> None:
    """The policy sees how long the last spot run and the last outage lasted, counting only
    runs whose start it saw (the run a job starts in has an unknown age)."""
    from airflow_spot.policy.base import Policy
    from airflow_spot.policy.model import Decision

    seen = []

    class Record(Policy):
        name = "test_record_runs"

        def choose(self, job, obs):
            seen.append((obs.spot_age_s, obs.last_up_s, obs.last_down_s))
            return Decision(Capacity.NONE, "wait")

    avail = np.array([1, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1] + [1] * 10, dtype=bool)
    replay(Record(), Trace("t", 600.0, avail), JobSpec(1 * HOUR, 3.5 * HOUR, 0.0), observe="oracle")
    assert seen[2] == (1200.0, None, None)
    assert seen[4] == (600.0, None, None)  # the first run (3 looks) was not seen from its start
    assert seen[5] == (0.0, None, 1200.0)  # the outage of 2 looks was
    assert seen[9] == (0.0, 600.0, 1800.0)


def test_omniscient_refuses_a_unit_that_would_exhaust_memory() -> None:
    """A changeover of 601 s on 600 s ticks leaves a 1 s unit: 2,000 windows would need ~10
    GiB, so it says so and how to fix it (before allocating anything)."""
    avail = np.ones((2000, 554), dtype=bool)
    job = JobSpec(48 * HOUR, 60 * HOUR, 601.0, tick_s=600.0)
    with pytest.raises(ValueError, match=r"GiB for 2000 windows: .* round the changeover"):
        omniscient_costs(avail, job)
