"""Load spot-availability traces in every format of the shared trace collection.

A :class:`Trace` is a row of ticks of ``gap_s`` seconds, each saying whether spot capacity
was up for the whole tick, plus an optional spot price per tick. Formats:

* JSON ``{"metadata": {"gap_seconds": G}, "data": [...], "prices": [...]?}`` with 0/1 values
  in either polarity (``available``: 1 = spot up; ``unavailable``: 1 = spot down). The file
  does not say which, so the caller must.
* JSON with instance counts (multi-node): the cluster is up only when the count reaches
  ``nodes``, which the caller must give; the counts stay in ``meta["counts"]`` (a gang's
  costs read them: :mod:`.gang`; :mod:`.counts` loads them tagged with their kind).
* CSV ``date,availability`` with one timestamped probe per row (availability polarity). It is
  resampled onto ticks of ``gap_s``: a tick is up only if every probe inside it was up (a
  preemption anywhere in the tick interrupts the job). A sibling ``spot_prices.json`` keyed by
  the file's stem gives the price at every probe.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from airflow_spot.bundled import resolve
from airflow_spot.exceptions import TraceFormatError, finite_number

Polarity = Literal["available", "unavailable"]
POLARITIES: tuple[str, ...] = ("available", "unavailable")


@dataclass(frozen=True)
class Trace:
    """Spot availability per tick (True = spot up for the whole tick)."""

    name: str
    gap_s: float
    available: np.ndarray
    prices: np.ndarray | None = None
    on_demand_price: float | None = None
    source: str = ""
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.available.shape[0])

    @property
    def hours(self) -> float:
        return len(self) * self.gap_s / 3600.0

    def window(self, start: int, length: int, name: str | None = None) -> Trace:
        """The ticks ``[start, start + length)`` as a trace of their own."""
        if start < 0 or length <= 0 or start + length > len(self):
            raise ValueError(
                f"window [{start}, {start + length}) outside trace of {len(self)} ticks"
            )
        prices = None if self.prices is None else self.prices[start : start + length]
        counts = self.meta.get("counts")  # a count trace's window keeps its counts
        return Trace(
            name=name or f"{self.name}[{start}:{start + length}]",
            gap_s=self.gap_s,
            available=self.available[start : start + length],
            prices=prices,
            on_demand_price=self.on_demand_price,
            source=self.source,
            **({} if counts is None else {"meta": {"counts": counts[start : start + length]}}),
        )

    def resample(self, gap_s: float) -> Trace:
        """Coarser ticks: a new tick is up only if every old tick inside it was up."""
        factor = gap_s / self.gap_s
        k = int(round(factor))
        if k < 1 or abs(factor - k) > 1e-9:
            raise ValueError(
                f"can only resample {self.gap_s:g} s ticks by a whole factor, not to {gap_s:g} s"
            )
        n = len(self) // k
        avail = np.asarray(self.available[: n * k].reshape(n, k).all(axis=1), dtype=bool)
        prices = None if self.prices is None else self.prices[: n * k].reshape(n, k).mean(axis=1)
        meta = dict(self.meta)
        if meta.get("counts") is not None:  # the fewest instances inside the new tick
            meta["counts"] = np.asarray(meta["counts"])[: n * k].reshape(n, k).min(axis=1)
        return Trace(self.name, gap_s, avail, prices, self.on_demand_price, self.source, meta)


def load_trace(
    path: str | Path,
    *,
    polarity: Polarity | None = None,
    nodes: int | None = None,
    gap_s: float | None = None,
) -> Trace:
    """Load one trace file (or a ``bundled:<name>`` one); raises :class:`TraceFormatError`
    saying what was expected."""
    p = Path(resolve(str(path)))
    if not p.is_file():
        raise TraceFormatError(
            "trace", f"{p} is not a file; give a .json or .csv trace, or 'bundled:<name>'"
        )
    if polarity is not None and polarity not in POLARITIES:
        raise TraceFormatError("polarity", f"{polarity!r} is not one of {', '.join(POLARITIES)}")
    if p.suffix == ".json":
        return _load_json(p, polarity, nodes)
    if p.suffix == ".csv":
        if polarity == "unavailable":
            raise TraceFormatError(
                "polarity",
                f"{p.name} is a 'date,availability' CSV (1 = spot up); drop --polarity unavailable",
            )
        return _load_csv(p, gap_s)
    raise TraceFormatError(
        "trace", f"{p.name}: expected a .json or .csv trace, got {p.suffix or 'no suffix'!r}"
    )


def load_traces(
    paths: list[str | Path],
    *,
    polarity: Polarity | None = None,
    nodes: int | None = None,
    gap_s: float | None = None,
) -> list[Trace]:
    """Load files and every ``*.json``/``*.csv`` trace directly inside given folders;
    ``bundled:<name>`` names a sample shipped with the package."""
    from airflow_spot.bundled import PREFIX, names, resolve

    out: list[Trace] = []
    for raw in paths:
        p = Path(resolve(str(raw)))
        if str(raw).startswith(PREFIX) and not p.exists():
            raise TraceFormatError(
                "trace", f"{raw}: no such bundled sample; there are {', '.join(names())}"
            )
        if p.is_dir():
            files = sorted(
                (
                    f
                    for f in p.iterdir()
                    if f.suffix in (".json", ".csv") and f.name != "spot_prices.json"
                ),
                key=_natural_key,
            )
            if not files:
                raise TraceFormatError("trace", f"folder {p} holds no .json or .csv traces")
            for f in files:
                t = load_trace(f, polarity=polarity, nodes=nodes, gap_s=gap_s)
                out.append(replace(t, name=f"{p.name}/{t.name}"))
        else:
            out.append(load_trace(p, polarity=polarity, nodes=nodes, gap_s=gap_s))
    return out


def _natural_key(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in _split_digits(p.stem))


def _split_digits(s: str) -> list[str]:
    parts: list[str] = []
    cur = ""
    for ch in s:
        if cur and ch.isdigit() != cur[-1].isdigit():
            parts.append(cur)
            cur = ""
        cur += ch
    return parts + [cur] if cur else parts


def _load_json(p: Path, polarity: Polarity | None, nodes: int | None) -> Trace:
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise TraceFormatError(
            "trace",
            f"{p.name} is not valid JSON ({e}); a JSON trace is "
            '{"metadata": {"gap_seconds": ...}, "data": [...]}',
        ) from e
    if not isinstance(doc, dict) or "data" not in doc or "metadata" not in doc:
        raise TraceFormatError(
            "trace", f'{p.name}: expected {{"metadata": {{"gap_seconds": ...}}, "data": [...]}}'
        )
    meta = doc["metadata"]
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if not finite_number(gap) or gap <= 0:
        raise TraceFormatError("trace", f"{p.name}: metadata.gap_seconds must be a positive number")
    try:
        data = np.asarray(doc["data"])
    except ValueError as e:  # ragged nesting
        raise TraceFormatError("trace", f"{p.name}: data must be a list of numbers ({e})") from e
    if (
        data.ndim != 1
        or data.size == 0
        or data.dtype == bool
        or not np.issubdtype(data.dtype, np.number)
        or not np.isfinite(data).all()
        or (data < 0).any()
        or (data != np.round(data)).any()
    ):
        raise TraceFormatError(
            "trace",
            f"{p.name}: data must be a non-empty list of whole numbers >= 0 "
            "(0/1 flags or instance counts)",
        )
    top = int(data.max())
    own: dict = {"polarity": polarity}  # the Trace's meta (``meta`` is the file's)
    if top > 1 or nodes is not None:
        avail = _counts_to_available(p, data, nodes, polarity)
        own["counts"] = data.astype(np.int64)
    else:
        if polarity is None:
            raise TraceFormatError(
                "polarity",
                f"{p.name} holds 0/1 values and does not say what 1 means; pass "
                "polarity='available' (1 = spot up) or 'unavailable' (1 = spot down); "
                "traces/README.md lists each folder's polarity",
            )
        avail = data == 1 if polarity == "available" else data == 0
    prices = _prices(p, doc.get("prices"), data.size)
    od = None
    info = meta.get("price_info") if isinstance(meta, dict) else None
    if isinstance(info, dict) and info.get("on_demand_price") is not None:
        od = info["on_demand_price"]
        if not finite_number(od) or od <= 0:
            raise TraceFormatError(
                "trace", f"{p.name}: metadata.price_info.on_demand_price must be a positive number"
            )
        od = float(od)
    return Trace(p.stem, float(gap), avail.astype(bool), prices, od, str(p), own)


def _counts_to_available(
    p: Path, data: np.ndarray, nodes: int | None, polarity: Polarity | None
) -> np.ndarray:
    if polarity == "unavailable":
        if int(data.max()) <= 1:  # a 0/1 file read as counts because nodes was given
            raise TraceFormatError(
                "nodes",
                f"{p.name} holds 0/1 flags and polarity='unavailable' says 1 = spot down; "
                "nodes=N reads a file as instance counts: drop nodes for this file",
            )
        raise TraceFormatError(
            "polarity",
            f"{p.name} holds instance counts (availability); drop polarity='unavailable'",
        )
    if nodes is None:
        raise TraceFormatError(
            "nodes",
            f"{p.name} holds instance counts up to {int(data.max())}; pass nodes=N "
            "(the cluster size the job needs; it is up only when the count reaches N)",
        )
    if nodes < 1:
        raise TraceFormatError("nodes", f"must be at least 1, got {nodes}")
    return data >= nodes


def _prices(p: Path, raw: object, n: int) -> np.ndarray | None:
    if raw is None:
        return None
    try:
        arr = np.asarray(raw, dtype=float)
    except (TypeError, ValueError):
        arr = np.array([np.nan])
    if arr.shape != (n,) or not np.isfinite(arr).all() or (arr <= 0).any():
        raise TraceFormatError(
            "trace", f"{p.name}: prices must be {n} positive numbers, one per tick"
        )
    return arr


def _load_csv(p: Path, gap_s: float | None) -> Trace:
    with p.open(newline="", encoding="utf-8-sig") as fh:  # a spreadsheet may add a BOM
        rows = [r for r in csv.reader(fh) if any(c.strip() for c in r)]
    if not rows or [c.strip() for c in rows[0]] != ["date", "availability"]:
        raise TraceFormatError("trace", f"{p.name}: expected a CSV with header 'date,availability'")
    try:
        stamps = np.array([_utc_seconds(r[0]) for r in rows[1:]])
        values = np.array([int(r[1]) for r in rows[1:]])
    except (ValueError, IndexError) as e:
        raise TraceFormatError(
            "trace", f"{p.name}: bad row ({e}); expected 'YYYY-MM-DD HH:MM:SS,0|1'"
        ) from e
    if stamps.size < 2 or (np.diff(stamps) <= 0).any():
        raise TraceFormatError(
            "trace", f"{p.name}: needs at least two rows with increasing timestamps"
        )
    if not np.isin(values, (0, 1)).all():
        raise TraceFormatError("trace", f"{p.name}: availability must be 0 or 1")
    probe_prices = _sibling_prices(p, values.size)
    gap = float(gap_s) if gap_s else float(np.median(np.diff(stamps)))
    tick = ((stamps - stamps[0]) // gap).astype(int)
    n = int(tick[-1]) + 1
    up = np.ones(n, dtype=bool)
    np.logical_and.at(up, tick, values == 1)
    seen = np.zeros(n, dtype=bool)
    seen[tick] = True
    # a tick with no probe keeps the state of the last probe before it
    last = np.maximum.accumulate(np.where(seen, np.arange(n), 0))
    up = np.where(seen, up, (values == 1)[np.searchsorted(tick, last, side="right") - 1])
    prices = None
    if probe_prices is not None:
        sums = np.bincount(tick, probe_prices, n)
        counts = np.bincount(tick, minlength=n)
        prices = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        prices = _ffill(prices)
    start = datetime.fromtimestamp(stamps[0], UTC).isoformat()
    return Trace(
        p.stem, gap, up, prices, None, str(p), {"start": start, "probes": int(values.size)}
    )


def _utc_seconds(text: str) -> float:
    """Seconds since the epoch; a time without a zone is UTC (never the machine's local time,
    whose daylight-saving jumps would make the probes go backwards)."""
    dt = datetime.fromisoformat(text.strip())
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def _ffill(a: np.ndarray) -> np.ndarray:
    idx = np.where(np.isnan(a), 0, np.arange(a.size))
    np.maximum.accumulate(idx, out=idx)
    return a[idx]


def _sibling_prices(p: Path, n: int) -> np.ndarray | None:
    side = p.with_name("spot_prices.json")
    if not side.is_file():
        return None
    table = json.loads(side.read_text())
    if p.stem not in table:
        return None
    arr = np.asarray(table[p.stem], dtype=float)
    if arr.shape != (n,):
        raise TraceFormatError(
            "trace", f"{side.name}[{p.stem}] has {arr.size} prices for {n} probes"
        )
    return arr


def bundled(relative: str = "") -> Path:
    """Path of a trace sample shipped with the package (see ``airflow_spot/data/traces/README.md``)."""
    from airflow_spot.bundled import ROOT

    return ROOT / relative
