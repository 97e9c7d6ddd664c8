"""The cluster's observation model in the replay: what is seen, what probes cost, and how a
make-before-break return is billed (``observe="cluster"``; ``oracle`` is the paper's)."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_spot.ledger import Phase
from airflow_spot.policy import HOUR, Capacity, Decision, JobSpec, Observation, Policy, get_policy
from airflow_spot.simulate.engine import replay
from airflow_spot.simulate.traces import Trace

OD, SPOT, NONE = Capacity.ON_DEMAND, Capacity.SPOT, Capacity.NONE


class Script(Policy):
    """Asks what ``rule(obs)`` says and records every observation."""

    name = "script"
    unsafe = True

    def __init__(self, rule) -> None:
        self.rule = rule
        self.seen: list[Observation] = []

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        self.seen.append(obs)
        return self.rule(obs)


def _trace(*runs: tuple[bool, int]) -> Trace:
    return Trace("t", 600.0, np.concatenate([np.full(n, up, bool) for up, n in runs]))


JOB = JobSpec(4 * HOUR, 20 * HOUR, 0.2 * HOUR, tick_s=600.0)


def test_on_demand_without_a_look_never_sees_spot() -> None:
    """Unknown stays unknown: nothing the job holds or asks shows spot, so no guess appears."""
    p = Script(lambda o: Decision(OD, "od"))
    replay(p, _trace((True, 200)), JOB)
    assert all(o.spot_available is None for o in p.seen)
    assert all(o.spot_seen is None and o.spot_source == "" for o in p.seen)
    oracle = Script(lambda o: Decision(OD, "od"))
    replay(oracle, _trace((True, 200)), JOB, observe="oracle")
    assert all(o.spot_available is True and o.spot_source == "market" for o in oracle.seen)


def test_a_probe_that_finds_nothing_costs_nothing() -> None:
    p = Script(lambda o: Decision(OD, "od", look=True))
    r = replay(p, _trace((False, 200)), JOB)
    assert r.probes == 1  # one probe, waiting the whole time (unbilled)
    assert r.probe_cost == 0.0
    od_only = replay(Script(lambda o: Decision(OD, "od")), _trace((False, 200)), JOB)
    assert r.cost == od_only.cost
    seen = [o for o in p.seen[1:]]
    assert all(o.spot_available is False and o.spot_source == "probe" for o in seen)


def test_capacity_a_probe_finds_and_the_job_does_not_use_is_billed_once() -> None:
    """Spot comes back at tick 6; the probe finds it at tick 7 (asked at 6), the job stays on
    on-demand and stops looking: one changeover at the spot price, one PROBE segment."""
    p = Script(lambda o: Decision(OD, "od", look=o.spot_available is not True and o.now < 7 * 600))
    r = replay(p, _trace((False, 6), (True, 200)), JOB)
    assert r.probes == 1
    assert r.probe_cost == pytest.approx(JOB.changeover_s / HOUR * JOB.spot_price)
    probes = [s for s in r.ledger.segments if s.phase is Phase.PROBE]
    assert len(probes) == 1 and probes[0].start_s == 6 * 600.0
    assert r.ledger.summary()["probes"] == 1
    later = [o for o in p.seen if o.now > 7 * 600]
    assert later and all(o.spot_available is None and o.spot_seen is True for o in later)
    assert later[-1].spot_unseen_s == later[-1].now - 6 * 600.0


def test_a_spot_request_waits_unbilled_and_shows_the_outage() -> None:
    p = Script(lambda o: Decision(SPOT if o.spot_available is not False else NONE, "r", look=True))
    r = replay(p, _trace((False, 5), (True, 200)), JOB)
    assert [o.spot_available for o in p.seen[:6]] == [None, False, False, False, False, True]
    assert p.seen[1].spot_source == "request"
    assert r.ledger.hours(NONE) == pytest.approx(5 * 600 / HOUR)
    assert r.probe_cost == 0.0  # the request found spot and the job took it
    oracle = replay(get_policy("greedy"), _trace((False, 5), (True, 200)), JOB, observe="oracle")
    assert r.cost == oracle.cost  # waiting with a request is the oracle's idle wait


def test_a_make_before_break_return_loses_no_progress_and_bills_the_overlap() -> None:
    """On-demand from the start; spot asked at tick 12 (up): on-demand trains on through the
    0.2 h changeover, both billed while they overlap; the work ends when all on-demand would."""
    p = Script(lambda o: Decision(SPOT if o.now >= 12 * 600 else OD, "x"))
    r = replay(p, _trace((True, 300)), JOB)
    od_only = replay(Script(lambda o: Decision(OD, "x")), _trace((True, 300)), JOB)
    assert r.finished_h == od_only.finished_h  # no progress lost to the return
    assert r.overlap_hours == pytest.approx(0.2)
    assert sum(s.hours for s in r.ledger.segments if s.overlap) == pytest.approx(0.2)
    assert r.ledger.hours(OD) == pytest.approx(12 * 600 / HOUR + 0.2)  # then the overlap
    assert r.ledger.hours(SPOT) == pytest.approx(r.finished_h - 12 * 600 / HOUR)
    assert r.cost == pytest.approx(
        r.ledger.hours(OD) * JOB.on_demand_price + r.ledger.hours(SPOT) * JOB.spot_price
    )
    # under the oracle the same return is break-before-make: the changeover is lost
    bbm = replay(p, _trace((True, 300)), JOB, observe="oracle")
    assert bbm.finished_h == pytest.approx(od_only.finished_h + 0.2, abs=600 / HOUR)
    assert bbm.overlap_hours == 0.0


def test_spot_reclaimed_before_it_is_ready_leaves_on_demand_running() -> None:
    job = JobSpec(4 * HOUR, 20 * HOUR, 0.4 * HOUR, tick_s=600.0)  # changeover over two ticks
    p = Script(
        lambda o: Decision(SPOT if o.spot_available is not False and o.now >= 6 * 600 else OD, "x")
    )
    r = replay(p, _trace((True, 7), (False, 300)), job)
    od_only = replay(Script(lambda o: Decision(OD, "x")), _trace((True, 7), (False, 300)), job)
    assert r.preemptions == 1
    assert r.finished_h == od_only.finished_h  # on-demand was never stopped
    assert r.ledger.hours(SPOT) == pytest.approx(600 / HOUR)


@pytest.mark.parametrize("called_off", [False, True])
def test_a_return_begun_while_on_demand_still_launches_gains_no_progress(called_off) -> None:
    """On-demand launched at 0 (0.4 h changeover); a return to spot begun at tick 1, lost
    with spot at tick 3 (or called off at tick 2): on-demand finishes its own launch before it
    trains, through the overlap and after it, so the job ends when all on-demand would."""
    job = JobSpec(4 * HOUR, 20 * HOUR, 0.4 * HOUR, tick_s=600.0)
    if called_off:
        rule = lambda o: Decision(SPOT if o.now == 600 else OD, "x")  # noqa: E731
    else:
        rule = lambda o: Decision(  # noqa: E731
            SPOT if o.now >= 600 and o.spot_available is not False else OD, "x"
        )
    t = _trace((True, 3), (False, 300))
    r = replay(Script(rule), t, job)
    od_only = replay(Script(lambda o: Decision(OD, "x")), t, job)
    assert r.finished_h == od_only.finished_h
    od = [s for s in r.ledger.segments if s.capacity is OD]
    launching = sum(s.hours for s in od if s.phase is Phase.LAUNCHING)
    assert launching == pytest.approx(0.4)  # its whole changeover, the overlap's part included
    assert any(s.overlap and s.phase is Phase.LAUNCHING for s in od)
    assert r.ledger.hours(OD) == pytest.approx(od_only.ledger.hours(OD))


@pytest.mark.parametrize("name", ["greedy", "uniform_progress", "deadline_aware"])
def test_the_shipped_policies_meet_deadlines_and_say_what_they_see(name: str) -> None:
    rng = np.random.default_rng(3)
    for _ in range(6):
        runs = [(bool(i % 2), int(rng.integers(1, 40))) for i in range(40)]
        t = _trace(*runs)
        job = JobSpec(24 * HOUR, 30 * HOUR, 0.2 * HOUR, tick_s=600.0)
        r = replay(get_policy(name), t, job)
        assert r.met and r.observe == "cluster"
        row = r.row()
        assert {"observe", "probes", "probe_cost"} <= set(row)


def test_deadline_aware_reads_its_belief_while_spot_is_unseen() -> None:
    da = get_policy("deadline_aware")
    job = JobSpec(48 * HOUR, 60 * HOUR, 0.2 * HOUR, tick_s=600.0)
    obs = Observation(
        10 * HOUR,
        9.5 * HOUR,
        OD,
        None,
        spot_age_s=1.2 * HOUR,
        spot_unseen_s=0.7 * HOUR,
        spot_seen=False,
        spot_source="probe",
    )
    d = da.decide(job, obs)
    assert "spot unseen 0.70 h (down when last seen, outage age 1.90 h" in d.reason
    assert "%" in d.reason
    with pytest.raises(ValueError, match="observe"):
        replay(da, _trace((True, 10)), job, observe="psychic")


def test_the_break_before_make_ablation_sees_as_a_cluster_but_returns_as_the_paper() -> None:
    p = Script(lambda o: Decision(SPOT if o.now >= 12 * 600 else OD, "x"))
    bbm = replay(p, _trace((True, 300)), JOB, observe="cluster-bbm")
    mbb = replay(p, _trace((True, 300)), JOB)
    assert bbm.observe == "cluster-bbm" and bbm.overlap_hours == 0.0
    assert bbm.finished_h == pytest.approx(mbb.finished_h + 0.2, abs=600 / HOUR)
