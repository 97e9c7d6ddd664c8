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

Each also offers a replay the fast-forward hint of :meth:`Policy.steady` (a replay skips the
looks it is certain of). While the capacity held runs, work left and intervals left fall by
one a tick together, so every comparison of ``ticks_needed`` with ``ticks_left`` keeps its
outcome; while idle, only the intervals left fall, and the Uniform Progress line rises by
``C / R`` a tick: the look at which a rule changes is counted in whole numbers (only where
:func:`~airflow_spot.policy.base.exact` says the arithmetic is; otherwise no hint).
``ticks_needed`` counts the job's reserve for application failures as the safety net does, so
no hint counts past the look at which the net would take over (a replay's reserve is 0: the
hints, and the paper's rules, are as they always were).
"""

from __future__ import annotations

import math

from airflow_spot.policy.base import (
    ALWAYS,
    EPS,
    Policy,
    ask_spot,
    deadline_od,
    exact,
    own_rules,
    register,
    ticks_left,
    ticks_needed,
)
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation

OD_ONLY = Decision(Capacity.ON_DEMAND, "od_only")
SPOT_UP = Decision(Capacity.SPOT, "spot_up")
STAY_SPOT = Decision(Capacity.SPOT, "stay_spot")

DEFAULT_PREEMPTION_BUDGET = 3
# the rules of an on-demand decision taken because the deadline is at risk (the baselines' own
# and the safety net's, with or without a reserve for application failures)
SAFETY = frozenset({"safety", "safety_reserve", "safety_acquire"})


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

    def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
        if not own_rules(self, OnDemand) or not _held(job, obs, decision):
            return 0
        return ALWAYS  # on-demand at every look

    def blind(self, job: JobSpec, obs: Observation, decision: Decision) -> bool:
        return own_rules(self, OnDemand)  # never reads spot


@register
class Greedy(Policy):
    """Spot whenever it is up, idle when it is down, on-demand once the slack is gone."""

    name = "greedy"

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        if _slack_gone(job, obs):
            if obs.capacity is Capacity.SPOT and obs.spot_available is not False:
                return STAY_SPOT
            return deadline_od(job, obs, 2)  # (a spot request still waiting while spot is down too)
        if obs.spot_available is None:
            return ask_spot(obs)
        return SPOT_UP if obs.spot_available else _wait(job, obs)

    def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
        if not own_rules(self, Greedy) or not exact(job, obs):
            return 0
        if _launch(obs, decision):
            return _launch_hint(job, obs)
        if not _held(job, obs, decision):
            return 0
        if obs.capacity is Capacity.NONE:  # waiting (spot seen down) until the slack is gone
            if obs.spot_available is not False:
                return 0
            return ticks_left(job, obs) - ticks_needed(job, obs, 2) - 1
        if decision.rule == "spot_up" and _launching(obs) and not _slack_kept(job, obs):
            return 0  # the first look's progress, less than a tick, may find the slack gone
        # running on spot (spot_up / stay_spot) or on-demand (safety): the comparisons that
        # chose it keep their outcome while work left and intervals left fall together (a
        # slack gone stays gone even over a changeover's end; the safety net lets a spot
        # instance past its changeover run on)
        return ALWAYS

    def blind(self, job: JobSpec, obs: Observation, decision: Decision) -> bool:
        # on on-demand the slack is gone for good (only the "safety" rules lead there), and
        # with the slack gone, on-demand held stays on-demand whatever spot does
        return own_rules(self, Greedy) and obs.capacity is Capacity.ON_DEMAND


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
        if obs.capacity is not Capacity.SPOT and _slack_gone(job, obs):
            choice = deadline_od(job, obs, 2)
        return choice

    def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
        if not own_rules(self, UniformProgress):
            return 0
        if _launch(obs, decision):
            return _launch_hint(job, obs) if exact(job, obs) else 0
        if not _held(job, obs, decision):
            return 0
        cap = obs.capacity
        if cap is Capacity.SPOT:  # spot_up while spot is up; the safety net keeps it
            return ALWAYS
        if not exact(job, obs):
            return 0
        w, r, d, g = int(job.work_s), int(job.deadline_s), int(job.changeover_s), int(job.tick_s)
        now, done = int(obs.now), int(obs.done_s)
        if cap is Capacity.NONE:  # waiting (spot seen down) on or above the line
            if obs.spot_available is not False:
                return 0
            on_line = (done * r - now * w) // (g * w)  # looks with (now + j g) C / R <= done
            return min(on_line, ticks_left(job, obs) - ticks_needed(job, obs, 2) - 1)
        if decision.rule in SAFETY:  # work left and intervals left fall together
            return ALWAYS
        if _launching(obs) and (decision.look or not _slack_kept(job, obs)):
            return 0  # the first look's progress, less than a tick, may change either
        # hysteresis: on on-demand, progress gains (1 - C / R) tick a tick on the line two
        # changeovers ahead (less at the first look while launching: still behind it then
        # too); the look flag is whether it is past that line
        if decision.look or r == w:
            return ALWAYS  # past it (and staying past), or the line keeps pace
        return ((now + 2 * d) * w - done * r) // (g * (r - w))  # looks still behind it

    def blind(self, job: JobSpec, obs: Observation, decision: Decision) -> bool:
        # on on-demand, "safety" (the slack gone for good) and "hysteresis" while still behind
        # the line two changeovers ahead (``look`` unset) do not read spot: spot up or down,
        # up or unseen, they stay on on-demand; past that line, spot up means a return
        return (
            own_rules(self, UniformProgress)
            and obs.capacity is Capacity.ON_DEMAND
            and (decision.rule in SAFETY or (decision.rule == "hysteresis" and not decision.look))
        )


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

    def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
        if not own_rules(self, LastAttemptOnDemand):
            return 0
        if _launch(obs, decision):
            return _launch_hint(job, obs) if exact(job, obs) else 0
        if not _held(job, obs, decision):
            return 0
        budget = DEFAULT_PREEMPTION_BUDGET if job.max_preemptions is None else job.max_preemptions
        if obs.preemptions >= budget or obs.capacity is Capacity.SPOT:
            return ALWAYS  # budget_spent for good; spot_up, which the safety net keeps
        if not exact(job, obs):
            return 0
        if obs.capacity is Capacity.NONE:  # waiting (spot seen down) until the net catches it
            if obs.spot_available is not False:
                return 0
            return ticks_left(job, obs) - ticks_needed(job, obs) - 1
        return ALWAYS  # the safety net's on-demand: work and intervals left fall together

    def blind(self, job: JobSpec, obs: Observation, decision: Decision) -> bool:
        # on on-demand: budget_spent reads only the preemptions; the safety net's on-demand
        # stays whatever spot does (work and intervals left fall together)
        return own_rules(self, LastAttemptOnDemand) and obs.capacity is Capacity.ON_DEMAND


def _slack_gone(job: JobSpec, obs: Observation) -> bool:
    """``ticks_needed(job, obs, 2) >= ticks_left(job, obs)``: the work plus two changeovers
    (and the reserve for application failures, and a gang's acquisition margin) no longer fits in the intervals left (inlined:
    a replay asks at every look)."""
    tick = job.tick_s
    need = job.work_s - obs.done_s + 2 * job.changeover_s + job.failure_reserve_s + job.acquire_s
    return math.ceil(need / tick) >= math.floor((job.deadline_s - obs.now) / tick)


def _held(job: JobSpec, obs: Observation, decision: Decision) -> bool:
    """The steady states the baselines' hints cover: the capacity held is kept, with less
    than a tick of a changeover left on it (over by the next look)."""
    return decision.capacity is obs.capacity and (
        obs.capacity is Capacity.NONE or obs.changeover_left_s < job.tick_s
    )


def _launch(obs: Observation, decision: Decision) -> bool:
    """Spot launched from idle at this look, spot seen up (``spot_up``)."""
    return (
        obs.capacity is Capacity.NONE
        and decision.capacity is Capacity.SPOT
        and decision.rule == "spot_up"
        and obs.spot_available is True
    )


def _launch_hint(job: JobSpec, obs: Observation) -> int:
    """Looks certain after a launch of spot from idle (:meth:`Policy.steady`, exact arithmetic
    only): while spot stays up, each look gets ``spot_up`` again, where the slack outlasts the
    changeover. Over the ``c`` looks that pay it, progress is at least none and the intervals
    left fall by one a look, so with the work plus two changeovers fitting in ``c`` intervals
    fewer than are left, neither the slack rule nor the safety net (which a spot instance
    still launching does not escape) fires; after them, work left and intervals left fall
    together."""
    paying = math.ceil(job.changeover_s / job.tick_s)
    return ALWAYS if ticks_needed(job, obs, 2) < ticks_left(job, obs) - paying else 0


def _launching(obs: Observation) -> bool:
    """A changeover is still being paid on the capacity held."""
    return obs.capacity is not Capacity.NONE and obs.changeover_left_s >= EPS


def _slack_kept(job: JobSpec, obs: Observation) -> bool:
    """The slack is not gone at the next look whatever progress this interval makes: the work
    plus two changeovers fits in one interval fewer than are left (exact arithmetic only)."""
    return ticks_needed(job, obs, 2) < ticks_left(job, obs) - 1
