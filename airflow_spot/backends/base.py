"""Typed attempt states and outcomes shared by every backend (pure: no Airflow)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from airflow_spot.exceptions import ConfigError, finite_number


class State(str, Enum):
    """Where an attempt is in its life."""

    WAITING = "waiting"  # a spot launch waiting for capacity (not billed)
    LAUNCHING = "launching"  # changeover: start-up and restore (billed, no progress)
    RUNNING = "running"
    PREEMPTING = "preempting"  # notice sent, SIGTERM / SIGKILL to follow
    ENDED = "ended"


class Outcome(str, Enum):
    """How an attempt ended. A preemption is never an application failure."""

    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"  # the cloud took the spot capacity back
    SPOT_UNAVAILABLE = "spot_unavailable"  # never got spot capacity in time
    INFRA_DISRUPTION = (
        "infra_disruption"  # not a spot reclaim, not the application (drain, lost supervisor)
    )
    OOM_KILLED = "oom_killed"
    APP_FAILURE = "app_failure"  # non-zero exit on healthy capacity
    CANCELLED = "cancelled"  # we stopped it (decision or kill)


@dataclass(frozen=True)
class AttemptStatus:
    """What a backend reports about one attempt; times are wall-clock seconds since the epoch."""

    state: State
    capacity: str
    attempt: int
    launched_at: float
    granted_at: float | None = None  # when capacity was granted (spot may wait before)
    started_at: float | None = None  # when the training process started (changeover over)
    ended_at: float | None = None
    outcome: Outcome | None = None
    reason: str = ""
    exit_code: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    heartbeat: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state is State.ENDED

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        d["outcome"] = self.outcome.value if self.outcome else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptStatus:
        d = dict(d)
        d["state"] = State(d["state"])
        d["outcome"] = Outcome(d["outcome"]) if d.get("outcome") else None
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def stop(backend: Any, handle: dict[str, Any]) -> AttemptStatus:
    """Cancel an attempt and release what it holds (its pod, per the backend's policy): for
    callers that keep no record of it (a kill, a job replaced), so no log is read first."""
    status = backend.cancel(handle)
    backend.cleanup(handle, status.outcome.value if status.outcome else "")
    return status


PRICE_FROM_KEYS = ("aws_conn_id", "instance_type", "zone", "region_name")


def check_pools(pools: Any, kind: type) -> tuple:
    """A backend's spot pools as a tuple of ``kind`` (a list is accepted), with unique names
    and valid prices; ``ConfigError`` naming ``backend.pools`` otherwise."""
    if isinstance(pools, list):
        pools = tuple(pools)
    if not isinstance(pools, tuple) or not all(isinstance(p, kind) for p in pools):
        raise ConfigError(
            "backend.pools", f"give a tuple of {kind.__name__}(...) objects, got {pools!r}"
        )
    if len({p.name for p in pools}) != len(pools):
        raise ConfigError("backend.pools", "pool names must be unique")
    for p in pools:
        check_pool_price(p.name, p.spot_price, p.price_from)
    return pools


def check_pool_price(name: str, spot_price: Any, price_from: Any) -> None:
    """A pool's fixed price (None, or a price per hour >= 0) and its live-price source."""
    if spot_price is not None and not (finite_number(spot_price) and spot_price >= 0):
        raise ConfigError(
            "backend.pools",
            f"pool {name!r}: spot_price must be a price per hour >= 0, got {spot_price!r}",
        )
    check_price_from(f"backend.pools[{name}].price_from", price_from)


def check_price_from(field: str, source: Any) -> None:
    """A pool's live-price source: ``{"aws_conn_id", "instance_type", "zone"[, "region_name"]}``."""
    if source is None:
        return
    ok = (
        isinstance(source, dict)
        and not set(source) - set(PRICE_FROM_KEYS)
        and all(isinstance(v, str) and v.strip() for v in source.values())
        and "instance_type" in source
        and "zone" in source
    )
    if not ok:
        raise ConfigError(
            field,
            'give {"aws_conn_id": "aws_default", "instance_type": "p3.2xlarge", "zone": '
            f'"us-east-1a"}} (region_name optional), got {source!r}',
        )
