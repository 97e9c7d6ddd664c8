"""The segment sums of a replay: ticks merged into segments, and where the segments go.

A replay bills tick by tick; :class:`SegmentBuilder` merges consecutive ticks of one capacity,
phase and price into segments and hands each, as it closes, to a sink: a kept
:class:`~airflow_spot.ledger.Ledger` or, where no ledger is kept (what a sweep asks),
:class:`Totals`, which sums the figures a ledger would give in the order it would hold them,
so that they are equal to the last bit. Both take a segment by ``add``.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_spot.ledger import Ledger, Phase, Segment
from airflow_spot.policy import Capacity, JobSpec
from airflow_spot.policy.model import HOUR

NONE, SPOT, OD = Capacity.NONE, Capacity.SPOT, Capacity.ON_DEMAND
RUNNING, LAUNCHING, IDLE, PROBE = Phase.RUNNING, Phase.LAUNCHING, Phase.IDLE, Phase.PROBE


class Totals:
    """The figures a :class:`Ledger` gives a :class:`RunResult`, summed segment by segment in
    the order the ledger would hold them (so equal to the last bit) without keeping the
    segments: what a sweep, which reads only the rows, needs."""

    __slots__ = ("cost", "spot_h", "spot_probe_h", "od_h", "probe_cost", "finished_s", "probes")

    def __init__(self) -> None:
        # int 0 to start, as sum() starts: an empty run's figures are those of an empty ledger
        self.cost: float = 0
        self.spot_h: float = 0
        self.spot_probe_h: float = 0
        self.od_h: float = 0
        self.probe_cost: float = 0
        self.finished_s: float | None = None
        self.probes = 0

    def add(self, sg: Segment) -> None:
        """As :meth:`Ledger.add`, then its figures summed, without keeping the segment."""
        start, end = sg.start_s, sg.end_s
        if end < start:
            raise ValueError(f"segment ends ({end}) before it starts ({start})")
        if end == start:
            return
        cap, phase = sg.capacity, sg.phase
        hours = (end - start) / HOUR  # Segment.hours and Segment.cost
        cost = 0.0 if phase is IDLE or cap is NONE else hours * sg.price_per_h
        self.cost += cost
        if cap is SPOT:
            self.spot_h += hours
            if phase is PROBE:
                self.spot_probe_h += hours
        elif cap is OD:
            self.od_h += hours
        if phase is PROBE:
            self.probe_cost += cost


class SegmentBuilder:
    """Merges consecutive ticks of the same capacity, phase and price into segments, each
    handed as it closes to ``add`` (a ledger's), or, given ``totals``, summed into them as
    :meth:`Totals.add` sums, without a call or a :class:`Segment` (a sweep's hottest lines:
    the call would cost it some 5 %)."""

    __slots__ = ("add", "totals", "cap", "phase", "price", "start", "end", "p0", "p1", "overlap")

    def __init__(
        self,
        add: Callable[[Segment], None],
        overlap: bool = False,
        totals: Totals | None = None,
    ) -> None:
        self.add = add
        self.totals = totals
        self.overlap = overlap
        self.cap: Capacity | None = None  # None: no segment open
        self.phase = Phase.IDLE
        self.price = self.start = self.end = self.p0 = self.p1 = 0.0

    def tick(
        self,
        cap: Capacity,
        t0: float,
        launching: float,
        gap: float,
        p0: float,
        p1: float,
        price: float,
    ) -> None:
        """One tick from ``t0``: ``launching`` seconds of changeover, then the rest of ``gap``
        running (progress ``p0`` to ``p1``), or idle where ``cap`` is none."""
        if launching > 0:
            if (
                cap is not self.cap
                or self.phase is not LAUNCHING
                or price != self.price
                or abs(t0 - self.end) > 1e-9
            ):
                self.close("")
                self.cap, self.phase, self.price, self.start, self.p0 = (
                    cap,
                    LAUNCHING,
                    price,
                    t0,
                    p0,
                )
            t1 = t0 + launching
            self.end, self.p1 = t1, p0
            if launching >= gap:
                return
        else:
            t1 = t0
        phase = IDLE if cap is NONE else RUNNING
        if (
            cap is not self.cap
            or phase is not self.phase
            or price != self.price
            or abs(t1 - self.end) > 1e-9
        ):
            self.close("")
            self.cap, self.phase, self.price, self.start, self.p0 = cap, phase, price, t1, p0
        self.end, self.p1 = t0 + gap, p1

    def close(self, ended_by: str) -> None:
        """The open segment, if any, ended by ``ended_by``."""
        cap = self.cap
        if cap is None:
            return
        self.cap = None
        totals = self.totals
        if totals is None:
            self.add(
                Segment(
                    cap,
                    self.phase,
                    self.start,
                    self.end,
                    self.p0,
                    self.p1,
                    self.price,
                    ended_by=ended_by,
                    overlap=self.overlap,
                )
            )
            return
        start, end = self.start, self.end  # totals.add(Segment(...)), inlined (never a probe)
        if end < start:
            raise ValueError(f"segment ends ({end}) before it starts ({start})")
        if end == start:
            return
        hours = (end - start) / HOUR
        cost = 0.0 if self.phase is IDLE or cap is NONE else hours * self.price
        totals.cost += cost
        if cap is SPOT:
            totals.spot_h += hours
        elif cap is OD:
            totals.od_h += hours


def sink(
    job: JobSpec, keep_ledger: bool
) -> tuple[Ledger | None, Totals | None, Callable[[Segment], None]]:
    """Where a replay's segments go: ``(ledger, None, its add)`` or ``(None, totals, its
    add)``."""
    if keep_ledger:
        ledger = Ledger(job.work_s, job.deadline_s, job.on_demand_price)
        return ledger, None, ledger.add
    totals = Totals()
    return None, totals, totals.add


def finish(ledger: Ledger | None, totals: Totals | None, end: float | None, probes: int) -> None:
    """A replay's end (``None``: the work was not done) and probes, where its figures go."""
    out = ledger if ledger is not None else totals
    assert out is not None
    out.finished_s = end
    out.probes = probes
