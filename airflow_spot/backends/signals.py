"""What a backend can show about spot capacity: one piece of evidence at a time.

Pure: no Airflow, no Kubernetes client, no clock. A signal is a fact about one moment (``at``,
wall seconds since the epoch) from one source; the operator keeps the newest facts and hands
the policy what they say (:class:`~airflow_spot.policy.Observation`), never a guess passed off
as a fact. A prior (a cloud's placement score) is a signal with ``fact=False``: it may shape a
belief, it never says spot is up or down.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: where evidence of spot's state comes from (what the decision log and the UI name)
SOURCES = (
    "market",  # a replayed market read directly (observe="oracle": the paper's model)
    "attempt",  # the job holds spot (or just lost it: a preemption)
    "request",  # the job's own spot request waits for capacity (a pending spot pod)
    "probe",  # a probe asked for capacity (bound: up; refused or waiting: down)
    "karpenter",  # an InsufficientCapacityError event on a NodeClaim (down for 3 min)
    "autoscaler",  # cluster-autoscaler backoff (ConfigMap or a NotTriggerScaleUp event)
    "node",  # a Ready spot node of the pool with a free GPU (up)
    "placement-score",  # a cloud's score: a prior only
)


@dataclass(frozen=True)
class SpotSignal:
    """Spot was ``up`` (or not) at wall time ``at``, as ``source`` showed it."""

    up: bool
    at: float
    source: str
    pool: str = ""
    detail: str = ""
    fact: bool = True  # False: a prior (a placement score), never taken as the state

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown signal source {self.source!r}; one of {SOURCES}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpotSignal:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def newest(signals: list[SpotSignal], *, facts_only: bool = True) -> SpotSignal | None:
    """The newest signal (a later fact wins; among signals of the same moment, a down)."""
    pick = [s for s in signals if s.fact or not facts_only]
    return max(pick, key=lambda s: (s.at, not s.up), default=None)
