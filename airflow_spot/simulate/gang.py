"""A gang's costs in a replay: N nodes billed, a partial gang's wait, on-demand acquisition.

A gang of ``N`` nodes (:attr:`~airflow_spot.policy.JobSpec.nodes`) replays on the polarized
trace (:meth:`.counts.CountTrace.polarized`: up when at least ``N`` instances are there) with
the rules of one node (:mod:`.engine`), and these costs on top:

* **every node billed**: spot and on-demand per node-hour, so a launch, its changeover (one
  per gang launch), a run and a probe's find all cost ``N`` times a node's;
* **a partial gang**: where provisioning is not atomic (``partial=True``, Karpenter: pods
  are given nodes one by one), a spot request (or probe) that waits for capacity while fewer
  than ``N`` instances are there holds the ones that are, billed at the spot price, until
  the gang is whole (the request is granted) or the policy stops asking. Interval
  ``[t, t+1)`` after a look that left a request waiting holds ``count[t]`` nodes when
  ``count[t] < N`` (at ``N`` or more the request is granted, or a probe found capacity,
  billed as one). The nodes held are waste: the ledger's ``probe`` phase, ended by
  ``partial_gang``. ``partial=False``: atomic provisioning (a ProvisioningRequest, Kueue's
  ``waitForPodsReady``): nothing is held before all ``N`` are. ``partial_end_s``: a cluster
  that says when fewer than ``N`` can come (Karpenter's insufficient-capacity errors, counted
  per NodeClaim: the Kubernetes backend ends such a gang 15 s after its launch) holds the
  nodes there are only that long after each look that asks, not the whole interval; the
  request asked again at the next look (if the policy does) is a new launch;
* **a probe** costs ``N`` placeholders when it finds capacity (``probe="placeholders"``), or
  nothing with a free N-node check that sees the market (``probe="check"``: a bound, not a
  cluster; cluster-autoscaler's ``check-capacity`` ProvisioningRequest sees only nodes already
  in the cluster and never scales up, and its atomic scale-up class provisions the nodes, so
  its find costs what placeholders' does); with the check, a gang waits for spot
  with checks, not a request (it asks for spot at the look that sees all ``N`` there,
  granted then), so it holds no partial gang either;
* **on-demand acquisition** (:class:`Acquire`): ``N`` on-demand nodes may take a while to
  get. A launch of on-demand at tick ``t`` first waits ``A[t]`` whole ticks, billed as the
  launch's changeover (pessimistic: the nodes that came first wait for the last), then pays
  the changeover. ``A`` is fixed or drawn per tick of the window (a property of the market,
  as spot's state is, so the omniscient optimum pays the same delays); the policy is told
  only a margin (:attr:`JobSpec.acquire_s`), which its safety net keeps.
* **a reserved fallback pool** (``reserved_s``: an on-demand capacity reservation or a
  capacity block, whose capacity is already held: the gang comes in a fixed ``reserved_s``,
  boot only): an on-demand launch asks the open pool first and escalates to the reserved pool
  at the last look from which the reserved gang still meets the deadline (the operator knows
  the slack; it needs no draw to see the open pool's nodes have not come). The wait is then
  at most ``reserved_s`` plus the slack the launch had to spare, so the safety net keeps only
  ``reserved_s``; the escalated wait is billed like any other (at the on-demand price, as a
  reservation's instances are), and counted (``escalations``). ``reserved_first``: every
  on-demand launch takes the reservation first and waits only ``reserved_s`` (the Kubernetes
  backend's ``preset="karpenter-reserved"``: Karpenter launches reserved capacity first while
  the reservation lasts; each such launch is counted in ``escalations`` too). The
  reservation's own cost while the job does not use it is not billed: it is shared by the
  jobs that fall back to it.

The observation model decides what waits: under ``oracle`` a decision takes effect at once
and nothing waits, so a partial gang never forms; under ``cluster`` it does.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from airflow_spot.exceptions import ConfigError, finite_number
from airflow_spot.ledger import Phase, Segment
from airflow_spot.policy import Capacity
from airflow_spot.simulate.ticks import Step, changeover_steps
from airflow_spot.simulate.traces import Trace

SPOT = Capacity.SPOT
PROBES = ("placeholders", "check")
Z95 = 1.6448536269514722  # the standard normal's 95th percentile


@dataclass(frozen=True)
class Acquire:
    """The time to acquire a gang's on-demand nodes: ``fixed_s``, or drawn per tick from a
    log-normal with median ``median_s`` and 95th percentile ``p95_s`` (seeded by the window's
    name and ``seed``), rounded up to whole ticks."""

    p95_s: float
    median_s: float | None = None  # None: every acquisition takes p95_s
    seed: int = 0

    def __post_init__(self) -> None:
        if not (finite_number(self.p95_s) and self.p95_s >= 0):
            raise ConfigError("acquire", f"must be >= 0 seconds, got {self.p95_s!r}")
        m = self.median_s
        if m is not None and not (finite_number(m) and 0 < m <= self.p95_s):
            raise ConfigError(
                "acquire_median",
                f"must be > 0 and at most the p95 ({self.p95_s:g} s), got {m!r}",
            )

    @property
    def drawn(self) -> bool:
        return self.median_s is not None and self.median_s < self.p95_s

    def ticks(self, name: str, n: int, gap: float) -> np.ndarray:
        """Whole ticks an on-demand launch at each of ``n`` ticks waits for its nodes."""
        if not self.drawn:
            return np.full(n, math.ceil(self.p95_s / gap - 1e-9), dtype=np.int64)
        assert self.median_s is not None
        sigma = math.log(self.p95_s / self.median_s) / Z95
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        secs = self.median_s * np.exp(sigma * rng.standard_normal(n))
        return np.ceil(secs / gap - 1e-9).astype(np.int64)

    def margin_s(self, gap: float) -> float:
        """What the safety net keeps: the p95, in whole ticks (as the draws are rounded)."""
        return math.ceil(self.p95_s / gap - 1e-9) * gap


@dataclass(frozen=True)
class Gang:
    """The market side of a gang's replay (its size is the job's :attr:`JobSpec.nodes`)."""

    partial: bool = True  # a waiting request holds the nodes there are (not atomic)
    probe: str = "placeholders"  # or "check": a free capacity check
    acquire: Acquire | None = None
    reserved_s: float | None = None  # a reserved fallback pool's time to bring the gang up
    partial_end_s: float | None = None  # a partial gang ended this long after a look (None: held)
    reserved_first: bool = False  # on-demand launches take the reservation first (not last)

    def __post_init__(self) -> None:
        e = self.partial_end_s
        if e is not None and not (finite_number(e) and e > 0):
            raise ConfigError(
                "partial_end",
                f"must be > 0 seconds (how long a partial gang is held before it is ended), "
                f"got {e!r}",
            )
        if self.reserved_first and self.reserved_s is None:
            raise ConfigError(
                "reserved_first", "needs reserved_s (the reserved pool's time to bring the gang up)"
            )
        if self.probe not in PROBES:
            raise ConfigError("probe", f"{self.probe!r} is not one of {', '.join(PROBES)}")
        r = self.reserved_s
        if r is not None and not (finite_number(r) and r >= 0):
            raise ConfigError(
                "reserved", f"must be >= 0 seconds (the reserved pool's boot time), got {r!r}"
            )

    def margin_s(self, gap: float) -> float:
        """What the safety net keeps for the on-demand nodes: the reserved pool's time where
        there is one (an escalation bounds the wait), else the acquisition's p95."""
        if self.reserved_s is not None:
            return math.ceil(self.reserved_s / gap - 1e-9) * gap
        return 0.0 if self.acquire is None else self.acquire.margin_s(gap)


