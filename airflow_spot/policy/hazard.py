"""A semi-Markov model of spot availability: the chance that the current run ends, by its age.

Spot availability is far from memoryless: a spot run (or an outage) that has just begun is
much likelier to end at the next look than one that has lasted hours. The model keeps, for
runs of availability (``up``) and runs of unavailability (``down``) separately, the hazard
``h[b]``: the chance that a run whose age (in decision intervals) falls in bucket ``b`` ends
before the next interval. Buckets are narrow for young runs and widen geometrically.

:func:`fit` estimates the hazards from availability sequences (events / exposure per bucket,
runs cut by the end of a sequence count as exposure only, the run a sequence starts in is
skipped because its age is unknown). :meth:`HazardModel.for_tick` carries a model to
another decision interval.

Pure Python: nothing here imports numpy, Airflow or a cloud SDK, and nothing reads a clock.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# First age (in decision intervals) of each bucket.
EDGES: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 9, 13, 19, 28, 42, 63, 95, 144)


@dataclass(frozen=True)
class HazardModel:
    """Per-bucket hazards of up runs and down runs, for decision intervals of ``tick_s``."""

    up: tuple[float, ...]
    down: tuple[float, ...]
    tick_s: float = 600.0
    edges: tuple[int, ...] = EDGES
    source: str = ""
    counts: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = len(self.edges)
        if len(self.up) != n or len(self.down) != n:
            raise ValueError(f"need {n} hazards per state, got {len(self.up)} and {len(self.down)}")
        for h in (*self.up, *self.down):
            if not 0.0 < h < 1.0:
                raise ValueError(f"hazards must lie in (0, 1), got {h}")

    def bucket(self, age_s: float) -> int:
        """The bucket of a run that has lasted ``age_s`` seconds."""
        k = int(age_s / self.tick_s + 1e-6)
        return bisect.bisect_right(self.edges, k) - 1

    def advance(self, b: int) -> float:
        """Chance that a run in bucket ``b`` that goes on moves to bucket ``b + 1``."""
        if b + 1 >= len(self.edges):
            return 0.0
        return 1.0 / (self.edges[b + 1] - self.edges[b])

    def for_tick(self, tick_s: float) -> HazardModel:
        """The model for decision intervals of ``tick_s`` (hazards compounded, ages kept in time)."""
        if abs(tick_s - self.tick_s) < 1e-9:
            return self
        r = tick_s / self.tick_s
        edges = tuple(sorted({int(e / r) for e in self.edges}))
        src = [bisect.bisect_right(self.edges, int(e * r)) - 1 for e in edges]
        return HazardModel(
            tuple(_clip(1 - (1 - self.up[b]) ** r) for b in src),
            tuple(_clip(1 - (1 - self.down[b]) ** r) for b in src),
            tick_s,
            edges,
            f"{self.source} @{tick_s:g}s",
        )

    def hazard(self, up: bool, b: int) -> float:
        return self.up[b] if up else self.down[b]

    def expected_left_s(self, up: bool, age_s: float, horizon: int = 2000) -> float:
        """Expected time until the current run ends, given its age (for reasons and the UI)."""
        b = self.bucket(age_s)
        mass, dist = 1.0, {b: 1.0}
        total = 0.0
        for _ in range(horizon):
            nxt: dict[int, float] = {}
            for k, p in dist.items():
                h = self.hazard(up, k)
                a = self.advance(k)
                go = p * (1 - h)
                nxt[k] = nxt.get(k, 0.0) + go * (1 - a)
                if a:
                    nxt[k + 1] = nxt.get(k + 1, 0.0) + go * a
            mass = sum(nxt.values())
            total += mass
            dist = nxt
            if mass < 1e-6:
                break
        return (total + 0.5) * self.tick_s

    def to_json(self) -> dict:
        return {
            "tick_s": self.tick_s,
            "edges": list(self.edges),
            "up": list(self.up),
            "down": list(self.down),
            "source": self.source,
            "counts": self.counts,
        }

    @classmethod
    def from_json(cls, d: dict) -> HazardModel:
        return cls(
            tuple(d["up"]),
            tuple(d["down"]),
            float(d["tick_s"]),
            tuple(d["edges"]),
            d.get("source", ""),
            d.get("counts", {}),
        )


def _clip(h: float) -> float:
    return min(max(h, 1e-5), 0.995)


def runs(seq: Sequence[bool]) -> list[tuple[bool, int, bool]]:
    """``(up, length, ended)`` for each run of a 0/1 sequence (``ended``: seen to end)."""
    out: list[tuple[bool, int, bool]] = []
    i, n = 0, len(seq)
    while i < n:
        j = i
        while j < n and bool(seq[j]) == bool(seq[i]):
            j += 1
        out.append((bool(seq[i]), j - i, j < n))
        i = j
    return out


def fit(
    sequences: Iterable[Sequence[bool]],
    tick_s: float = 600.0,
    edges: tuple[int, ...] = EDGES,
    source: str = "",
    prior_events: float = 0.5,
) -> HazardModel:
    """Hazards per bucket from availability sequences (True = spot up), one per trace.

    Each bucket's hazard is (events + ``prior_events`` x pooled rate) / (exposure +
    ``prior_events``), so an empty bucket falls back to the pooled rate of its state.
    """
    ev = {True: [0.0] * len(edges), False: [0.0] * len(edges)}
    ex = {True: [0.0] * len(edges), False: [0.0] * len(edges)}
    n_runs = {True: 0, False: 0}
    for seq in sequences:
        rs = runs(seq)
        for up, length, ended in rs[1:]:  # the first run's age is unknown
            n_runs[up] += 1
            for b, lo in enumerate(edges):
                hi = edges[b + 1] if b + 1 < len(edges) else 1 << 30
                ex[up][b] += max(0, min(length, hi) - lo)
            if ended:
                ev[up][bisect.bisect_right(edges, length - 1) - 1] += 1
    hazards = {}
    for up in (True, False):
        pooled = (sum(ev[up]) + 1.0) / (sum(ex[up]) + 2.0)
        hazards[up] = tuple(
            _clip((e + prior_events * pooled) / (x + prior_events))
            for e, x in zip(ev[up], ex[up], strict=True)
        )
    return HazardModel(
        hazards[True],
        hazards[False],
        tick_s,
        edges,
        source,
        {"up_runs": n_runs[True], "down_runs": n_runs[False]},
    )


PRIORS_DIR = Path(__file__).resolve().parent / "priors"


def prior(name: str = "default") -> HazardModel:
    """A fitted prior shipped with the package (``priors/<name>.json``)."""
    path = PRIORS_DIR / f"{name}.json"
    if not path.is_file():
        names = sorted(p.stem for p in PRIORS_DIR.glob("*.json"))
        raise ValueError(f"unknown availability prior {name!r}; choose one of {', '.join(names)}")
    return HazardModel.from_json(json.loads(path.read_text()))
