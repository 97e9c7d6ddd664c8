"""The replay's fast-forward is exact: the same rows, costs and ledgers as every look taken."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from airflow_spot.policy import (
    HOUR,
    Capacity,
    Decision,
    JobSpec,
    Observation,
    Policy,
    get_policy,
    policy_names,
)
from airflow_spot.policy.model import observation
from airflow_spot.simulate import Trace, engine, replay

TICK = 600.0
OBSERVE = ("oracle", "cluster")
CHEAP = ("greedy", "uniform_progress", "last_attempt_on_demand", "on_demand", "slack_reserve")


def _trace(rng: np.random.Generator, i: int, n: int = 160) -> Trace:
    """Flickery, long runs, or a mix of both; some start down, some end early (down after)."""
    kind = i % 4
    if kind == 0:  # flickery
        avail = rng.random(n) < 0.5
    else:
        stay = (0.98, 0.85, 0.6)[kind - 1]
        avail = np.empty(n, bool)
        avail[0] = rng.random() < 0.5
        for j in range(1, n):
            avail[j] = avail[j - 1] if rng.random() < stay else not avail[j - 1]
    if i % 7 == 3:
        avail = avail[: n // 2]  # shorter than the deadline: spot is down after it
    prices = rng.uniform(0.5, 1.5, len(avail)) if i % 9 == 5 else None
    return Trace(f"r{i}", TICK, avail, prices)


def _jobs() -> list[JobSpec]:
    out = []
    for work_h, slack_ticks, d in [
        (10.0, 30, 720.0),  # the paper's changeover, 1.2 ticks
        (10.0, 3, 720.0),  # deadline near the work
        (8.0, 20, 0.0),  # no changeover (deadline == work is allowed)
        (8.0, 0, 0.0),
        (12.0, 25, 300.0),  # less than a tick
        (12.0, 40, 1500.0),  # more than two ticks
        (9.0, 12, 442.8),  # not whole seconds: no hints from the baselines, same results
        (6.5, 10, 1200.0),  # exactly two ticks
    ]:
        work = work_h * HOUR
        out.append(JobSpec(work, work + d + slack_ticks * TICK, d, tick_s=TICK))
    out.append(JobSpec(10 * HOUR, 12 * HOUR, 720.0, tick_s=TICK, max_preemptions=1))
    out.append(JobSpec(10 * HOUR, 11 * HOUR + 1.5, 720.0, tick_s=TICK))  # deadline off a tick
    return out


def _same(policy: str, traces: list[Trace], jobs: list[JobSpec], observe: str) -> int:
    """Replays with and without the fast-forward agree in every figure; the looks skipped."""
    fast, slow = _Counting(get_policy(policy)), _Counting(get_policy(policy))
    for job in jobs:
        for tr in traces:
            for prices in (False, True) if tr.prices is not None else (False,):
                kw = {"observe": observe, "use_trace_prices": prices}
                a = replay(fast, tr, job, fast=True, **kw)  # type: ignore[arg-type]
                b = replay(slow, tr, job, fast=False, **kw)  # type: ignore[arg-type]
                where = (policy, observe, tr.name, job)
                assert a.row() == b.row(), where
                assert a.cost == b.cost, where
                assert a.ledger is not None and b.ledger is not None
                assert a.ledger.segments == b.ledger.segments, where
                assert (a.ledger.probes, a.ledger.finished_s, a.overlap_hours) == (
                    b.ledger.probes,
                    b.ledger.finished_s,
                    b.overlap_hours,
                ), where
    return slow.calls - fast.calls


class _Counting:
    """A policy's proxy that counts its looks and checks every hint it gives against the looks
    that follow (while the state stays steady, the decision must stay the same; under a blind
    hint, whatever spot does)."""

    def __init__(self, policy: Policy) -> None:
        self.policy, self.name, self.calls = policy, policy.name, 0
        self.promise: tuple[Observation, Decision, int, int, bool] | None = None
        self.blind_held = 0  # looks checked under a blind hint with spot's state changed
        self.launch_held = 0  # looks checked under a launch's hint while it paid its changeover

    def decide(self, job: JobSpec, obs: Observation) -> Decision:
        self.calls += 1
        decision = self.policy.decide(job, obs)
        if self.promise is not None:
            o, d, k, at, blind = self.promise
            j = round((obs.now - o.now) / job.tick_s)
            steady = (  # (a launch's promise is for the capacity it launched)
                obs.capacity is d.capacity
                and obs.preemptions == o.preemptions
                and (blind or obs.spot_available == o.spot_available)
                and obs.overlap == o.overlap
            )
            if steady and 0 < j <= k and self.calls == at + j:
                key = (decision.capacity, decision.rule, decision.look)
                assert key == (d.capacity, d.rule, d.look), (self.name, o, obs, j, k, blind)
                self.blind_held += blind and obs.spot_available != o.spot_available
                self.launch_held += o.capacity is Capacity.NONE and obs.changeover_left_s > 0
            else:
                self.promise = None
        if self.promise is None:
            k = self.policy.steady(job, obs, decision)
            if k > 0:
                blind = obs.capacity is Capacity.ON_DEMAND and self.policy.blind(job, obs, decision)
                self.promise = (obs, decision, k, self.calls, blind)
        return decision

    def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
        k = self.policy.steady(job, obs, decision)
        if k > 0:
            self.promise = None  # the replay skips; the promise is checked by the rows then
        return k

    def blind(self, job: JobSpec, obs: Observation, decision: Decision) -> bool:
        return self.policy.blind(job, obs, decision)


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    rng = np.random.default_rng(19)
    return [_trace(rng, i) for i in range(24)]


@pytest.mark.parametrize("observe", OBSERVE)
@pytest.mark.parametrize("policy", CHEAP)
def test_fast_forward_is_exact(traces, policy, observe) -> None:
    skipped = _same(policy, traces, _jobs(), observe)
    if policy != "slack_reserve":  # the baselines give hints: looks were skipped
        assert skipped > 0


@pytest.mark.parametrize("observe", OBSERVE)
def test_fast_forward_is_exact_for_every_registered_policy(traces, observe) -> None:
    """Policies without a hint (the default, 0) replay exactly as before, look by look."""
    jobs = [JobSpec(10 * HOUR, 13 * HOUR, 720.0, tick_s=TICK)]
    for name in policy_names():
        if name not in CHEAP:
            _same(name, traces[:6], jobs, observe)


def test_hints_hold_look_by_look(traces) -> None:
    """Replayed with every look taken, each hint a baseline gives holds at the looks after it,
    a blind one across changes of spot's state too."""
    for name in ("greedy", "uniform_progress", "last_attempt_on_demand", "on_demand"):
        held = launched = 0
        for observe in OBSERVE:
            p = _Counting(get_policy(name))
            for job in _jobs():
                for tr in traces[:12]:
                    p.promise = None
                    replay(p, tr, job, observe=observe, fast=False)  # type: ignore[arg-type]
            held += p.blind_held
            launched += p.launch_held
        assert held > 0, name  # blind hints were tested where spot did change
        if name != "on_demand":  # launches' hints were tested through their changeovers
            assert launched > 0, name


