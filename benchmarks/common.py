"""Evaluation sets shared by the benchmark scripts.

* ``paper``: the us-west-2a windows of *Can't Be Late* (``cant-be-late-windows``).
* ``aws-p3``: 300 random-start windows per zone (92 h, 600 s ticks) cut from
  ``aws-p3-2month`` (its ~195 s probes resampled onto 600 s ticks).
* ``gcp-h100``: the same cut from ``gcp-h100-2week``.
* ``us-west-2a-later``: the same cut from the part of the raw us-west-2a trace after the last
  paper window (for fitting only: never scored as ``paper``).

The full traces are read from ``../shared/traces`` or ``$SPOT_TRACES``.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_spot.simulate.sweep import Setting, random_windows
from airflow_spot.simulate.traces import Trace, load_trace, load_traces

ROOT = Path(
    os.environ.get("SPOT_TRACES", Path(__file__).resolve().parents[1].parent / "shared" / "traces")
)
PAPER_ENVS = ["us-west-2a_k80_1", "us-west-2a_k80_8", "us-west-2a_v100_1", "us-west-2a_v100_8"]
GRID_DEADLINES = (52, 56, 60, 64, 70, 80)
GRID_CHANGEOVERS = (0.05, 0.2, 0.4)
WINDOW_TICKS = 554  # 92.3 h of 600 s ticks, as the paper
# The paper's windows use ticks [3, 1767) of the 27-day us-west-2a trace (windows_index.csv);
# the 14.8 days after them are never scored, so fitting may use them ("us-west-2a-later").
HELD_OUT_FROM = 1767


def grid() -> list[Setting]:
    return [Setting(48.0, dl, co, 0.9731, 3.06) for dl in GRID_DEADLINES for co in GRID_CHANGEOVERS]


def paper_windows(per_env: int | None = None) -> list[Trace]:
    out: list[Trace] = []
    for env in PAPER_ENVS:
        ts = load_traces([ROOT / "cant-be-late-windows" / env], polarity="unavailable")
        out += ts[:per_env] if per_env else ts
    return out


def family_windows(family: str, per_zone: int = 300, seed: int = 0) -> list[Trace]:
    if family == "aws-p3":
        files = sorted((ROOT / "aws-p3-2month").glob("*.csv"))
        traces = [_aws(f) for f in files]
    elif family == "gcp-h100":
        files = sorted((ROOT / "gcp-h100-2week").glob("*.json"))
        traces = [load_trace(f, polarity="unavailable") for f in files]
    elif family == "paper":
        return paper_windows(per_zone)
    elif family == "us-west-2a-later":
        traces = [t.window(HELD_OUT_FROM, len(t) - HELD_OUT_FROM) for t in _us_west_2a()]
    else:
        raise ValueError(f"unknown family {family!r}")
    return [
        w for i, t in enumerate(traces) for w in random_windows(t, per_zone, WINDOW_TICKS, seed + i)
    ]


def family_sequences(family: str) -> list[list[bool]]:
    """Whole availability traces of a family (600 s ticks), for fitting priors."""
    if family == "aws-p3":
        traces = [_aws(f) for f in sorted((ROOT / "aws-p3-2month").glob("*.csv"))]
    elif family == "gcp-h100":
        files = sorted((ROOT / "gcp-h100-2week").glob("*.json"))
        traces = [load_trace(f, polarity="unavailable") for f in files]
    elif family == "us-west-2a":  # the raw trace the paper's windows were cut from
        traces = _us_west_2a()
    elif family == "us-west-2a-later":  # only after the last tick of any paper window
        traces = [t.window(HELD_OUT_FROM, len(t) - HELD_OUT_FROM) for t in _us_west_2a()]
    else:
        raise ValueError(f"unknown family {family!r}")
    return [t.available.tolist() for t in traces]


def _us_west_2a() -> list[Trace]:
    files = sorted((ROOT / "aws-v100-k80-2week").glob("*.json"))
    return [load_trace(f, polarity="available") for f in files]


def _aws(path: Path) -> Trace:
    return load_trace(path, gap_s=600.0)
