"""``deadline_aware``: our policy. A plan solved by dynamic programming, with a floor.

At every look the policy reads a precomputed plan (:mod:`.plan`): for the time left, the
slack (time left minus work left), the capacity held and the changeover still to pay on it,
whether spot is up, how long its current run has lasted and whether the last spot run and
the last outage were short, is the cheap choice (spot when it is up, waiting when it is
down) cheaper in expectation than on-demand? The plan is solved once per job shape by
stochastic dynamic programming over a semi-Markov model of spot availability
(:mod:`.hazard`): young runs of spot (and young outages) end much more often than old ones,
and short runs come in streaks, so the plan waits out outages that are likely to end soon,
starts spot that is likely to last, skips spot that flickers, and pays for on-demand when
the slack no longer covers the expected wait.

Rules sit on top, because a market can differ from the one the model was fitted on (a
day-long outage, a week of short runs):

* **floor**: while spot is down, never let the slack fall below ``f`` times the
  uniform-progress reserve (``S0 * (R - t) / R``) plus ``floor`` changeovers; go on-demand
  there. Slack spent early cannot be used later, when spot may run for hours.
* never leave on-demand while spot is down (each such thrash pays two changeovers), and
  optionally (**settle**, off by default) only once spot has been up ``settle`` changeovers
  less one look.

The shared safety net still guarantees the deadline whenever it is feasible. Nothing was
fitted on a tick the benchmark scores: ``benchmarks/fit_priors.py`` fits the prior on the
aws-p3-2month and gcp-h100-2week traces and on the 14.8 days of the us-west-2a trace after
the last of the paper's windows; ``benchmarks/fit_deadline_aware.py`` replays 20 candidates
(f x settle) on 440 random 92 h windows of those three, each family with a prior fitted
without it, and keeps the best worst cell among those within 0.25 points of the best mean
over the 18 cells: f=0.4, settle=0 (4.58 % below UP there, every cell at least 3.41 % below;
fitted in sample it picks the same).

The plan is solved for the job as the shared safety net will let it run: to the deadline
less what the net keeps (:func:`~airflow_spot.policy.base.kept_s`: a gang's on-demand
acquisition margin, the live operator's failure reserve), and with returns to spot priced
as they happen (``job.make_before_break``: on-demand trains on while spot launches).

A gang (``job.nodes > 1``) plans on its own prior, ``gang``: a gang runs only while all its
nodes can, and those runs are shorter than one node's (fitted on the polarized AWS p3 4-node
traces; ``benchmarks/gang_grid.py`` replays each zone with a prior fitted without it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from airflow_spot.policy import priors
from airflow_spot.policy.base import Policy, kept_s, register
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation
from airflow_spot.policy.reserve import share_of_up_reserve

if TYPE_CHECKING:  # the model and the solver load on first use: DAG parsing never pays for them
    from airflow_spot.policy.hazard import HazardModel
    from airflow_spot.policy.plan import Plan

MAX_PLAN_STEPS = 600  # the plan's intervals are at least deadline / 600 long
# and at least changeover / 4 (the plan keeps a state per interval of changeover left: a 2 h
# changeover on 6 min intervals took 420 MB and 30 s to solve)
MAX_CHANGEOVER_STEPS = 4
KEEP_PLANS = 2  # plans kept in memory (a measured changeover may hover between two)


@dataclass(frozen=True)
class Params:
    f: float = 0.4  # share of Uniform Progress's reserve kept as a floor while spot is down
    floor: float = 1.0  # changeovers added to the floor
    settle: float = 0.0  # changeovers spot must have been up (less one look) to leave on-demand
    prior: str = "default"  # the availability model (``policy/priors/<name>.json``)
    gang_prior: str = "gang"  # a gang's (``job.nodes > 1``): all its nodes up at once
    miss_penalty: float = 10.0  # a missed deadline costs this many all-on-demand jobs


@register
class DeadlineAware(Policy):
    """Follow the dynamic-programming plan; keep a floor of slack; let returning spot settle."""

    name = "deadline_aware"

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or Params()
        priors.path(self.params.prior)  # an unknown name fails here, naming the choices
        priors.path(self.params.gang_prior)
        self._models: dict[str, HazardModel] = {}
        self._plans: list[tuple[HazardModel, tuple, Plan, HazardModel]] = []  # newest first

    @property
    def model(self) -> HazardModel:
        """The availability prior of a job of one node."""
        return self.model_for(1)

    def model_for(self, nodes: int) -> HazardModel:
        """The availability prior of a job of ``nodes`` (a gang's is its own), loaded on first
        use (not when a DAG file is parsed)."""
        name = self.params.prior if nodes == 1 else self.params.gang_prior
        model = self._models.get(name)
        if model is None:
            from airflow_spot.policy.hazard import prior

            model = self._models[name] = prior(name)
        return model

    def __repr__(self) -> str:
        return f"DeadlineAware({self.params})"

    @classmethod
    def with_option(cls, option: str) -> DeadlineAware:
        """``deadline_aware@<prior>``: the same policy on another availability prior (for a
        job of any size)."""
        return cls(Params(prior=option, gang_prior=option))

    def plan(self, job: JobSpec) -> tuple[Plan, HazardModel]:
        """The plan for ``job`` and the model it was solved on (kept for the next look).

        A live job's shape drifts at every look (measured throughput and changeover, the
        operator's guard): the interval is rounded up on a geometric grid, a plan is solved
        with room for the slack to grow, and the last few plans are kept while they serve
        the new shape (:func:`~airflow_spot.policy.plan.serves`), so a job solves a handful
        of plans, not one per look.
        """
        from airflow_spot.policy import plan as plans

        step = job.tick_s
        least = max(job.deadline_s / MAX_PLAN_STEPS, job.changeover_s / MAX_CHANGEOVER_STEPS)
        if least > step:
            step *= plans.grid_up(least / step * 1024) / 1024
        base = self.model_for(job.nodes)
        if self._plans and self._plans[0][0] is not base:
            self._plans.clear()  # the prior was swapped
        model = next((m for *_, m in self._plans if m.tick_s == step), None)
        if model is None:
            model = base.for_tick(step)
        # the plan's deadline is the job's less what the safety net keeps (the gang's on-demand
        # acquisition margin, the live operator's failure reserve), as the net sees it: planned
        # to the job's own deadline, it counted on slack the net would not let it spend
        kept = kept_s(job)
        key = plans.shape(
            model,
            step,
            job.changeover_s,
            job.spot_price,
            job.on_demand_price,
            job.slack_s - kept,
            math.ceil((job.deadline_s - kept) / step),
            self.params.miss_penalty,
            job.make_before_break,
        )
        for i, (_, have, plan, m) in enumerate(self._plans):
            if plans.serves(have, key):
                self._plans.insert(0, self._plans.pop(i))
                return plan, m
        # a slack that outgrew the last plan (the live guard shrinks as the work gets done)
        # will grow again: give the next plan room; a simulated job's shape never drifts
        grew = any(plans.same_but_slack(have, key) for _, have, *_ in self._plans)
        plan = plans.solve_shape(key, room=1.25 if grew else 1.0, cache_dir=self.plan_cache)
        key = (*key[:4], plan.max_slack, *key[5:])
        self._plans.insert(0, (base, key, plan, model))
        del self._plans[KEEP_PLANS:]
        return plan, model

    def reserve(self, job: JobSpec, obs: Observation) -> float:
        return share_of_up_reserve(job, obs.now, self.params.f, self.params.floor)

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        p = self.params
        plan, model = self.plan(job)
        d = job.changeover_s
        left = job.deadline_s - kept_s(job) - obs.now  # to the plan's deadline (see plan())
        work_left = job.work_s - obs.done_s
        slack = left - work_left
        context = model.context_of(obs.last_up_s, obs.last_down_s)
        # the plan counts whole intervals left: its slack is those intervals less the work
        # left rounded up (rounding time and slack down apart, a job with less work left than
        # the part of an interval dropped looked done, and left running on-demand for spot)
        tau = int(left // plan.tick_s + 1e-9)
        units = tau * round(plan.tick_s / plan.unit_s) - math.ceil(work_left / plan.unit_s - 1e-9)
        units = units if slack >= 0 else -1
        state = plan.state(obs.capacity.value, obs.changeover_left_s, obs.overlap)

        def cheap(up: bool, age_s: float) -> bool:
            bucket = context * len(model.edges) + model.bucket(age_s)
            return plan.cheap(tau, state, up, bucket, units)

        def may_return() -> bool:
            """Whether the plan would take a spot run of any age, in any context, from here
            (asked again at every look). Where none would pay, a probe only finds capacity to
            give back: its find is billed and nothing is gained."""
            nb = len(model.edges)
            return any(
                plan.cheap(tau, state, True, c * nb + b, units)
                for c in range(model.contexts)
                for b in range(nb)
            )

        if obs.spot_available is None:
            return self._unseen(job, obs, model, context, cheap, may_return, slack)
        up = obs.spot_available
        bucket = model.bucket(obs.spot_age_s)
        is_cheap = cheap(up, obs.spot_age_s)
        age_h = obs.spot_age_s / HOUR
        more = _Expected(model, up, bucket, context)
        if up:
            if obs.capacity is Capacity.ON_DEMAND:
                if not is_cheap:
                    return Decision(Capacity.ON_DEMAND, "dp_keep_od", (age_h, more, slack / HOUR))
                if obs.spot_age_s + job.tick_s < p.settle * d:
                    return Decision(Capacity.ON_DEMAND, "dp_settle", (age_h, p.settle * d / HOUR))
                return Decision(Capacity.SPOT, "dp_return", (age_h, more, slack / HOUR))
            if is_cheap:
                return Decision(Capacity.SPOT, "dp_spot", (age_h, more))
            return Decision(Capacity.ON_DEMAND, "dp_od_up", (age_h, more, slack / HOUR))
        # spot is down: a probe or request that waits while it is down costs nothing, and it
        # sees the next run begin (so its age is known, not guessed)
        if obs.capacity is Capacity.ON_DEMAND:
            if not may_return():
                return Decision(Capacity.ON_DEMAND, "dp_od_no_return", (age_h, slack / HOUR))
            return Decision(Capacity.ON_DEMAND, "dp_od_spot_down", (age_h,), look=True)
        reserve = self.reserve(job, obs)
        if not is_cheap:
            return Decision(Capacity.ON_DEMAND, "dp_od", (age_h, more, slack / HOUR), look=True)
        if slack - d <= reserve:
            return Decision(
                Capacity.ON_DEMAND,
                "dp_floor",
                (age_h, slack / HOUR, reserve / HOUR),
                look=True,
            )
        return Decision(
            Capacity.NONE, "dp_wait", (age_h, more, slack / HOUR, reserve / HOUR), look=True
        )

    def _unseen(
        self,
        job: JobSpec,
        obs: Observation,
        model: HazardModel,
        context: int,
        cheap: Callable[[bool, float], bool],
        may_return: Callable[[], bool],
        slack: float,
    ) -> Decision:
        """Spot's state is not seen now (a cluster shows it only through the job's own spot
        attempt, its request and its probes). The belief: spot was last seen up (or down) in
        a run of age ``a``, ``e`` ago; the semi-Markov model gives the chance it is up now.

        * Last seen up (a probe found a run the plan did not take): the run, if it goes on, is
          ``a + e`` old now. Once the plan would take spot of that age, ask for it: a request
          granted at once if the run goes on, and on-demand trains until spot is ready; if the
          run ended unseen, the request waits unbilled and shows the outage.
        * Last seen down, or never seen: a probe (or request) waiting while spot is down costs
          nothing and shows the next run begin; only capacity it finds and the job does not
          take is billed. So look, and ask for spot outright where the plan would take a run
          that just began (``cheap`` at age 0): then a find is never wasted. On on-demand,
          look only while some run would pay a return (``may_return``).
        """
        e, a = obs.spot_unseen_s, obs.spot_age_s
        seen = obs.spot_seen
        p_up = model.p_up(bool(seen), a, context, e) if seen is not None else None
        if seen:
            age = a + e
            belief = (e / HOUR, "up", "run", age / HOUR, _pct(p_up), "it still runs")
            if cheap(True, age):
                return Decision(Capacity.SPOT, "unseen_ask", (*belief, slack / HOUR))
            if obs.capacity is Capacity.ON_DEMAND:
                return Decision(Capacity.ON_DEMAND, "unseen_keep_od", (*belief, slack / HOUR))
            return Decision(
                Capacity.ON_DEMAND if not cheap(False, 0.0) else Capacity.NONE,
                "unseen_wait",
                (*belief, slack / HOUR),
                look=True,
            )
        if seen is None:  # the first look: nothing seen yet
            if cheap(True, 0.0) and obs.capacity is not Capacity.ON_DEMAND:
                return Decision(Capacity.SPOT, "never_seen_ask", (slack / HOUR,))
            return Decision(
                obs.capacity if obs.capacity is not Capacity.NONE else Capacity.ON_DEMAND,
                "never_seen_od",
                (slack / HOUR,),
                look=True,
            )
        else:
            belief = (e / HOUR, "down", "outage", (a + e) / HOUR, _pct(p_up), "it is back")
        if cheap(True, 0.0):
            return Decision(Capacity.SPOT, "unseen_ask", (*belief, slack / HOUR))
        if obs.capacity is Capacity.ON_DEMAND:
            probe = may_return()
            rule = "unseen_probe" if probe else "unseen_no_return"
            return Decision(Capacity.ON_DEMAND, rule, (*belief, slack / HOUR), look=probe)
        return Decision(Capacity.ON_DEMAND, "unseen_od", (*belief, slack / HOUR), look=True)


def _pct(p: float | None) -> str:
    return "?" if p is None else f"{100 * p:.0f}"


class _Expected:
    """Expected hours left in the current run, computed only when a reason is read."""

    __slots__ = ("model", "up", "bucket", "context")

    def __init__(self, model: HazardModel, up: bool, bucket: int, context: int) -> None:
        self.model, self.up, self.bucket, self.context = model, up, bucket, context

    def __format__(self, spec: str) -> str:
        return format(_expected_h(self.model, self.up, self.bucket, self.context), spec)


@lru_cache(maxsize=512)
def _expected_h(model: HazardModel, up: bool, bucket: int, context: int) -> float:
    return model.expected_left_s(up, model.edges[bucket] * model.tick_s, context) / HOUR
