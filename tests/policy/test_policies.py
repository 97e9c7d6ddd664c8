"""Policies: the registry, each policy's rules in named situations, and the shared safety net."""

from __future__ import annotations

import os

import numpy as np
import pytest

from airflow_spot.exceptions import UnknownPolicy
from airflow_spot.policy import (
    HOUR,
    Capacity,
    Decision,
    JobSpec,
    Observation,
    get_policy,
    policy_names,
)
from airflow_spot.policy.base import Policy, register, safety_net
from airflow_spot.simulate import Trace, replay

NONE, SPOT, OD = Capacity.NONE, Capacity.SPOT, Capacity.ON_DEMAND
JOB = JobSpec(work_s=48 * HOUR, deadline_s=60 * HOUR, changeover_s=0.2 * HOUR)
SAFE = [
    "on_demand",
    "greedy",
    "uniform_progress",
    "last_attempt_on_demand",
    "slack_reserve",
    "deadline_aware",
]


def obs(now_h: float, done_h: float, cap: Capacity = NONE, spot: bool = True, **kw) -> Observation:
    return Observation(
        now=now_h * HOUR, done_s=done_h * HOUR, capacity=cap, spot_available=spot, **kw
    )


def test_registry_lists_every_policy() -> None:
    """All six policies are registered by name."""
    assert set(SAFE) <= set(policy_names())


def test_unknown_policy_names_the_choices() -> None:
    """An unknown name raises UnknownPolicy naming the field and the valid names."""
    with pytest.raises(
        UnknownPolicy, match=r"policy: unknown policy 'cheapest'; choose one of .*deadline_aware"
    ):
        get_policy("cheapest")


@pytest.mark.parametrize(
    ("policy", "observation", "expected"),
    [
        ("on_demand", obs(0, 0), OD),
        ("greedy", obs(1, 1), SPOT),
        ("greedy", obs(1, 1, spot=False), NONE),
        ("greedy", obs(11.9, 0.5, spot=False), OD),  # slack gone: on-demand for good
        ("greedy", obs(11.9, 0.5, SPOT, spot=False), OD),  # so too a spot request still waiting
        ("uniform_progress", obs(10, 7.5, spot=False), OD),  # behind the line 8 h: catch up
        ("uniform_progress", obs(10, 8.5, spot=False), NONE),  # ahead of the line 8 h: wait
        ("uniform_progress", obs(10, 8.1, OD, spot=True), OD),  # hysteresis: not ahead at t + 2d
        ("uniform_progress", obs(10, 9, OD, spot=True), SPOT),
        ("last_attempt_on_demand", obs(5, 4, preemptions=2), SPOT),
        ("last_attempt_on_demand", obs(5, 4, preemptions=3), OD),
        ("slack_reserve", obs(1, 1, spot=False), NONE),  # slack 11 h well above the reserve
        ("slack_reserve", obs(30, 22, spot=False), OD),  # slack 4 h below the reserve
        ("slack_reserve", obs(30, 22, OD, spot=False), OD),  # never leave on-demand while down
        ("slack_reserve", obs(10, 9, OD, spot=True, spot_age_s=3600), SPOT),
        ("slack_reserve", obs(10, 9, OD, spot=True, spot_age_s=0), OD),  # let spot settle
        ("slack_reserve", obs(40, 47.5, OD, spot=True, spot_age_s=3600), OD),  # finish
        ("deadline_aware", obs(1, 1, spot=False), NONE),  # a fresh outage, 12 h of slack: wait
        ("deadline_aware", obs(1, 1), SPOT),
        ("deadline_aware", obs(30, 20.5, spot=False), OD),  # slack 2.5 h: under the floor 2.6 h
        ("deadline_aware", obs(30, 22, OD, spot=False), OD),  # never leave on-demand while down
        ("deadline_aware", obs(10, 9, OD, spot=True, spot_age_s=3600), SPOT),  # settled: return
        # spot just back, slack 4 h: return after long runs, not in a streak of short ones
        ("deadline_aware", obs(30, 22, OD, spot=True, last_up_s=7200, last_down_s=7200), SPOT),
        ("deadline_aware", obs(30, 22, OD, spot=True, last_up_s=1200, last_down_s=600), OD),
        ("deadline_aware", obs(50, 40, SPOT, spot=True), SPOT),  # keep a running instance
        ("deadline_aware", obs(58, 46.2, spot=False), OD),  # 0.2 h of slack: no more waiting
    ],
)
def test_policy_rules(policy: str, observation: Observation, expected: Capacity) -> None:
    """Each policy picks the capacity its rule names in that situation."""
    assert get_policy(policy).decide(JOB, observation).capacity is expected


def test_done_job_idles() -> None:
    """Once the work is done every policy releases capacity."""
    for name in SAFE:
        assert get_policy(name).decide(JOB, obs(50, 48, SPOT)).capacity is NONE


