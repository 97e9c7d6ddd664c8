"""Replay a policy over a trace, tick by tick, with the rules of *Can't Be Late*'s simulator.

At every tick boundary ``t`` (``now = t * gap``):

1. The interval ``[t-1, t)`` is billed in full at the price of the capacity that ran in it
   (idle is free). Its progress is ``gap`` minus what was left of the launch's changeover.
2. If spot ran in it and spot is down at ``t``, the instance is reclaimed (preemption at the
   tick boundary: the interval's progress counts).
3. The job ends when the work is done (deadline met) or when ``now`` reaches the deadline.
4. The policy decides for ``[t, t+1)``. Any launch (a capacity other than the one held,
   and not idle), the first one included, starts a changeover of ``changeover_s`` that
   delays progress and is billed at the new capacity's price.

The policy called here is the same :class:`~airflow_spot.policy.Policy` the operator calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_spot.ledger import Ledger, Phase, Segment
from airflow_spot.policy import Capacity, JobSpec, Observation, Policy
from airflow_spot.policy.base import EPS
from airflow_spot.simulate.traces import Trace

NONE, SPOT, OD = Capacity.NONE, Capacity.SPOT, Capacity.ON_DEMAND


class SpotRuns:
    """What a replay has seen of spot's runs: the current one's state and start, and the
    length of the last spot run and outage seen whole (never the run the job starts in)."""

    __slots__ = ("up", "since", "last")

    def __init__(self) -> None:
        self.up: bool | None = None
        self.since = 0.0
        self.last: dict[bool, float | None] = {True: None, False: None}

    def see(self, now: float, up: bool) -> None:
        if up != self.up:
            if self.up is not None and self.since > 0:
                self.last[self.up] = now - self.since
            self.up, self.since = up, now

    def observation(
        self,
        now: float,
        done: float,
        cur: Capacity,
        up: bool,
        rro: float,
        preemptions: int,
        down: float,
    ) -> Observation:
        return Observation(
            now,
            done,
            cur,
            up,
            rro,
            preemptions,
            now - self.since,
            down,
            self.last[True],
            self.last[False],
        )


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
        }


def replay(
    policy: Policy, trace: Trace, job: JobSpec, *, use_trace_prices: bool = False
) -> RunResult:
    """Replay ``policy`` on ``trace`` for ``job``; ticks are the trace's ``gap_s``."""
    gap = trace.gap_s
    if abs(job.tick_s - gap) > 1e-9:
        raise ValueError(f"job.tick_s={job.tick_s} must equal the trace's tick {gap}")
    avail = trace.available.tolist()
    n = len(avail)
    spot_prices = trace.prices.tolist() if (use_trace_prices and trace.prices is not None) else None
    work, deadline, d = job.work_s, job.deadline_s, job.changeover_s
    ledger = Ledger(work, deadline, job.on_demand_price)
    seg = _SegmentBuilder(ledger)
    cur, rro, done, preemptions = NONE, 0.0, 0.0, 0
    work_on = {SPOT: 0.0, OD: 0.0}
    runs, down = SpotRuns(), 0.0
    t = 0
    met = False
    while True:
        now = t * gap
        has = avail[t] if t < n else False
        runs.see(now, has)
        if t > 0 and (t > n or not avail[t - 1]):
            down += gap
        last = cur
        if last is not NONE:
            w = gap - rro if gap > rro else 0.0
            launching = gap - w
            rro = rro - launching
            if rro < EPS:
                rro = 0.0
            if w > work - done:
                w = work - done
            done += w
            work_on[last] += w
            price = (
                job.on_demand_price
                if last is OD
                else (spot_prices[t - 1] if spot_prices else job.spot_price)
            )
            seg.tick(last, now - gap, launching, gap, done - w, done, price)
            if last is SPOT and not has:
                cur = NONE
                preemptions += 1
                seg.close("preempted")
        elif t > 0:
            seg.tick(NONE, now - gap, 0.0, gap, done, done, 0.0)
        if work - done <= EPS:
            met = True
            seg.close("completed")
            break
        if now >= deadline:
            seg.close("deadline")
            break
        obs = runs.observation(now, done, cur, has, rro, preemptions, down)
        req = policy.decide(job, obs).capacity
        if req is not cur:
            if req is not NONE:
                rro = d
            if cur is not NONE:
                seg.close("switched")
        cur = req
        t += 1
    ledger.finished_s = t * gap if met else None
    return RunResult(
        trace=trace.name,
        policy=policy.name,
        deadline_h=deadline / 3600.0,
        changeover_h=d / 3600.0,
        cost=ledger.cost,
        met=met,
        spot_hours=ledger.hours(SPOT),
        on_demand_hours=ledger.hours(OD),
        spot_work_hours=work_on[SPOT] / 3600.0,
        on_demand_work_hours=work_on[OD] / 3600.0,
        preemptions=preemptions,
        finished_h=t * gap / 3600.0,
        on_demand_cost=ledger.on_demand_cost,
        ledger=ledger,
    )


class _SegmentBuilder:
    """Merges consecutive ticks of the same capacity, phase and price into segments."""

    __slots__ = ("ledger", "key", "start", "end", "p0", "p1")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.key: tuple | None = None
        self.start = self.end = self.p0 = self.p1 = 0.0

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
        if launching > 0:
            self._extend((cap, Phase.LAUNCHING, price), t0, t0 + launching, p0, p0)
        if launching < gap:
            phase = Phase.IDLE if cap is NONE else Phase.RUNNING
            self._extend((cap, phase, price), t0 + launching, t0 + gap, p0, p1)

    def _extend(self, key: tuple, t0: float, t1: float, p0: float, p1: float) -> None:
        if key != self.key or abs(t0 - self.end) > 1e-9:
            self.close("")
            self.key, self.start, self.p0 = key, t0, p0
        self.end, self.p1 = t1, p1

    def close(self, ended_by: str) -> None:
        if self.key is None:
            return
        cap, phase, price = self.key
        self.ledger.add(
            Segment(cap, phase, self.start, self.end, self.p0, self.p1, price, ended_by=ended_by)
        )
        self.key = None
