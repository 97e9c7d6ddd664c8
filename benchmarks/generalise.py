"""Does ``deadline_aware`` generalise? Fit its prior on one trace family, score it on others.

    python benchmarks/generalise.py [--per-zone 300] [--fits us-west-2a aws-p3 gcp-h100]

Families (``common.py``): ``paper`` = the us-west-2a windows of *Can't Be Late* (prior
``us-west-2a``, fitted on the raw trace they were cut from), ``aws-p3`` and ``gcp-h100`` =
300 random 92 h windows per zone at 600 s ticks. For each prior, every family it was not
fitted on is scored over the 18 cells against Uniform Progress and the omniscient optimum.
The floor share ``f`` and ``settle`` stay at the shipped values (``fit_deadline_aware.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_grid import table  # noqa: E402

from airflow_spot.simulate.sweep import OMNISCIENT  # noqa: E402

SCORED = {"us-west-2a": "paper", "aws-p3": "aws-p3", "gcp-h100": "gcp-h100"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-zone", type=int, default=300)
    ap.add_argument("--fits", nargs="+", default=list(SCORED))
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    results = []
    for family in SCORED.values():
        others = [f for f in args.fits if SCORED[f] != family]
        if not others:
            continue
        policies = ["uniform_progress", *(f"deadline_aware@{f}" for f in others), OMNISCIENT]
        rows = table(
            family, args.per_zone, policies, [f"deadline_aware@{f}" for f in others], args.workers
        )
        results += [{"fit": f, **r} for f, r in zip(others, rows, strict=True)]
    print("generalisation: prior fitted on one family, scored on another (18 cells each)")
    print(
        f"{'fitted on':>11} {'scored on':>10} {'mean vs UP':>11} {'worst cell':>11} {'gap closed':>11} {'misses':>7}"
    )
    for r in results:
        print(
            f"{r['fit']:>11} {r['family']:>10} {100 * r['mean']:+10.2f}% {100 * r['worst']:+10.2f}% "
            f"{100 * r['closed']:10.1f}% {r['misses']:>7}"
        )


if __name__ == "__main__":
    main()
