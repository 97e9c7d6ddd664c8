"""A gang's fields of the job (:attr:`JobSpec.nodes`, :attr:`JobSpec.acquire_s`): checked
with their fix named, and the shared safety net keeps the on-demand acquisition margin (and
keeps what it always kept without one)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_spot.exceptions import InfeasibleDeadline, InvalidJobSpec
from airflow_spot.policy import HOUR, Capacity, Decision, JobSpec, Observation, get_policy
from airflow_spot.policy.base import kept_s, safety_net, ticks_needed

TICK = 300.0
JOB = JobSpec(10 * HOUR, 14 * HOUR, 720.0, tick_s=TICK)


def test_the_gang_fields_default_to_one_node_and_are_checked() -> None:
    assert (JOB.nodes, JOB.acquire_s) == (1, 0.0)
    assert JobSpec(10 * HOUR, 14 * HOUR, 720.0, 0.9, 3.0, TICK, None, 0.0, 4, 1200.0).nodes == 4
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(InvalidJobSpec) as e:
            replace(JOB, nodes=bad)  # type: ignore[arg-type]
        assert e.value.field == "nodes"
    for bad in (-1.0, float("nan"), float("inf"), None):
        with pytest.raises(InvalidJobSpec) as e:
            replace(JOB, acquire_s=bad)  # type: ignore[arg-type]
        assert e.value.field == "acquire_s"
    with pytest.raises(InfeasibleDeadline, match="to acquire 4 on-demand nodes"):
        JobSpec(10 * HOUR, 10.3 * HOUR, 720.0, nodes=4, acquire_s=1200.0)


def test_without_a_margin_the_net_keeps_what_it_always_kept() -> None:
    for r in (0.0, 1234.5, 2 * HOUR):
        job = replace(JOB, failure_reserve_s=r)
        assert kept_s(job) == r  # bit for bit: r + 0.0
        obs = Observation(now=3 * HOUR, done_s=1.5 * HOUR)
        need = job.work_s - obs.done_s + 2 * job.changeover_s + r
        assert ticks_needed(job, obs, 2) == -(-need // TICK)


@pytest.mark.parametrize("margin_ticks", [1, 4, 12])
def test_the_net_goes_on_demand_the_margin_earlier(margin_ticks: int) -> None:
    """The last look the net lets spot wait moves earlier by exactly the margin."""
    wait = Decision(Capacity.NONE, "spot_down_wait", (0.0,), look=True)

    def last_wait(job: JobSpec) -> float:
        t = 0.0
        while True:
            obs = Observation(now=t + TICK, done_s=0.0, spot_available=False)
            if safety_net(job, obs, wait).capacity is Capacity.ON_DEMAND:
                return t
            t += TICK

    gang = replace(JOB, nodes=4, acquire_s=margin_ticks * TICK)
    assert last_wait(JOB) - last_wait(gang) == margin_ticks * TICK
    late = Observation(now=last_wait(gang) + TICK, done_s=0.0, spot_available=False)
    d = safety_net(gang, late, wait)
    assert (
        d.rule == "safety_acquire" and f"{margin_ticks * TICK / HOUR:.2f} h to acquire" in d.reason
    )
    # a reserve for application failures is named first; both are kept, and both said
    both = replace(gang, failure_reserve_s=600.0)
    d = safety_net(both, late, wait)
    assert d.rule == "safety_reserve" and "0.17 h kept for application failures" in d.reason
    assert f"the {margin_ticks * TICK / HOUR:.2f} h to acquire the gang's" in d.reason
    assert kept_s(both) == 600.0 + margin_ticks * TICK


def test_every_policy_meets_the_deadline_with_the_margin_kept() -> None:
    """Spot never up; on-demand takes the margin to come: every policy still finishes."""
    import numpy as np

    from airflow_spot.simulate.engine import replay
    from airflow_spot.simulate.gang import Acquire, Gang
    from airflow_spot.simulate.traces import Trace

    dead = Trace("dead", TICK, np.zeros(200, dtype=bool))
    job = replace(JOB, nodes=4, acquire_s=6 * TICK)
    for name in ("greedy", "uniform_progress", "deadline_aware", "slack_reserve"):
        for observe in ("oracle", "cluster"):
            r = replay(
                get_policy(name), dead, job, observe=observe, gang=Gang(acquire=Acquire(6 * TICK))
            )
            assert r.met, (name, observe)


def test_a_gang_plans_on_the_gang_prior_and_one_node_on_its_own() -> None:
    """A gang's runs are those of all its nodes at once (shorter than one node's): its plan is
    solved on the ``gang`` prior; a job of one node keeps ``default``; ``@<prior>`` names the
    prior of both."""
    from airflow_spot.policy.deadline_aware import DeadlineAware, Params

    policy = get_policy("deadline_aware")
    assert isinstance(policy, DeadlineAware)
    obs = Observation(now=HOUR, done_s=0.5 * HOUR, spot_available=False)
    one, gang = policy.plan(JOB)[1], policy.plan(replace(JOB, nodes=4))[1]
    assert "default" not in gang.source and "aws-p3-4node" in gang.source
    assert "aws-p3-4node" not in one.source and policy.model is policy.model_for(1)
    # a run of all 4 nodes is expected to be shorter than one node's run
    assert gang.expected_left_s(True, 0) < one.expected_left_s(True, 0)
    policy.choose(replace(JOB, nodes=4), obs)  # a decision on the gang's plan
    named = get_policy("deadline_aware@aws-p3")
    assert isinstance(named, DeadlineAware)
    assert named.model_for(4) is named.model_for(1)
    with pytest.raises(ValueError, match="unknown availability prior 'nope'"):
        DeadlineAware(Params(gang_prior="nope"))


def test_deadline_aware_plans_to_the_deadline_less_what_the_net_keeps() -> None:
    """With an acquisition margin (or a failure reserve) the net keeps, deadline_aware decides
    as for the same job due that much earlier: its plan never counts on slack the net would
    not let it spend (planned to the job's own deadline it stayed on spot, then the net threw
    it on-demand late)."""
    kept = 2 * HOUR
    gang = JobSpec(24 * HOUR, 32 * HOUR, 720.0, tick_s=600.0, nodes=4, acquire_s=kept)
    early = replace(gang, deadline_s=gang.deadline_s - kept, acquire_s=0.0)
    failures = replace(gang, acquire_s=0.0, failure_reserve_s=kept)
    policy = get_policy("deadline_aware")
    differ = 0
    for now_h in (1.0, 8.0, 16.0, 22.0, 26.0):
        for slack_h in (0.4, 0.9, 1.5, 2.5, 4.0):
            done = gang.work_s - (early.deadline_s - now_h * HOUR - slack_h * HOUR)
            if not 0 <= done < gang.work_s:
                continue
            for cap in Capacity:
                for age_h in (0.1, 3.0):
                    obs = Observation(
                        now_h * HOUR, done, cap, True, spot_age_s=age_h * HOUR, spot_seen=True
                    )
                    want = policy.decide(early, obs).capacity
                    assert policy.decide(gang, obs).capacity is want, (now_h, slack_h, cap)
                    assert policy.decide(failures, obs).capacity is want
                    full = replace(early, deadline_s=gang.deadline_s)  # no margin at all
                    differ += policy.decide(full, obs).capacity is not want
    assert differ > 0  # the margin changes decisions: the check above can fail