@dataclass(frozen=True)
class GangRun:
    """What one replay needs of a gang, per tick of its window."""

    nodes: int
    held: list[int]  # held[t]: nodes a request waiting over [t, t+1) holds (0: none)
    acquire: list[int] | None  # acquire[t]: ticks an on-demand launch at t waits
    free_probe: bool  # a probe's find costs nothing (a capacity check)
    reserved: int | None = None  # ticks the reserved pool takes (None: no reserved pool)
    escalations: list[int] = field(default_factory=lambda: [0])  # launches escalated, counted
    hold_s: float | None = None  # a partial gang's hold after each look (None: the interval)
    reserved_first: bool = False  # every on-demand launch waits ``reserved`` ticks


def gang_run(trace: Trace, nodes: int, gang: Gang | None) -> GangRun | None:
    """The per-tick figures of ``gang`` on ``trace`` (None: a job of one node, no gang costs:
    the replay is today's to the last bit)."""
    if gang is None and nodes == 1:
        return None
    gang = gang or Gang()
    n = len(trace)
    counts = trace.meta.get("counts")
    if gang.partial and counts is not None and nodes > 1:
        c = np.asarray(counts, dtype=np.int64)
        held = np.where(c < nodes, c, 0)
    else:
        held = np.zeros(n, dtype=np.int64)
    held_l = held.tolist()
    acq = None
    if gang.acquire is not None and gang.acquire.p95_s > 0:
        acq = gang.acquire.ticks(trace.name, n, trace.gap_s).tolist()
    reserved = None
    if gang.reserved_s is not None:
        reserved = round(gang.margin_s(trace.gap_s) / trace.gap_s)
    hold = None if gang.partial_end_s is None else min(gang.partial_end_s, trace.gap_s)
    first = gang.reserved_first
    return GangRun(
        nodes, held_l, acq, gang.probe == "check", reserved, hold_s=hold, reserved_first=first
    )


