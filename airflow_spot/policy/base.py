"""The policy interface, the shared safety net, and the registry of policies by name.

A policy is an object with ``decide(job, obs) -> Decision``. Every registered policy is
wrapped by one safety net (:func:`safety_net`) that keeps the deadline reachable whenever it
still is: once the whole remaining work plus one changeover (plus the job's reserve for
application failures, :attr:`JobSpec.failure_reserve_s`, and, for a gang, the time to acquire
its on-demand nodes, :attr:`JobSpec.acquire_s`) no longer fits in the whole decision
intervals left before the deadline, the job goes to on-demand (a spot instance that is
already running past its changeover may finish the interval: its progress counts even if it
is reclaimed at the next look).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from airflow_spot.exceptions import UnknownPolicy
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation

EPS = 1e-3  # seconds of work or changeover treated as zero (as in the paper's simulator)
# a fast-forward hint (:meth:`Policy.steady`) meaning "for as long as the steady state lasts"
ALWAYS = 1 << 60
_WHOLE = float(1 << 25)  # whole seconds below this: the baselines' arithmetic is exact

DONE = Decision(Capacity.NONE, "done")
_SPOT, _ON_DEMAND = Capacity.SPOT, Capacity.ON_DEMAND


def ticks_left(job: JobSpec, obs: Observation) -> int:
    """Whole decision intervals left before the deadline."""
    return math.floor((job.deadline_s - obs.now) / job.tick_s)


def ticks_needed(job: JobSpec, obs: Observation, changeovers: int = 1) -> int:
    """Decision intervals the remaining work needs on on-demand, with ``changeovers`` launches
    the reserve for application failures (:attr:`JobSpec.failure_reserve_s`) and the gang's
    on-demand acquisition margin (:attr:`JobSpec.acquire_s`; with neither, the sum is the one
    it always was: adding 0.0 changes no float)."""
    remaining = job.work_s - obs.done_s
    need = remaining + changeovers * job.changeover_s + kept_s(job)
    return math.ceil(need / job.tick_s)


def kept_s(job: JobSpec) -> float:
    """The seconds the safety net keeps beyond the work and the changeover: the reserve for
    application failures plus the gang's on-demand acquisition margin (``r + 0.0`` is ``r``:
    a job with no gang keeps what it always kept, to the last bit)."""
    return job.failure_reserve_s + job.acquire_s


def safety_net(job: JobSpec, obs: Observation, choice: Decision) -> Decision:
    """Override ``choice`` with on-demand when the deadline would otherwise be at risk."""
    if choice.capacity is Capacity.ON_DEMAND:
        return choice
    # ticks_needed(job, obs) < ticks_left(job, obs), inlined: a replay asks this at every look
    tick, now, done, kept = job.tick_s, obs.now, obs.done_s, job.failure_reserve_s + job.acquire_s
    need = math.ceil((job.work_s - done + job.changeover_s + kept) / tick)
    left = math.floor((job.deadline_s - now) / tick)
    if need < left:
        return choice
    if (
        obs.capacity is Capacity.SPOT
        and choice.capacity is Capacity.SPOT
        and (obs.changeover_left_s < EPS or (obs.overlap and need <= left))
    ):
        # a running spot instance's next interval of progress is certain: the net let it
        # begin, and calling it off a look later for the live rate's drift only paid its
        # launch. A make-before-break return goes on as surely only while the slack is short
        # by less than a look: once spot takes over, a loss needs a whole on-demand
        # changeover. ``overlap`` means on-demand *trains* under the return: one still paying
        # its own launch (a gang's reserved boot outlasts spot's launch) makes no progress,
        # and the caller shows that return as a launch with nothing under it
        return choice
    return deadline_od(job, obs)


def deadline_od(job: JobSpec, obs: Observation, changeovers: int = 1) -> Decision:
    """On-demand to meet the deadline, the reason saying what the slack must cover (the
    ``changeovers`` kept, the net's one or the baselines' two, and the look, in hours: a live
    job's measured changeover and its look may be hours of market time, a gang's ranks
    joining replayed fast), what else is kept, and that time is counted in whole looks (a
    slack above the sum may still fall short by up to two looks)."""
    slack_h = (job.deadline_s - obs.now - (job.work_s - obs.done_s)) / HOUR
    what = "a changeover" if changeovers == 1 else f"{changeovers} changeovers"
    co_h, tick_h = changeovers * job.changeover_s / HOUR, job.tick_s / HOUR
    step = (co_h, tick_h, what)
    if job.failure_reserve_s > 0.0:  # the slack may be hours: say what it is kept for
        also = f", the {job.acquire_s / HOUR:.2f} h to acquire the gang's on-demand nodes"
        kept = (slack_h, job.failure_reserve_s / HOUR, *step, also if job.acquire_s else "")
        return Decision(Capacity.ON_DEMAND, "safety_reserve", kept)
    if job.acquire_s > 0.0:
        return Decision(
            Capacity.ON_DEMAND, "safety_acquire", (slack_h, job.acquire_s / HOUR, *step)
        )
    return Decision(Capacity.ON_DEMAND, "safety", (slack_h, *step))


def ask_spot(obs: Observation) -> Decision:
    """Spot unseen: ask for it (a request that waits unbilled if spot is down)."""
    return Decision(Capacity.SPOT, "spot_ask", (unseen(obs),))


def unseen(obs: Observation) -> str:
    """What is known of spot while it is unseen, for a reason (``never seen`` at the start)."""
    if obs.spot_seen is None:
        return "never seen"
    state = "up" if obs.spot_seen else "down"
    via = f" by {obs.spot_source}" if obs.spot_source else ""
    return f"{state} when last seen{via} {obs.spot_unseen_s / HOUR:.2f} h ago"


class Policy:
    """Base of all policies: subclasses implement :meth:`choose`; :meth:`decide` adds the rest."""

    name: ClassVar[str] = ""
    unsafe: ClassVar[bool] = False  # only a deliberately unsafe baseline skips the safety net
    # the folder a policy that solves plans keeps them in (None: in memory only); the caller's
    # to give (get_policy(plan_cache=...)): the pure core reads no environment
    plan_cache: str | None = None

    def decide(self, job: JobSpec, obs: Observation) -> Decision:
        if job.work_s - obs.done_s <= EPS:
            return DONE
        choice = self.choose(job, obs)
        capacity = choice.capacity
        if capacity is _SPOT and obs.spot_available is False:
            raise AssertionError(f"{self.name} asked for spot while spot is down")
        if self.unsafe or capacity is _ON_DEMAND:  # the safety net keeps on-demand as it is
            return choice
        return safety_net(job, obs, choice)

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        raise NotImplementedError

    def steady(self, job: JobSpec, obs: Observation, decision: Decision) -> int:
        """A replay's fast-forward hint (never called by the operator): how many following
        looks are *certain* to get a decision with the same capacity, rule and ``look`` as
        ``decision``, the one :meth:`decide` just returned for ``obs``.

        The caller asks only when ``decision.capacity`` is ``obs.capacity`` (no switch) and
        less than a tick of a changeover is left on it (``obs.changeover_left_s <
        job.tick_s``: over by the next look), and skips looks only while the state stays
        steady: the capacity stays held and is never reclaimed, spot's state stays as ``obs``
        has it (seen and the same, or unseen), and neither the end of the work nor the
        deadline comes. So the ``j``-th following look sees ``obs`` with ``now`` ``j`` ticks
        on, ``done_s`` (on spot or on-demand, not idle) ``j`` ticks on less what was left of
        the changeover, ``changeover_left_s`` 0, ``spot_age_s`` (seen) or ``spot_unseen_s``
        (unseen) ``j`` ticks older, ``spot_down_s`` ``j`` ticks more where spot is seen
        down, ``spot_source`` perhaps changed, and all else the same (up to rounding in the
        last digits: a hint that depends on a comparison must not hold it on a knife's
        edge).

        It also asks at a launch of spot from idle (``obs.capacity`` none, ``decision``
        spot, spot up, not billed at the trace's prices), while spot stays up: then the
        following looks see the capacity spot, the changeover paid tick by tick (each look
        ``changeover_left_s`` less by what its tick paid, ``done_s`` on by the rest of the
        tick), and then whole ticks of progress.

        A hint may fall short (the caller then looks again), never long. The default, 0,
        promises nothing: every look is taken.
        """
        return 0

    def blind(self, job: JobSpec, obs: Observation, decision: Decision) -> bool:
        """A replay's second hint (never called by the operator), asked with a :meth:`steady`
        hint ``k > 0`` while on-demand runs: whether those ``k`` looks keep their decision
        *whatever spot does in them*. Then the ``j``-th following look sees ``obs`` as
        :meth:`steady` says, except that everything about spot (``spot_available``,
        ``spot_age_s``, ``spot_down_s``, ``last_up_s``, ``last_down_s``, ``spot_seen``,
        ``spot_source``, ``spot_unseen_s``) may have changed, and the replay jumps over
        changes of spot's state too. True only for a decision that reads nothing of spot
        (on-demand for good, say). The default, False, promises nothing.
        """
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def own_rules(policy: Policy, cls: type[Policy]) -> bool:
    """``policy`` decides by ``cls``'s rules (a subclass that changes them loses its hints)."""
    kind = type(policy)
    return kind.choose is cls.choose and kind.decide is Policy.decide and kind.unsafe is cls.unsafe


def exact(job: JobSpec, obs: Observation) -> bool:
    """The job's and the look's times are whole seconds, small enough that ``ticks_left``,
    ``ticks_needed`` and the Uniform Progress line compare exactly as whole numbers would, at
    this look and at every steady one after it (so hints may count thresholds in integers)."""
    now, done = obs.now, obs.done_s
    return (
        0.0 <= now < _WHOLE
        and 0.0 <= done < _WHOLE
        and float(now).is_integer()
        and float(done).is_integer()
        and _exact_job(job)
    )


_last_job: tuple[JobSpec | None, bool] = (None, False)  # _exact_job's last job and answer


def _exact_job(job: JobSpec) -> bool:
    global _last_job
    last, answer = _last_job
    if last is not job:  # a replay asks for one job thousands of times in a row
        answer = all(
            0.0 <= v < _WHOLE and float(v).is_integer()
            for v in (
                job.work_s,
                job.deadline_s,
                job.changeover_s,
                job.tick_s,
                job.failure_reserve_s,
                job.acquire_s,
            )
        )
        _last_job = (job, answer)  # one assignment: a thread never sees half of it
    return answer


_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name {cls.name!r} is empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def get_policy(name: str, plan_cache: str | None = None) -> Policy:
    """A fresh policy by name; unknown names raise :class:`UnknownPolicy` listing the choices.

    ``name@option`` passes one option to a policy that takes one (``deadline_aware@aws-p3``:
    the availability prior fitted on that trace family). ``plan_cache``: the folder a policy
    that solves plans keeps them in (:attr:`Policy.plan_cache`).
    """
    policy = _new_policy(name)
    if plan_cache is not None:
        policy.plan_cache = plan_cache
    return policy


def _new_policy(name: str) -> Policy:
    base, _, option = name.partition("@")
    try:
        factory = _REGISTRY[base]
    except KeyError:
        raise UnknownPolicy(
            "policy", f"unknown policy {name!r}; choose one of {', '.join(policy_names())}"
        ) from None
    if not option:
        return factory()
    with_option = getattr(factory, "with_option", None)
    if with_option is None:
        raise UnknownPolicy("policy", f"policy {base!r} takes no option (got {option!r})")
    try:
        return with_option(option)
    except ValueError as e:
        raise UnknownPolicy("policy", f"{name!r}: {e}") from None


def policy_names() -> list[str]:
    return sorted(_REGISTRY)
