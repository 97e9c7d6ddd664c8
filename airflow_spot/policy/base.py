"""The policy interface, the shared safety net, and the registry of policies by name.

A policy is an object with ``decide(job, obs) -> Decision``. Every registered policy is
wrapped by one safety net (:func:`safety_net`) that keeps the deadline reachable whenever it
still is: once the whole remaining work plus one changeover no longer fits in the whole
decision intervals left before the deadline, the job goes to on-demand (a spot instance that
is already running past its changeover may finish the interval: its progress counts even if
it is reclaimed at the next look).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from airflow_spot.exceptions import UnknownPolicy
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation

EPS = 1e-3  # seconds of work or changeover treated as zero (as in the paper's simulator)

DONE = Decision(Capacity.NONE, "done")


def ticks_left(job: JobSpec, obs: Observation) -> int:
    """Whole decision intervals left before the deadline."""
    return math.floor((job.deadline_s - obs.now) / job.tick_s)


def ticks_needed(job: JobSpec, obs: Observation, changeovers: int = 1) -> int:
    """Decision intervals the remaining work needs on on-demand, with ``changeovers`` launches."""
    remaining = job.work_s - obs.done_s
    return math.ceil((remaining + changeovers * job.changeover_s) / job.tick_s)


def safety_net(job: JobSpec, obs: Observation, choice: Decision) -> Decision:
    """Override ``choice`` with on-demand when the deadline would otherwise be at risk."""
    if choice.capacity is Capacity.ON_DEMAND:
        return choice
    left = ticks_left(job, obs)
    if ticks_needed(job, obs) < left:
        return choice
    if (
        obs.capacity is Capacity.SPOT
        and choice.capacity is Capacity.SPOT
        and obs.changeover_left_s < EPS
    ):
        return choice  # a running spot instance's next interval of progress is certain
    slack_h = (job.deadline_s - obs.now - (job.work_s - obs.done_s)) / HOUR
    return Decision(Capacity.ON_DEMAND, "safety", (slack_h,))


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

    def decide(self, job: JobSpec, obs: Observation) -> Decision:
        if job.work_s - obs.done_s <= EPS:
            return DONE
        choice = self.choose(job, obs)
        if choice.capacity is Capacity.SPOT and obs.spot_available is False:
            raise AssertionError(f"{self.name} asked for spot while spot is down")
        return choice if self.unsafe else safety_net(job, obs, choice)

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name {cls.name!r} is empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def get_policy(name: str) -> Policy:
    """A fresh policy by name; unknown names raise :class:`UnknownPolicy` listing the choices.

    ``name@option`` passes one option to a policy that takes one (``deadline_aware@aws-p3``:
    the availability prior fitted on that trace family).
    """
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