def test_blind_hints_jump_over_changes_of_spot() -> None:
    """On on-demand for good, an oracle replay does not look at each change of spot's state;
    a policy that gives no blind hint is looked at each time (the rows are the same)."""

    class NoBlind(Policy):
        name = "greedy_no_blind"

        def __init__(self) -> None:
            self.inner = get_policy("greedy")

        def decide(self, job: JobSpec, obs: Observation) -> Decision:
            return self.inner.decide(job, obs)

        def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
            return self.inner.steady(job, obs, decision)

    flicker = np.array([i % 3 == 0 for i in range(200)])  # spot comes and goes every tick
    tr = Trace("flicker", TICK, flicker)
    job = JobSpec(10 * HOUR, 10 * HOUR + 1200.0, 600.0, tick_s=TICK)  # on-demand from the start
    blind, plain = _Counting(get_policy("greedy")), _Counting(NoBlind())  # type: ignore[arg-type]
    a = replay(blind, tr, job, observe="oracle")  # type: ignore[arg-type]
    b = replay(plain, tr, job, observe="oracle")  # type: ignore[arg-type]
    assert a.row() | {"policy": ""} == b.row() | {"policy": ""}
    assert a.ledger is not None and b.ledger is not None
    assert a.ledger.segments == b.ledger.segments
    assert a.on_demand_hours > 9.9 and a.met
    assert blind.calls <= 3 < 40 < plain.calls


def test_the_module_switch_and_the_default() -> None:
    tr = Trace("x", TICK, np.array([True] * 50 + [False] * 30 + [True] * 100))
    job = JobSpec(10 * HOUR, 14 * HOUR, 720.0, tick_s=TICK)
    counted = _Counting(get_policy("greedy"))
    replay(counted, tr, job, observe="oracle")  # type: ignore[arg-type]
    fast_calls = counted.calls
    old = engine.FAST
    try:
        engine.FAST = False
        counted.calls = 0
        replay(counted, tr, job, observe="oracle")  # type: ignore[arg-type]
    finally:
        engine.FAST = old
    assert fast_calls < 10 < counted.calls


def test_the_observation_builder_equals_the_class() -> None:
    """The builder the replay calls at every look makes the observation the class makes, and
    is the fast one (not the class itself, its fallback where the fields change)."""
    values = (1.0, 2.0, Capacity.SPOT, True, 3.0, 4, 5.0, 6.0, 7.0, None, 8.0, False, "probe", True)
    built = observation(*values)
    assert built == Observation(*values) and type(built) is Observation
    assert observation is not Observation
    assert len(fields(Observation)) == len(values)


@pytest.mark.parametrize("observe", (*OBSERVE, "cluster-bbm"))
def test_figures_without_a_ledger_equal_the_ledgers_to_the_last_bit(traces, observe) -> None:
    """A sweep keeps no ledger (``keep_ledger=False``): its figures, summed segment by segment,
    equal those read from the ledger, unrounded, probes and overlaps included."""
    figures = (
        "cost",
        "met",
        "spot_hours",
        "on_demand_hours",
        "spot_work_hours",
        "on_demand_work_hours",
        "preemptions",
        "finished_h",
        "probes",
        "probe_cost",
        "overlap_hours",
    )
    probed = 0
    for name in (*CHEAP, "deadline_aware"):
        for job in _jobs()[:4]:
            for tr in traces[:12]:
                kept = replay(get_policy(name), tr, job, observe=observe)
                lean = replay(get_policy(name), tr, job, observe=observe, keep_ledger=False)
                assert lean.ledger is None and kept.ledger is not None
                for f in figures:
                    assert getattr(lean, f) == getattr(kept, f), (name, tr.name, f)
                assert kept.cost == kept.ledger.cost and kept.probe_cost == kept.ledger.probe_cost
                probed += kept.probe_cost > 0
    if observe != "oracle":
        assert probed > 0  # probes found and not used were billed, and summed alike
