"""The cost ledger: segments of time on a capacity, and what they add up to.

Pure: no Airflow, no clock. The simulator builds one per replay, the operator one per run,
and the UI draws it. Times are seconds from the job's start; prices are per hour.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from airflow_spot.policy.model import HOUR, Capacity


class Phase(str, Enum):
    """What a segment of time was spent on."""

    LAUNCHING = "launching"  # changeover: start-up and restore; billed, no progress
    RUNNING = "running"  # billed, progress
    IDLE = "idle"  # waiting for spot; free
    PROBE = "probe"  # a node a probe (or a spot request) found and the job did not use; billed


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of time on one capacity in one phase at one price."""

    capacity: Capacity
    phase: Phase
    start_s: float
    end_s: float
    progress_start_s: float = 0.0
    progress_end_s: float = 0.0
    price_per_h: float = 0.0
    pool: str = ""
    attempt: int = 0
    ended_by: str = ""  # "", "preempted", "failed", "completed", "switched", "cancelled"
    lost_s: float = 0.0  # work done in this segment but lost (not checkpointed) at its end
    overlap: bool = False  # on-demand training on while a spot return launches (make-before-break)

    @property
    def hours(self) -> float:
        return (self.end_s - self.start_s) / HOUR

    @property
    def cost(self) -> float:
        if self.phase is Phase.IDLE or self.capacity is Capacity.NONE:
            return 0.0
        return self.hours * self.price_per_h


@dataclass
class Ledger:
    """Segments of one job and the figures derived from them."""

    work_s: float
    deadline_s: float
    on_demand_price: float
    segments: list[Segment] = field(default_factory=list)
    finished_s: float | None = None
    probes: int = 0  # probes asked (each may find capacity or not; only a found one costs)

    def add(self, seg: Segment) -> None:
        if seg.end_s < seg.start_s:
            raise ValueError(f"segment ends ({seg.end_s}) before it starts ({seg.start_s})")
        if seg.end_s > seg.start_s:
            self.segments.append(seg)

    def hours(self, capacity: Capacity | None = None, phase: Phase | None = None) -> float:
        return sum(
            s.hours
            for s in self.segments
            if (capacity is None or s.capacity is capacity) and (phase is None or s.phase is phase)
        )

    @property
    def cost(self) -> float:
        return sum(s.cost for s in self.segments)

    @property
    def on_demand_cost(self) -> float:
        """What the same work costs all on-demand, without changeovers."""
        return self.work_s / HOUR * self.on_demand_price

    @property
    def savings(self) -> float:
        """Fraction saved against all on-demand (negative when dearer)."""
        od = self.on_demand_cost
        return 1.0 - self.cost / od if od > 0 else 0.0

    @property
    def preemptions(self) -> int:
        return sum(1 for s in self.segments if s.ended_by == "preempted")

    @property
    def probe_cost(self) -> float:
        """What capacity found by probes or spot requests, and not used, cost."""
        return sum(s.cost for s in self.segments if s.phase is Phase.PROBE)

    @property
    def overlap_hours(self) -> float:
        """Hours on-demand trained on while a spot return launched (both billed)."""
        return sum(s.hours for s in self.segments if s.overlap)

    @property
    def work_lost_s(self) -> float:
        return sum(s.lost_s for s in self.segments)

    @property
    def deadline_met(self) -> bool | None:
        if self.finished_s is None:
            return None
        return self.finished_s <= self.deadline_s + 1e-6

    def summary(self) -> dict[str, Any]:
        """Plain JSON-able figures (the operator's XCom, the UI's row)."""
        spot = self.hours(Capacity.SPOT) - self.hours(Capacity.SPOT, Phase.PROBE)
        od = self.hours(Capacity.ON_DEMAND)
        return {
            "spot_hours": round(spot, 6),
            "on_demand_hours": round(od, 6),
            "idle_hours": round(self.hours(phase=Phase.IDLE), 6),
            "changeover_hours": round(self.hours(phase=Phase.LAUNCHING), 6),
            "cost": round(self.cost, 6),
            "on_demand_cost": round(self.on_demand_cost, 6),
            "savings": round(self.savings, 6),
            "preemptions": self.preemptions,
            "work_lost_hours": round(self.work_lost_s / HOUR, 6),
            "probes": self.probes,
            "probe_cost": round(self.probe_cost, 6),
            "overlap_hours": round(self.overlap_hours, 6),
            "deadline_met": self.deadline_met,
            "finished_hours": None if self.finished_s is None else round(self.finished_s / HOUR, 6),
            "segments": [_seg_dict(s) for s in self.segments],
        }


def _seg_dict(s: Segment) -> dict[str, Any]:
    d = asdict(s)
    d["capacity"] = s.capacity.value
    d["phase"] = s.phase.value
    return d
