"""What one replay returns: :class:`RunResult`, and its figures from a ledger or from sums."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_spot.ledger import Ledger
from airflow_spot.policy import JobSpec, Policy
from airflow_spot.policy.model import HOUR
from airflow_spot.simulate.segments import Totals
from airflow_spot.simulate.traces import Trace

if TYPE_CHECKING:
    from airflow_spot.simulate.gang import Waste


@dataclass(frozen=True, slots=True)
class RunResult:
    """One policy on one trace for one job."""

    trace: str
    policy: str
    deadline_h: float
    changeover_h: float
    cost: float
    met: bool
    spot_hours: float  # billed hours on spot (changeover included)
    on_demand_hours: float
    spot_work_hours: float  # progress made on spot
    on_demand_work_hours: float
    preemptions: int
    finished_h: float
    on_demand_cost: float
    ledger: Ledger | None = None
    observe: str = "oracle"
    probes: int = 0  # probes asked (spot requests are not counted)
    probe_cost: float = 0.0  # capacity found by a request or probe and not used
    overlap_hours: float = 0.0  # on-demand training on while a spot return launched
    nodes: int = 1  # a gang's size (every figure above bills every node)
    partial_node_hours: float | None = None  # a gang's: nodes held while its request waited
    partial_cost: float = 0.0  # what they cost (in probe_cost too: the ledger's probe phase)
    escalations: int = 0  # a gang's on-demand launches that escalated to the reserved pool

    @property
    def normalized_cost(self) -> float:
        return self.cost / self.on_demand_cost

    def row(self) -> dict:
        return {
            "trace": self.trace,
            "policy": self.policy,
            "deadline_h": self.deadline_h,
            "changeover_h": self.changeover_h,
            "cost": round(self.cost, 6),
            "normalized_cost": round(self.normalized_cost, 6),
            "met": self.met,
            "spot_hours": round(self.spot_hours, 6),
            "on_demand_hours": round(self.on_demand_hours, 6),
            "spot_work_hours": round(self.spot_work_hours, 6),
            "on_demand_work_hours": round(self.on_demand_work_hours, 6),
            "preemptions": self.preemptions,
            "finished_h": round(self.finished_h, 6),
            "observe": self.observe,
            "probes": self.probes,
            "probe_cost": round(self.probe_cost, 6),
            "overlap_hours": round(self.overlap_hours, 6),
        } | self._gang_row()

    def _gang_row(self) -> dict:
        """A gang's own figures (none for a one-node replay: its rows stay as they were)."""
        if self.partial_node_hours is None:
            return {}
        return {
            "nodes": self.nodes,
            "partial_node_hours": round(self.partial_node_hours, 6),
            "partial_cost": round(self.partial_cost, 6),
            "escalations": self.escalations,
        }


def result(
    trace: Trace,
    policy: Policy,
    job: JobSpec,
    ledger: Ledger | None,
    totals: Totals | None,
    met: bool,
    end_s: float,
    work_on: list[float],
    preemptions: int,
    observe: str,
    overlap_s: float,
    waste: Waste | None = None,
) -> RunResult:
    """The figures of one replay, from its ledger or its totals (both observation models)."""
    if ledger is not None:  # one pass over the segments, summed as Ledger's properties sum
        totals = Totals()
        for sg in ledger.segments:
            totals.add(sg)
        totals.probes = ledger.probes
    assert totals is not None
    return RunResult(
        trace=trace.name,
        policy=policy.name,
        deadline_h=job.deadline_s / 3600.0,
        changeover_h=job.changeover_s / 3600.0,
        cost=totals.cost,
        met=met,
        spot_hours=totals.spot_h - totals.spot_probe_h,
        on_demand_hours=totals.od_h,
        spot_work_hours=work_on[0] / 3600.0,
        on_demand_work_hours=work_on[1] / 3600.0,
        preemptions=preemptions,
        finished_h=end_s / 3600.0,
        on_demand_cost=job.work_s / HOUR * job.on_demand_price * job.nodes,
        ledger=ledger,
        observe=observe,
        probes=totals.probes,
        probe_cost=totals.probe_cost,
        overlap_hours=overlap_s / 3600.0,
        nodes=job.nodes,
        partial_node_hours=None if waste is None else waste.node_s / 3600.0,
        partial_cost=0.0 if waste is None else waste.cost,
        escalations=0 if waste is None else waste.run.escalations[0],
    )
