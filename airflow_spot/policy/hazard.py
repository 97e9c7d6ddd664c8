"""A semi-Markov model of spot availability: the chance that the current run ends, by its age.

Spot availability is far from memoryless: a spot run (or an outage) that has just begun is
much likelier to end at the next look than one that has lasted hours. The model keeps, for
runs of availability (``up``) and runs of unavailability (``down``) separately, the hazard
``h[b]``: the chance that a run whose age (in decision intervals) falls in bucket ``b`` ends
before the next interval. Buckets are narrow for young runs and widen geometrically.

Runs are not independent either: after a short spot run the next one is short more often
(0.5-0.7 of them last at most two looks, against 0.3-0.4 after a long one, in every trace
family), and a spot run that follows a long outage is shorter than one that follows a
blip. So the model also keeps the hazards by **context**: whether the last run of the same
kind, and the last run of the other kind, were short (at most ``short_s``). Four contexts,
each with its own hazards per bucket; a run whose neighbours were not seen whole (the run a
job starts in) counts as long.

:func:`fit` estimates the hazards from availability sequences (events / exposure per bucket,
runs cut by the end of a sequence count as exposure only, the run a sequence starts in is
skipped because its age is unknown; context hazards are shrunk toward the plain ones where
the data is thin). :meth:`HazardModel.for_tick` carries a model to another decision interval.

Pure Python: nothing here imports numpy, Airflow or a cloud SDK, and nothing reads a clock.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

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
    # hazards by context: 8 tables, index 4 * up + 2 * (last run of this kind short)
    # + (last run of the other kind short); empty: one context, the plain hazards
    context: tuple[tuple[float, ...], ...] = ()
    short_s: float = 1200.0  # a run of at most this long is short

    def __post_init__(self) -> None:
        n = len(self.edges)
        if len(self.up) != n or len(self.down) != n:
            raise ValueError(f"need {n} hazards per state, got {len(self.up)} and {len(self.down)}")
        if self.context and (len(self.context) != 8 or any(len(t) != n for t in self.context)):
            raise ValueError(f"context hazards must be 8 tables of {n}")
        for h in (*self.up, *self.down, *(x for t in self.context for x in t)):
            if not 0.0 < h < 1.0:
                raise ValueError(f"hazards must lie in (0, 1), got {h}")

    @property
    def contexts(self) -> int:
        """Number of contexts (4 with context hazards, else 1)."""
        return 4 if self.context else 1

    def context_of(self, last_up_s: float | None, last_down_s: float | None) -> int:
        """The context index ``2 * (last spot run short) + (last outage short)``."""
        if not self.context:
            return 0
        short_up = last_up_s is not None and last_up_s <= self.short_s + 1e-6
        short_down = last_down_s is not None and last_down_s <= self.short_s + 1e-6
        return 2 * short_up + short_down

    def after_run(self, k: int, up: bool, short: bool) -> int:
        """The context once a spot run (``up``) or an outage, short or not, ends in context ``k``."""
        if not self.context:
            return 0
        short_up, short_down = divmod(k, 2)
        return 2 * short + short_down if up else 2 * short_up + short

    def table(self, up: bool, k: int = 0) -> tuple[float, ...]:
        """Hazards per bucket of an up (or down) run in context ``k``."""
        if not self.context:
            return self.up if up else self.down
        short_up, short_down = divmod(k, 2)
        same, other = (short_up, short_down) if up else (short_down, short_up)
        return self.context[4 * up + 2 * same + other]

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

        def carry(hs: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(_clip(1 - (1 - hs[b]) ** r) for b in src)

        return HazardModel(
            carry(self.up),
            carry(self.down),
            tick_s,
            edges,
            f"{self.source} @{tick_s:g}s",
            context=tuple(carry(t) for t in self.context),
            short_s=self.short_s,
        )

    def hazard(self, up: bool, b: int, k: int = 0) -> float:
        return self.table(up, k)[b]

    def expected_left_s(self, up: bool, age_s: float, k: int = 0, horizon: int = 2000) -> float:
        """Expected time until the current run ends, given its age and context (for reasons)."""
        hs = self.table(up, k)
        b = self.bucket(age_s)
        mass, dist = 1.0, {b: 1.0}
        total = 0.0
        for _ in range(horizon):
            nxt: dict[int, float] = {}
            for j, p in dist.items():
                a = self.advance(j)
                go = p * (1 - hs[j])
                nxt[j] = nxt.get(j, 0.0) + go * (1 - a)
                if a:
                    nxt[j + 1] = nxt.get(j + 1, 0.0) + go * a
            mass = sum(nxt.values())
            total += mass
            dist = nxt
            if mass < 1e-6:
                break
        return (total + 0.5) * self.tick_s

    def p_up(self, up: bool, age_s: float, k: int, elapsed_s: float) -> float:
        """The belief: the chance spot is up ``elapsed_s`` after it was last seen ``up`` (or
        down) in a run of ``age_s``, in context ``k`` (the semi-Markov model run forward; a
        run's length decides whether it counts as short when it ends)."""
        steps = int(elapsed_s / self.tick_s + 0.5)
        return _p_up_series(self, up, self.bucket(age_s), k)[min(max(steps, 0), P_UP_STEPS)]

    def to_json(self) -> dict:
        return {
            "tick_s": self.tick_s,
            "edges": list(self.edges),
            "up": list(self.up),
            "down": list(self.down),
            "source": self.source,
            "counts": self.counts,
            "context": [list(t) for t in self.context],
            "short_s": self.short_s,
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
            tuple(tuple(t) for t in d.get("context", ())),
            float(d.get("short_s", 1200.0)),
        )


P_UP_STEPS = 400  # the belief is run forward at most this many intervals


@lru_cache(maxsize=1024)
def _p_up_series(model: HazardModel, up: bool, b: int, k: int) -> tuple[float, ...]:
    """The chance spot is up after 0, 1, .. :data:`P_UP_STEPS` intervals from state
    ``(up, k, b)``: one forward run serves every elapsed time (a live job asks again at
    each look, a little later each time)."""
    nb = len(model.edges)
    dist: dict[tuple[bool, int, int], float] = {(up, k, b): 1.0}
    out = [sum(p for (u, _, _), p in dist.items() if u)]
    for _ in range(P_UP_STEPS):
        nxt: dict[tuple[bool, int, int], float] = {}
        for (u, c, j), p in dist.items():
            h = model.table(u, c)[j]
            short = (model.edges[j] + 1) * model.tick_s <= model.short_s + 1e-6
            flip = (not u, model.after_run(c, u, short), 0)
            nxt[flip] = nxt.get(flip, 0.0) + p * h
            a = model.advance(j)
            stay = (u, c, j)
            nxt[stay] = nxt.get(stay, 0.0) + p * (1 - h) * (1 - a)
            if a and j + 1 < nb:
                on = (u, c, j + 1)
                nxt[on] = nxt.get(on, 0.0) + p * (1 - h) * a
        dist = nxt
        out.append(sum(p for (u, _, _), p in dist.items() if u))
    return tuple(out)


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
    context: bool = True,
    short_s: float = 1200.0,
    context_prior: float = 5.0,
) -> HazardModel:
    """Hazards per bucket from availability sequences (True = spot up), one per trace.

    Each bucket's hazard is (events + ``prior_events`` x pooled rate) / (exposure +
    ``prior_events``), so an empty bucket falls back to the pooled rate of its state. With
    ``context``, the hazards of runs whose two previous runs were seen whole are also
    counted by context, each shrunk toward the plain hazard with ``context_prior``
    intervals of exposure.
    """
    nb = len(edges)
    short = short_s / tick_s + 1e-9
    ev = [[0.0] * nb for _ in range(10)]  # 0/1: plain down/up; 2 + context table index
    ex = [[0.0] * nb for _ in range(10)]
    n_runs = {True: 0, False: 0}
    for seq in sequences:
        rs = runs(seq)
        for i in range(1, len(rs)):  # the first run's age is unknown
            up, length, ended = rs[i]
            n_runs[up] += 1
            into = [int(up)]
            if context and i >= 3:  # runs i-1 and i-2 were seen whole
                into.append(2 + 4 * up + 2 * (rs[i - 2][1] <= short) + (rs[i - 1][1] <= short))
            for t in into:
                for b, lo in enumerate(edges):
                    hi = edges[b + 1] if b + 1 < nb else 1 << 30
                    ex[t][b] += max(0, min(length, hi) - lo)
                if ended:
                    ev[t][bisect.bisect_right(edges, length - 1) - 1] += 1
    plain = []
    for a in (0, 1):
        pooled = (sum(ev[a]) + 1.0) / (sum(ex[a]) + 2.0)
        plain.append(
            tuple(
                _clip((e + prior_events * pooled) / (x + prior_events))
                for e, x in zip(ev[a], ex[a], strict=True)
            )
        )
    tables: tuple[tuple[float, ...], ...] = ()
    if context:
        tables = tuple(
            tuple(
                _clip((e + context_prior * h) / (x + context_prior))
                for e, x, h in zip(ev[2 + t], ex[2 + t], plain[t // 4], strict=True)
            )
            for t in range(8)
        )
    return HazardModel(
        plain[1],
        plain[0],
        tick_s,
        edges,
        source,
        {"up_runs": n_runs[True], "down_runs": n_runs[False]},
        tables,
        short_s,
    )


def prior(name: str = "default") -> HazardModel:
    """A fitted prior shipped with the package (``priors/<name>.json``)."""
    from airflow_spot.policy import priors

    return HazardModel.from_json(json.loads(priors.path(name).read_text()))