def test_every_decision_has_a_readable_reason() -> None:
    """Every decision's reason is a sentence with its figures filled in."""
    for name in SAFE:
        for o in (
            obs(1, 1),
            obs(1, 1, spot=False),
            obs(30, 22, spot=False),
            obs(11.5, 0.5, spot=False),
        ):
            reason = get_policy(name).decide(JOB, o).reason
            assert len(reason) > 10 and "{" not in reason


def test_safety_net_overrides_a_reckless_choice() -> None:
    """A policy that always waits is forced to on-demand once only on-demand can still finish."""

    class AlwaysWait(Policy):
        name = "test_always_wait"

        def choose(self, job, o):
            from airflow_spot.policy.model import Decision

            return Decision(NONE, "spot_down_wait", (0.0,))

    d = AlwaysWait().decide(JOB, obs(11.9, 0, spot=False))
    assert d.capacity is OD and d.rule == "safety"


def _random_trace(rng: np.random.Generator, p_up: float, mean_run: float, n: int = 554) -> Trace:
    avail = np.empty(n, dtype=bool)
    state, i = rng.random() < p_up, 0
    while i < n:
        run = max(1, int(rng.exponential(mean_run if state else mean_run * (1 - p_up) / p_up)))
        avail[i : i + run] = state
        i += run
        state = not state
    return Trace("random", 600.0, avail)


@pytest.mark.parametrize("name", SAFE)
def test_no_safe_policy_misses_a_feasible_deadline(name: str) -> None:
    """On 150 random markets (from always-up to nearly-always-down) and tight to loose deadlines,
    every policy on the safety net meets the deadline."""
    rng = np.random.default_rng(7)
    # 15 job shapes, drawn at random: their plans are kept on disk (more than memory's 8)
    policy = get_policy(name, plan_cache=os.environ["AIRFLOW__SPOT_TRAINING__PLAN_CACHE"])
    for k in range(150):
        trace = _random_trace(rng, p_up=rng.uniform(0.02, 0.98), mean_run=rng.uniform(1, 30))
        job = JobSpec(
            work_s=48 * HOUR,
            deadline_s=float(rng.choice([48.5, 50, 52, 60, 80])) * HOUR,
            changeover_s=float(rng.choice([0.05, 0.2, 0.4])) * HOUR,
            max_preemptions=int(rng.integers(0, 5)),
        )
        result = replay(policy, trace, job)
        assert result.met, f"{name} missed on random market {k} ({job})"


def test_unsafe_baseline_can_miss() -> None:
    """Without the safety net a policy that waits for spot misses the deadline on a dead market."""

    @register
    class Reckless(Policy):
        name = "test_reckless"
        unsafe = True

        def choose(self, job, o):
            from airflow_spot.policy.model import Decision

            return Decision(SPOT if o.spot_available else NONE, "spot_up")

    result = replay(Reckless(), Trace("dead", 600.0, np.zeros(554, dtype=bool)), JOB)
    assert not result.met


def test_the_baselines_fallback_says_it_keeps_two_changeovers() -> None:
    """Greedy and uniform_progress go on-demand while the slack still covers the net's one
    changeover: their reason names the two they keep, in whole looks (the gang demo printed a
    slack of 59.08 h that "would not cover" 45.14 h, for one changeover where two were kept)."""
    job = JobSpec(10 * HOUR, 12 * HOUR, 1800.0, tick_s=600.0)
    look = obs(0.95, 0, spot=False)  # 1.05 h of slack: two changeovers and a look do not fit
    for name in ("greedy", "uniform_progress"):
        d = get_policy(name).decide(job, look)
        assert d.capacity is OD and d.rule == "safety", (name, d)
        assert "would not cover 2 changeovers (1.00 h)" in d.reason, d.reason
        assert "counted in whole looks of 0.17 h" in d.reason, d.reason
    net = safety_net(job, look, Decision(NONE, "wait"))
    assert net.capacity is NONE  # the net keeps one changeover: that still fits


@pytest.mark.parametrize("seen", [True, False], ids=["spot-seen-down", "spot-unseen"])
def test_deadline_aware_stops_probing_where_no_return_can_pay(seen: bool) -> None:
    """On on-demand near the end, where the plan would take no spot run however long (the work
    left is about one changeover), a probe could only find capacity to give back, billed: the
    policy stays on on-demand and stops looking. A little earlier it still looks."""
    gang = JobSpec(48 * HOUR, 52 * HOUR, 0.2 * HOUR, 0.9731, 3.06, 300.0, nodes=4,
                   acquire_s=300.0, make_before_break=True)  # fmt: skip
    kw = {} if seen else {"spot_seen": False, "spot_unseen_s": 600.0, "spot_age_s": 1800.0}
    spot = False if seen else None
    policy = get_policy("deadline_aware")
    end = policy.decide(gang, obs(50, 47.8, OD, spot=spot, **kw))  # 0.2 h of work left
    assert (end.capacity, end.look) == (OD, False)
    assert "no spot run, however long, would pay a return now" in end.reason
    earlier = policy.decide(gang, obs(50, 47.6, OD, spot=spot, **kw))  # 0.4 h left
    assert earlier.look or earlier.capacity is SPOT
    assert "however long" not in earlier.reason
