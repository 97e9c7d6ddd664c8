"""The baselines: on-demand only, the paper's Greedy and Uniform Progress, and Flyte's rule.

Greedy and Uniform Progress follow *Can't Be Late* (Wu et al., NSDI'24) and its simulator
rule for rule, so that the replay matches the published per-window results:

* Greedy: ``spot (available) -> idle (spot down) -> ... -> on-demand for good`` once the
  work plus two changeovers no longer fits in the intervals left.
* Uniform Progress: keep progress on or above the line ``C * t / R``. ``spot -> idle ->
  on-demand (behind the line) -> spot (available again, and ahead of the line two changeovers
  from now)``; on-demand also when the work plus two changeovers reaches the intervals left.
* ``last_attempt_on_demand`` (Flyte's ``interruptible-failure-threshold``): spot while the
  preemption budget lasts, idle while spot is down, then on-demand for the rest.

Where spot's state is not seen (``spot_available is None``, on a cluster) each follows one
rule: **ask for spot when the oracle version would use spot if it were up** (a request,
granted at once if spot is there; on-demand, if held, trains on until spot is ready), and
otherwise do what it does when spot is down. While it waits for spot, or sits on on-demand
ready to return, it keeps a request or probe waiting (``look``), so that it sees spot come
back at the next look, as the oracle would. Under the oracle every look sees spot and these
rules never fire: the paper's results are unchanged.
"""

from __future__ import annotations

from airflow_spot.policy.base import Policy, ask_spot, register, ticks_left, ticks_needed
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation

OD_ONLY = Decision(Capacity.ON_DEMAND, "od_only")
SPOT_UP = Decision(Capacity.SPOT, "spot_up")
STAY_SPOT = Decision(Capacity.SPOT, "stay_spot")

DEFAULT_PREEMPTION_BUDGET = 3


def _wait(job: JobSpec, obs: Observation) -> Decision:
    return Decision(
        Capacity.NONE,
        "spot_down_wait",
        ((job.deadline_s - obs.now - (job.work_s - obs.done_s)) / HOUR,),
        look=True,
    )


@register
class OnDemand(Policy):
    """``on-demand`` from start to end: the cost every saving is measured against."""

    name = "on_demand"

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        return OD_ONLY


@register
class Greedy(Policy):
    """Spot whenever it is up, idle when it is down, on-demand once the slack is gone."""

    name = "greedy"

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        if ticks_needed(job, obs, 2) >= ticks_left(job, obs):
            if obs.capacity is Capacity.SPOT and obs.spot_available is not False:
                return STAY_SPOT
            return _safety_od(job, obs)  # (a spot request still waiting while spot is down too)
        if obs.spot_available is None:
            return ask_spot(obs)
        return SPOT_UP if obs.spot_available else _wait(job, obs)


@register
class UniformProgress(Policy):
    """The paper's Uniform Progress: stay at or above the line ``C * t / R``."""

    name = "uniform_progress"

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        c, r, t = job.work_s, job.deadline_s, obs.now
        line = t * c / r
        if obs.spot_available:
            choice = SPOT_UP
        elif obs.spot_available is None and obs.capacity is not Capacity.ON_DEMAND:
            choice = ask_spot(obs)
        elif line - obs.done_s > 0:
            choice = Decision(Capacity.ON_DEMAND, "behind", (obs.done_s / HOUR, line / HOUR))
        else:
            choice = _wait(job, obs)
        if obs.capacity is Capacity.ON_DEMAND:
            ahead_line = (t + 2 * job.changeover_s) * c / r
            would_return = ahead_line - obs.done_s < 0  # it would return if spot were up
            if obs.spot_available is None and would_return:
                choice = ask_spot(obs)
            elif not obs.spot_available or not would_return:
                choice = Decision(
                    Capacity.ON_DEMAND,
                    "hysteresis",
                    ((ahead_line - line) / HOUR,),
                    look=would_return,
                )
        if obs.capacity is not Capacity.SPOT and ticks_needed(job, obs, 2) >= ticks_left(job, obs):
            choice = _safety_od(job, obs)
        return choice


@register
class LastAttemptOnDemand(Policy):
    """Flyte's rule: spot until the preemption budget is spent, then on-demand for good."""

    name = "last_attempt_on_demand"

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        budget = DEFAULT_PREEMPTION_BUDGET if job.max_preemptions is None else job.max_preemptions
        if obs.preemptions >= budget:
            return Decision(Capacity.ON_DEMAND, "budget_spent", (obs.preemptions, budget))
        if obs.spot_available is None:
            return ask_spot(obs)
        return SPOT_UP if obs.spot_available else _wait(job, obs)


def _safety_od(job: JobSpec, obs: Observation) -> Decision:
    return Decision(
        Capacity.ON_DEMAND,
        "safety",
        ((job.deadline_s - obs.now - (job.work_s - obs.done_s)) / HOUR,),
    )
