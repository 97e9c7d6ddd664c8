"""Typed events that wake the operator (pure: no Airflow)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from airflow_spot.jobstate import AttemptHandle


class EventKind(str, Enum):
    ATTEMPT_ENDED = "attempt_ended"  # the attempt has a verdict (succeeded, preempted, failed, ...)
    MARKET_CHANGED = "market_changed"  # spot came back or went away
    TICK = "tick"  # the decision interval passed: time to look again
    ERROR = "error"  # the watcher itself failed
    CONDITION_MET = "condition_met"  # a sensor's condition holds; ``status`` carries its result


@dataclass(frozen=True)
class SpotEvent:
    kind: EventKind
    at: float  # wall-clock seconds since the epoch
    spot_available: bool | None = None
    status: dict[str, Any] | None = None
    message: str = ""
    handle: AttemptHandle | None = None  # the watcher's copy of the handle (what it recorded)

    def to_payload(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "at": self.at,
            "spot_available": self.spot_available,
            "status": self.status,
            "message": self.message,
            "handle": None if self.handle is None else self.handle.to_dict(),
        }

    @classmethod
    def from_payload(cls, payload: Any) -> SpotEvent:
        """Parse an event; anything unknown fails loudly."""
        if not isinstance(payload, dict) or "kind" not in payload or "at" not in payload:
            raise ValueError(f"not a spot event: {payload!r}")
        try:
            kind = EventKind(payload["kind"])
        except ValueError as e:
            raise ValueError(f"unknown spot event kind {payload['kind']!r}") from e
        return cls(
            kind,
            float(payload["at"]),
            payload.get("spot_available"),
            payload.get("status"),
            payload.get("message", ""),
            None if payload.get("handle") is None else AttemptHandle.from_dict(payload["handle"]),
        )
