"""The job, what is observed of it at one moment, and the decision taken.

All times are seconds measured from the start of the job (``now=0`` at the first decision);
callers convert wall clocks at the edge. Nothing here reads a clock.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from enum import Enum

from airflow_spot.exceptions import InfeasibleDeadline, InvalidJobSpec, finite_number

HOUR = 3600.0
# p3.2xlarge in us-west-2, the paper's and the benchmarks' prices: the defaults where none is given
REFERENCE_SPOT_PRICE, REFERENCE_ON_DEMAND_PRICE = 0.9731, 3.06


class Capacity(str, Enum):
    """Where the job runs: nowhere, on spot, or on on-demand capacity."""

    NONE = "none"
    SPOT = "spot"
    ON_DEMAND = "on_demand"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A training job: how much work, by when, and what capacity costs.

    :param work_s: compute seconds the job needs on the reference capacity.
    :param deadline_s: seconds from the job's start by which the work must be done.
    :param changeover_s: seconds lost on every launch (start-up plus restore from checkpoint).
    :param spot_price: spot price per hour.
    :param on_demand_price: on-demand price per hour.
    :param tick_s: how often the policy is asked again; the safety net keeps this much margin.
    :param max_preemptions: preemptions to tolerate on spot before ``last_attempt_on_demand``
        moves to on-demand for good (``None`` = unlimited).
    :param failure_reserve_s: seconds the safety net keeps in hand for the application
        failures the job may still have (each loses the work since the last checkpoint and
        pays a changeover); the live operator measures it, a replay has none (0).
    :param nodes: the gang's size: every node is billed, on spot and on-demand, at the
        per-node prices above (the policy decides as for one node: only the bill scales).
    :param acquire_s: seconds it may take to get ``nodes`` on-demand nodes (measured, or
        given: the p95 of the pool's acquisition time); the safety net keeps it in its margin
        on top of the changeover. 0 for one node, where on-demand comes at once.
    :param make_before_break: a return from on-demand to spot keeps on-demand training (and
        billed) until spot is ready, so it loses no progress: the operator's returns on a
        backend that can hold a launch, and the replay's under ``observe="cluster"`` (which
        sets it). ``False``: on-demand stops when the spot launch starts (the paper's model).
        ``deadline_aware``'s plan prices a return accordingly.
    """

    work_s: float
    deadline_s: float
    changeover_s: float = 0.2 * HOUR
    spot_price: float = REFERENCE_SPOT_PRICE
    on_demand_price: float = REFERENCE_ON_DEMAND_PRICE
    tick_s: float = 600.0
    max_preemptions: int | None = None
    failure_reserve_s: float = 0.0
    nodes: int = 1  # the gang's fields last: positional construction stays as it was
    acquire_s: float = 0.0
    make_before_break: bool = False

    def __post_init__(self) -> None:
        _positive("work_s", self.work_s, "the compute time the job needs, e.g. 48 h = 172800")
        _positive("deadline_s", self.deadline_s, "seconds from the job's start")
        _positive("tick_s", self.tick_s, "the decision interval in seconds")
        _positive("on_demand_price", self.on_demand_price, "price per hour of on-demand capacity")
        if not (finite_number(self.changeover_s) and self.changeover_s >= 0):
            raise InvalidJobSpec("changeover_s", f"must be >= 0 seconds, got {self.changeover_s!r}")
        if not (finite_number(self.spot_price) and self.spot_price >= 0):
            raise InvalidJobSpec("spot_price", f"must be >= 0 per hour, got {self.spot_price!r}")
        n = self.max_preemptions
        if n is not None and not (
            isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0
        ):
            raise InvalidJobSpec("max_preemptions", f"must be an integer >= 0 or None, got {n!r}")
        r = self.failure_reserve_s
        if not (finite_number(r) and r >= 0):
            raise InvalidJobSpec("failure_reserve_s", f"must be >= 0 seconds, got {r!r}")
        _gang(self.nodes, self.acquire_s)
        if not isinstance(self.make_before_break, bool):
            raise InvalidJobSpec(
                "make_before_break",
                f"must be True or False (are returns to spot make-before-break?), "
                f"got {self.make_before_break!r}",
            )
        if self.deadline_s < self.work_s:
            raise InvalidJobSpec(
                "deadline_s",
                f"the deadline ({self.deadline_s / HOUR:.2f} h) is before the work could end "
                f"({self.work_s / HOUR:.2f} h of compute); move the deadline later or cut the work",
            )
        need = self.work_s + self.changeover_s + self.acquire_s
        if need > self.deadline_s:
            acquire = (
                f" + {self.acquire_s / HOUR:.2f} h to acquire {self.nodes} on-demand nodes"
                if self.acquire_s
                else ""
            )
            raise InfeasibleDeadline(
                "deadline_s",
                f"infeasible: {self.work_s / HOUR:.2f} h of work + {self.changeover_s / HOUR:.2f} h "
                f"changeover{acquire} = {need / HOUR:.2f} h > deadline "
                f"{self.deadline_s / HOUR:.2f} h even all on-demand; move the deadline later or cut "
                "the work",
            )

    @property
    def slack_s(self) -> float:
        return self.deadline_s - self.work_s


