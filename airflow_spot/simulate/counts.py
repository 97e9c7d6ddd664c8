"""Instance-count traces for gangs: load them, tag them, map them to a gang's up and down.

A count trace holds, per tick, how many instances of a pool there were. Two kinds exist, and
they answer different questions, so they are tagged and never compared with each other:

* ``availability``: how many instances could be had (a probe's count: the GCP A100 files);
* ``preemption``: how many instances of a cluster kept by its owner survive (the AWS p3
  4-node files: a 4-node cluster, relaunched when it dropped).

The file does not say which it is: the caller does (``kind``), or the folder's known name
(:data:`KNOWN_KINDS`, from ``traces/README.md`` and the research note) does.

A gang of ``nodes`` runs only when all its nodes can: :meth:`CountTrace.polarized` gives the
polarized mapping (*Can't Be Late*'s rule: up when the count is at least ``nodes``), a
:class:`~.traces.Trace` that every policy replays unchanged, with the counts kept beside it
(``meta["counts"]``) for the gang's costs (:mod:`.gang`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from airflow_spot.bundled import resolve
from airflow_spot.exceptions import TraceFormatError
from airflow_spot.simulate.traces import Trace, load_trace

Kind = Literal["availability", "preemption"]
KINDS: tuple[str, ...] = ("availability", "preemption")
# the folders of the shared traces whose kind is known (README and research note, §3.1)
KNOWN_KINDS: dict[str, Kind] = {"aws-p3-4node": "preemption", "gcp-a100": "availability"}


@dataclass(frozen=True)
class CountTrace:
    """Instances per tick of ``gap_s`` seconds, tagged with what the count means."""

    name: str
    gap_s: float
    counts: np.ndarray  # whole numbers >= 0
    kind: Kind
    source: str = ""
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    def polarized(self, nodes: int) -> Trace:
        """The gang's up and down: up when at least ``nodes`` instances are there."""
        _check_nodes(nodes)
        meta = {**self.meta, "kind": self.kind, "nodes": nodes, "counts": self.counts}
        return Trace(self.name, self.gap_s, self.counts >= nodes, None, None, self.source, meta)

    def all_or_none(self, nodes: int) -> float:
        """The share of ticks with all ``nodes`` or none of them (the polarization the
        research note measures, §3.2)."""
        _check_nodes(nodes)
        c = self.counts
        return float(np.mean((c == 0) | (c >= nodes)))

    def shares(self, nodes: int) -> dict[str, float]:
        """Shares of ticks with the full gang, none, at least half of it (but not all), and
        all-or-none."""
        c = self.counts
        return {
            "full": float(np.mean(c >= nodes)),
            "zero": float(np.mean(c == 0)),
            "half": float(np.mean((c >= nodes / 2) & (c < nodes))),
            "all_or_none": self.all_or_none(nodes),
        }


def load_counts(path: str | Path, kind: Kind | None = None) -> CountTrace:
    """One count file (JSON ``{"metadata": {"gap_seconds": G}, "data": [counts]}``), tagged
    ``kind`` (default: its folder's, where :data:`KNOWN_KINDS` knows it)."""
    p = Path(resolve(str(path)))
    kind = _kind(p, kind)
    # the trace loader checks the file (and its numbers) and names what is wrong
    load_trace(p, nodes=1)
    doc = json.loads(p.read_text())
    counts = np.asarray(doc["data"]).astype(np.int64)
    gap = float(doc["metadata"]["gap_seconds"])
    return CountTrace(p.stem, gap, counts, kind, str(p), {"folder": p.parent.name})


def load_count_folder(path: str | Path, kind: Kind | None = None) -> list[CountTrace]:
    """Every ``*.json`` count file directly inside a folder, in name order, all of one kind."""
    p = Path(resolve(str(path)))
    if not p.is_dir():
        return [load_counts(p, kind)]
    files = sorted(f for f in p.iterdir() if f.suffix == ".json")
    if not files:
        raise TraceFormatError("trace", f"folder {p} holds no .json count traces")
    return [load_counts(f, kind) for f in files]


def same_kind(traces: list[CountTrace]) -> Kind:
    """The one kind all ``traces`` share; mixing them is an error (an availability count and a
    survival count do not measure the same thing)."""
    kinds = sorted({t.kind for t in traces})
    if len(kinds) != 1:
        raise TraceFormatError(
            "kind",
            f"count traces of different kinds ({', '.join(kinds)}) are never compared: an "
            "availability count says how many could be had, a preemption count how many of a "
            "kept cluster survive; simulate them separately",
        )
    return kinds[0]  # type: ignore[return-value]


def _kind(p: Path, kind: str | None) -> Kind:
    if kind is None:
        known = KNOWN_KINDS.get(p.parent.name)
        if known is None:
            raise TraceFormatError(
                "kind",
                f"{p.name}: say what its counts mean: kind='availability' (how many could be "
                "had) or 'preemption' (how many of a kept cluster survive)",
            )
        return known
    if kind not in KINDS:
        raise TraceFormatError("kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    return kind  # type: ignore[return-value]


def _check_nodes(nodes: int) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise TraceFormatError("nodes", f"must be a whole number >= 1, got {nodes!r}")


def check_kinds(traces: list[Trace]) -> None:
    """Count traces loaded by :func:`~.traces.load_traces` whose folders' kinds are known
    (:data:`KNOWN_KINDS`) must share one kind (see :func:`same_kind`)."""
    kinds = {
        KNOWN_KINDS[Path(t.source).parent.name]
        for t in traces
        if t.meta.get("counts") is not None and Path(t.source).parent.name in KNOWN_KINDS
    }
    if len(kinds) > 1:
        same_kind([CountTrace("", 1.0, np.zeros(0), k) for k in sorted(kinds)])  # type: ignore[arg-type]
