"""A spot market replayed from a real trace, with a time scale (pure: time is an argument).

``time_scale`` trace seconds pass per wall second (3600: one trace hour per second). Tick
``offset`` of the trace starts at wall time ``epoch``. Past the trace's end it wraps around.
A count trace (how many nodes could be had, ``nodes`` given) also answers "how many now?"
(:meth:`ReplayMarket.count_at`): a gang is up when the count reaches ``nodes``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class MarketSpec:
    """Everything needed to rebuild the market anywhere (supervisor, trigger, operator)."""

    trace: str  # path to a trace file
    polarity: str | None = "unavailable"
    nodes: int | None = None
    time_scale: float = 3600.0
    epoch: float = 0.0
    offset: int = 0
    spot_price: float | None = None  # None: the trace's own prices if it has them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MarketSpec:
        return cls(**d)


class ReplayMarket:
    """Answers "is spot up at wall time t?" and "when does that next change?"."""

    def __init__(
        self,
        spec: MarketSpec,
        available: list[bool],
        gap_s: float,
        prices: list[float] | None = None,
        counts: list[int] | None = None,
    ) -> None:
        if not available:
            raise ValueError("empty market trace")
        self.spec = spec
        self.available = available
        self.gap_s = gap_s
        self.prices = prices
        self.counts = counts  # nodes that could be had per tick (a count trace only)

    @classmethod
    def load(cls, spec: MarketSpec) -> ReplayMarket:
        from airflow_spot.simulate.traces import load_trace

        t = load_trace(spec.trace, polarity=spec.polarity, nodes=spec.nodes)  # type: ignore[arg-type]
        prices = t.prices.tolist() if t.prices is not None else None
        counts = t.meta.get("counts") if spec.nodes is not None else None
        if spec.nodes is not None and counts is None:
            counts = _json_counts(spec.trace)
        counts = None if counts is None else [int(c) for c in counts]
        return cls(spec, t.available.tolist(), t.gap_s, prices, counts)

    @cached_property
    def tick_wall_s(self) -> float:
        return self.gap_s / self.spec.time_scale

    def tick_at(self, wall: float) -> int:
        return self.spec.offset + max(0, math.floor((wall - self.spec.epoch) / self.tick_wall_s))

    def available_at(self, wall: float) -> bool:
        return self.available[self.tick_at(wall) % len(self.available)]

    def count_at(self, wall: float) -> int:
        """Nodes that could be had at wall time ``wall``: the trace's count, or for a 0/1
        trace all of ``nodes`` (or 1) while up and none while down."""
        k = self.tick_at(wall)
        if self.counts is not None:
            return self.counts[k % len(self.counts)]
        return (self.spec.nodes or 1) if self.available[k % len(self.available)] else 0

    def spot_price_at(self, wall: float, default: float) -> float:
        if self.spec.spot_price is not None:
            return self.spec.spot_price
        if self.prices is None:
            return default
        return self.prices[self.tick_at(wall) % len(self.prices)]

    def next_change(self, wall: float, horizon_ticks: int = 100_000) -> float:
        """Wall time of the next tick whose availability differs from now's."""
        k = self.tick_at(wall)
        now = self.available[k % len(self.available)]
        for j in range(1, horizon_ticks):
            if self.available[(k + j) % len(self.available)] != now:
                return self.spec.epoch + (k + j - self.spec.offset) * self.tick_wall_s
        return math.inf


def _json_counts(path: str) -> list[int] | None:
    """A JSON count trace's counts (the trace loader has checked the file already)."""
    if not path.endswith(".json"):
        return None
    with open(path) as fh:
        return [int(c) for c in json.load(fh)["data"]]


@dataclass(frozen=True)
class Pool:
    """One spot pool (zone, instance type or node pool) replayed from its own trace.

    :param spot_price: price per hour; ``None`` takes the trace's own per-tick prices, or the
        operator's ``spot_price`` when the trace has none.
    """

    name: str
    trace: str
    polarity: str | None = "unavailable"
    spot_price: float | None = None
    price_from: dict[str, Any] | None = None  # live price: {"aws_conn_id", "instance_type", "zone"}


@dataclass(frozen=True)
class PoolsSpec:
    """Several pools on one clock: what the state store keeps for a multi-pool market."""

    pools: tuple[tuple[str, MarketSpec], ...]
    cooldown_wall_s: float
    price_from: tuple[dict[str, Any] | None, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        live = self.price_from or (None,) * len(self.pools)
        return {
            "pools": [
                {"name": n, "spec": s.to_dict(), "price_from": pf}
                for (n, s), pf in zip(self.pools, live, strict=True)
            ],
            "cooldown_wall_s": self.cooldown_wall_s,
        }


class Pools:
    """One or more replayed pools. Spot is up when a pool out of cool-down has capacity; a
    launch goes to the cheapest such pool. A pool's price is live (through an Airflow AWS
    connection, ``price_from``) or the trace's own."""

    def __init__(
        self,
        entries: list[tuple[str, ReplayMarket]],
        cooldown_wall_s: float = 0.0,
        price_from: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.entries = entries
        self.cooldown_wall_s = cooldown_wall_s
        self.price_from = price_from or {}

    @classmethod
    def load(cls, d: dict[str, Any]) -> Pools:
        if "pools" in d:
            return cls(
                [
                    (p["name"], ReplayMarket.load(MarketSpec.from_dict(p["spec"])))
                    for p in d["pools"]
                ],
                float(d.get("cooldown_wall_s", 0.0)),
                {p["name"]: p["price_from"] for p in d["pools"] if p.get("price_from")},
            )
        return cls([("default", ReplayMarket.load(MarketSpec.from_dict(d)))])

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.entries]

    def market(self, name: str) -> ReplayMarket:
        return dict(self.entries)[name]

    def available_at(self, wall: float, cooling: frozenset[str] | set[str] = frozenset()) -> bool:
        return any(m.available_at(wall) for n, m in self.entries if n not in cooling)

    def price(self, name: str, wall: float, default: float, live: Any = None) -> float:
        """The pool's price now: live (``live(price_from)``) if it has a source, else the trace's."""
        if live is not None and name in self.price_from:
            return float(live(self.price_from[name]))
        return self.market(name).spot_price_at(wall, default)

    def choose(
        self,
        wall: float,
        cooling: frozenset[str] | set[str],
        default_price: float,
        live: Any = None,
    ) -> str | None:
        """The cheapest pool with capacity now that is not cooling down (None if there is none)."""
        best: tuple[float, str] | None = None
        for n, m in self.entries:
            if n in cooling or not m.available_at(wall):
                continue
            p = self.price(n, wall, default_price, live)
            if best is None or p < best[0]:
                best = (p, n)
        return None if best is None else best[1]