def _gang(nodes: object, acquire_s: object) -> None:
    """A gang's size and on-demand acquisition margin, each named with its fix."""
    if not (
        isinstance(nodes, numbers.Integral) and not isinstance(nodes, bool) and int(nodes) >= 1
    ):
        raise InvalidJobSpec("nodes", f"must be a whole number of nodes >= 1, got {nodes!r}")
    if not (finite_number(acquire_s) and acquire_s >= 0):  # type: ignore[operator]
        raise InvalidJobSpec(
            "acquire_s",
            f"must be >= 0 seconds (the time to get the gang's on-demand nodes), got {acquire_s!r}",
        )


def _positive(name: str, value: float, what: str) -> None:
    if not (finite_number(value) and value > 0):
        raise InvalidJobSpec(name, f"must be a positive number ({what}), got {value!r}")


@dataclass(frozen=True, slots=True)
class Observation:
    """What the controller knows at ``now``.

    :param now: seconds since the job started.
    :param done_s: work done so far, in compute seconds (from the latest checkpoint or the
        simulator's exact progress).
    :param capacity: the capacity held now (launching or running).
    :param spot_available: whether spot could be had now (``None`` = unknown).
    :param changeover_left_s: changeover still to pay on the current capacity.
    :param preemptions: spot preemptions so far.
    :param spot_age_s: how long spot has been in its current state (up or down), as seen.
    :param spot_down_s: total time spot has been seen down since the job started.
    :param last_up_s: how long the last spot run seen whole (start and end) lasted.
    :param last_down_s: how long the last outage seen whole lasted.
    :param spot_unseen_s: how long ago spot's state was last seen (0: seen now). While it
        is unseen, ``spot_available`` is ``None`` and ``spot_age_s`` is the age its state had
        when it was last seen.
    :param spot_seen: spot's state when it was last seen (``None``: never seen).
    :param spot_source: what showed it (:data:`airflow_spot.backends.signals.SOURCES`).
    :param overlap: on-demand still trains while the spot attempt (``capacity``) launches: a
        make-before-break return, under the cluster's observation model.
    """

    now: float
    done_s: float
    capacity: Capacity = Capacity.NONE
    spot_available: bool | None = None
    changeover_left_s: float = 0.0
    preemptions: int = 0
    spot_age_s: float = 0.0
    spot_down_s: float = 0.0
    last_up_s: float | None = None
    last_down_s: float | None = None
    spot_unseen_s: float = 0.0
    spot_seen: bool | None = None
    spot_source: str = ""
    overlap: bool = False


@dataclass(frozen=True, slots=True)
class SpotView:
    """What the policy may take as known of spot at one look (times in market seconds).

    :param available: spot's state if seen now, else ``None``.
    :param age_s: how long spot had been in that state when it was last seen.
    :param unseen_s: how long ago it was last seen (0: seen now).
    :param seen: its state when last seen (``None``: never seen).
    :param source: what showed it (:data:`airflow_spot.backends.signals.SOURCES`).
    """

    available: bool | None = None
    age_s: float = 0.0
    unseen_s: float = 0.0
    seen: bool | None = None
    source: str = ""

    @classmethod
    def now(cls, up: bool | None, age_s: float, source: str = "") -> SpotView:
        """Spot's state ``up`` seen at this very look (``None``: not seen)."""
        return cls(up, age_s, 0.0, up, source)