def launch_steps(gap: float, d: float, run: GangRun | None) -> dict[float, Step]:
    """The changeover table of a replay whose on-demand launches may first wait whole ticks
    of acquisition: the job's own (:func:`.ticks.changeover_steps`) and every ``d + k gap``
    (with a reserved pool, every ``k`` up to the longest wait an escalation leaves)."""
    if run is None or not run.acquire:
        return changeover_steps(gap, d)
    ks = set(run.acquire)
    if run.reserved is not None:
        ks.update(range(max(ks) + 1))
    return _merged(gap, d, tuple(sorted(ks)))


@lru_cache(maxsize=16)
def _merged(gap: float, d: float, ks: tuple[int, ...]) -> dict[float, Step]:
    steps = dict(changeover_steps(gap, d))
    for k in ks:
        steps.update(changeover_steps(gap, d + k * gap))
    return steps


def od_launch_s(d: float, run: GangRun | None, t: int, gap: float, slack: float) -> float:
    """The changeover an on-demand launch at tick ``t`` with ``slack`` seconds to spare
    starts with: the job's, after the acquisition's whole ticks (with a reserved pool, at most
    the ticks the slack spares before the reserved gang must be asked for, plus its own)."""
    if run is None or run.acquire is None:
        return d
    a = run.acquire[t] if t < len(run.acquire) else 0  # past the window: none (as the optimum)
    r = run.reserved
    if r is not None and run.reserved_first:
        run.escalations[0] += 1
        return d + r * gap if r else d
    if r is not None and a > r:
        k = max(int((slack - d) // gap + 1e-9) - r, 0)  # looks the open pool may take
        if k + r < a:
            a = k + r
            run.escalations[0] += 1
    return d + a * gap if a else d


class Waste:
    """The nodes a partial gang holds while its request waits, merged into segments of one
    count and handed to the replay's sink as they close (ledger phase ``probe``, ended by
    ``partial_gang``); ``node_s`` and ``cost`` sum them."""

    __slots__ = ("add", "run", "price", "gap", "k", "start", "end", "done", "node_s", "cost")

    def __init__(self, add: Callable[[Segment], None], run: GangRun, price: float, gap: float):
        self.add, self.run, self.price, self.gap = add, run, price, gap
        self.k, self.start, self.end, self.done = 0, 0.0, 0.0, 0.0
        self.node_s, self.cost = 0.0, 0.0

    def ticks(self, t: int, u: int, done: float) -> None:
        """A request (or probe) waited over ticks ``t .. u-1`` with progress ``done`` (with
        an early end, each tick's look held its nodes ``hold_s``: segments of their own)."""
        held, span = self.run.held, self.run.hold_s or self.gap
        n = len(held)
        for i in range(t, min(u, n)):
            k = held[i]
            t0 = i * self.gap
            if k != self.k or abs(t0 - self.end) > 1e-9:
                self.close()
                if k == 0:
                    continue
                self.k, self.start, self.done = k, t0, done
            self.end = t0 + span

    def close(self) -> None:
        """The open run of held nodes, if any, billed."""
        k = self.k
        if k == 0:
            return
        self.k = 0
        price = k * self.price
        self.add(
            Segment(
                SPOT,
                Phase.PROBE,
                self.start,
                self.end,
                self.done,
                self.done,
                price,
                ended_by="partial_gang",
            )
        )
        self.node_s += k * (self.end - self.start)
        self.cost += (self.end - self.start) / 3600.0 * price