def _observation_builder():  # type: ignore[no-untyped-def]
    """The named builder of an :class:`Observation` (every field, in its order), made without
    a frozen dataclass's ``object.__setattr__`` per field: the simulator builds one per look.
    Falls back to the class itself where the fields are not the 14 it was written for."""
    names = tuple(f.name for f in fields(Observation))
    if names != _OBS_FIELDS or hasattr(Observation, "__post_init__"):
        return Observation
    new = object.__new__
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13 = (
        getattr(Observation, n).__set__ for n in names
    )

    def observation(
        now: float,
        done_s: float,
        capacity: Capacity,
        spot_available: bool | None,
        changeover_left_s: float,
        preemptions: int,
        spot_age_s: float,
        spot_down_s: float,
        last_up_s: float | None,
        last_down_s: float | None,
        spot_unseen_s: float,
        spot_seen: bool | None,
        spot_source: str,
        overlap: bool,
    ) -> Observation:
        o = new(Observation)  # one statement per field: a tuple of calls costs ~5 % of a replay
        s0(o, now)
        s1(o, done_s)
        s2(o, capacity)
        s3(o, spot_available)
        s4(o, changeover_left_s)
        s5(o, preemptions)
        s6(o, spot_age_s)
        s7(o, spot_down_s)
        s8(o, last_up_s)
        s9(o, last_down_s)
        s10(o, spot_unseen_s)
        s11(o, spot_seen)
        s12(o, spot_source)
        s13(o, overlap)
        return o

    return observation


_OBS_FIELDS = (
    "now",
    "done_s",
    "capacity",
    "spot_available",
    "changeover_left_s",
    "preemptions",
    "spot_age_s",
    "spot_down_s",
    "last_up_s",
    "last_down_s",
    "spot_unseen_s",
    "spot_seen",
    "spot_source",
    "overlap",
)
# observation(now, done_s, capacity, spot_available, changeover_left_s, preemptions, spot_age_s,
#             spot_down_s, last_up_s, last_down_s, spot_unseen_s, spot_seen, spot_source, overlap)
# the one builder the simulator (positionally, per look) and the operator (by name) call
observation = _observation_builder()


def observe(
    now: float,
    done_s: float,
    capacity: Capacity,
    view: SpotView,
    *,
    changeover_left_s: float = 0.0,
    preemptions: int = 0,
    spot_down_s: float = 0.0,
    last_up_s: float | None = None,
    last_down_s: float | None = None,
    overlap: bool = False,
) -> Observation:
    """An :class:`Observation` from what is seen of spot (:class:`SpotView`) and the job's own
    figures: what the operator and a look of the simulator outside its hot loop call."""
    return observation(
        now,
        done_s,
        capacity,
        view.available,
        changeover_left_s,
        preemptions,
        view.age_s,
        spot_down_s,
        last_up_s,
        last_down_s,
        view.unseen_s,
        view.seen,
        view.source,
        overlap,
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """The capacity to use from now until the next look, and why (built only when read).

    ``look``: keep a spot request or a probe waiting until the next look, so that spot's state
    is seen then (it waits unbilled while spot is down; capacity it finds and the job does not
    use is billed until it is given back). Ignored where every look sees spot (the oracle).
    Spot asked while spot's state is unknown is a request: granted at once if capacity is
    there, else it waits (and on-demand, if held, trains on until spot is ready).
    """

    capacity: Capacity
    rule: str
    args: tuple = ()
    look: bool = False

    @property
    def reason(self) -> str:
        return REASONS.get(self.rule, self.rule).format(*self.args)


REASONS: dict[str, str] = {
    "done": "work is complete",
    "od_only": "policy runs on on-demand only",
    "spot_up": "spot is available: use it",
    "spot_down_wait": "spot is down and slack {0:.2f} h is enough: wait",
    "stay_spot": "keep the spot capacity already running",
    "behind": "progress {0:.2f} h is behind the uniform line {1:.2f} h: catch up on on-demand",
    "hysteresis": "on on-demand and not yet {0:.2f} h ahead of the line: stay",
    "budget_spent": "{0} preemptions spent the budget of {1}: on-demand for the rest",
    "spot_ask": "spot unseen ({0}): ask for it (the request waits unbilled if spot is down)",
    "safety": "slack {0:.2f} h would not cover {3} ({1:.2f} h) and the next look, counted in whole looks of {2:.2f} h: on-demand to meet the deadline",
    "safety_acquire": "slack {0:.2f} h would not cover {4} ({2:.2f} h), the {1:.2f} h to acquire the gang's on-demand nodes and the next look, counted in whole looks of {3:.2f} h: on-demand to meet the deadline",
    "safety_reserve": "slack {0:.2f} h would not cover {4} ({2:.2f} h), the {1:.2f} h kept for application failures{5} and the next look, counted in whole looks of {3:.2f} h: on-demand to meet the deadline",
}
REASONS.update(
    {
        "da_keep_od": "spot is back but slack {0:.2f} h is too close to the reserve {1:.2f} h: stay on on-demand",
        "da_od_spot_down": "spot down {0:.2f} h: stay on on-demand rather than pay two changeovers",
        "da_reserve": "spot down {0:.2f} h, slack {1:.2f} h at the reserve {2:.2f} h: on-demand",
        "da_wait": "spot down {0:.2f} h, slack {1:.2f} h above the reserve {2:.2f} h: wait",
    }
)
REASONS.update(
    {
        "dp_spot": "spot up {0:.2f} h, expected to last {1:.1f} h more: use it",
        "dp_od_up": "spot up {0:.2f} h, expected to last {1:.1f} h more, but slack {2:.2f} h is too thin to risk a preemption: on-demand",
        "dp_keep_od": "spot back {0:.2f} h, expected to last {1:.1f} h more, slack {2:.2f} h: a return does not pay its changeover yet, stay on on-demand",
        "dp_settle": "spot back only {0:.2f} h (< {1:.2f} h to settle): stay on on-demand",
        "dp_return": "spot back {0:.2f} h, expected to last {1:.1f} h more, slack {2:.2f} h: return to spot",
        "dp_od_spot_down": "spot down {0:.2f} h: stay on on-demand rather than pay two changeovers",
        "dp_od_no_return": "spot down {0:.2f} h, slack {1:.2f} h: no spot run, however long, would pay a return now; stay on on-demand, no probe",
        "dp_od": "spot down {0:.2f} h, expected outage {1:.1f} h more, slack {2:.2f} h: on-demand is cheaper in expectation than waiting",
        "dp_floor": "spot down {0:.2f} h, slack {1:.2f} h at the floor {2:.2f} h: on-demand",
        "dp_wait": "spot down {0:.2f} h, expected outage {1:.1f} h more, slack {2:.2f} h above the floor {3:.2f} h: wait",
        # spot unseen: the belief (unseen h, last state, run kind, age h, chance, what), slack
        "unseen_ask": "spot unseen {0:.2f} h ({1} when last seen, {2} age {3:.2f} h: {4} % {5}), slack {6:.2f} h: ask for spot (on-demand, if held, trains until it is ready)",
        "never_seen_ask": "spot not seen yet, slack {0:.2f} h: ask for spot (the request waits unbilled if spot is down)",
        "never_seen_od": "spot not seen yet, slack {0:.2f} h too thin to wait for it: on-demand; probe",
        "unseen_keep_od": "spot unseen {0:.2f} h ({1} when last seen, {2} age {3:.2f} h: {4} % {5}), slack {6:.2f} h: a run that young does not pay a return yet; stay on on-demand, no probe",
        "unseen_wait": "spot unseen {0:.2f} h ({1} when last seen, {2} age {3:.2f} h: {4} % {5}), slack {6:.2f} h: wait with a request",
        "unseen_probe": "spot unseen {0:.2f} h ({1} when last seen, {2} age {3:.2f} h: {4} % {5}), slack {6:.2f} h: stay on on-demand; probe",
        "unseen_no_return": "spot unseen {0:.2f} h ({1} when last seen, {2} age {3:.2f} h: {4} % {5}), slack {6:.2f} h: no spot run, however long, would pay a return now; stay on on-demand, no probe",
        "unseen_od": "spot unseen {0:.2f} h ({1} when last seen, {2} age {3:.2f} h: {4} % {5}), slack {6:.2f} h: on-demand; probe",
    }
)
