"""The policy benchmark: every policy on the paper's grid, with the omniscient optimum.

    python benchmarks/policy_grid.py [--family paper|aws-p3|gcp-h100] [--per-zone N]

Job 48 h; deadlines 52, 56, 60, 64, 70, 80 h; changeovers 0.05, 0.2, 0.4 h; spot $0.9731/h,
on-demand $3.06/h. Prints per cell the mean normalised cost, the gap to the omniscient
optimum and the misses of each policy, then ``deadline_aware`` against Uniform Progress,
the wall time of the sweep, and the time per decision.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import family_windows, grid  # noqa: E402

from airflow_spot.policy import Capacity, JobSpec, Observation, get_policy  # noqa: E402
from airflow_spot.simulate.sweep import OMNISCIENT, summarise, sweep  # noqa: E402

POLICIES = ["greedy", "uniform_progress", "last_attempt_on_demand", "deadline_aware", OMNISCIENT]


def per_decision_us(name: str, n: int = 200_000) -> float:
    policy = get_policy(name)
    job = JobSpec(48 * 3600, 60 * 3600, 720)
    obs = [
        Observation(i * 60.0, i * 50.0, Capacity.NONE, i % 3 != 0, 0.0, 0, 600.0, i * 5.0)
        for i in range(2000)
    ]
    t0 = time.perf_counter()
    for i in range(n):
        policy.decide(job, obs[i % 2000])
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="paper")
    ap.add_argument("--per-zone", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    traces = family_windows(args.family, args.per_zone)
    t0 = time.time()
    rows = sweep(traces, POLICIES, grid(), workers=args.workers)
    wall = time.time() - t0
    summ = summarise(rows)
    cells = sorted({(r["deadline_h"], r["changeover_h"]) for r in summ})
    by = {(r["policy"], r["deadline_h"], r["changeover_h"]): r for r in summ}
    print(f"family {args.family}: {len(traces)} windows, {len(cells)} cells\n")
    print("mean normalised cost (cost / 48 h on-demand) [gap to omniscient] misses")
    print(f"{'cell':>11} " + " ".join(f"{p:>24}" for p in POLICIES))
    for dl, co in cells:
        parts = []
        for p in POLICIES:
            r = by[(p, dl, co)]
            gap = "" if p == OMNISCIENT else f"[{100 * r['gap_to_omniscient']:5.1f}%]"
            parts.append(f"{r['normalized_cost']:.4f} {gap:>8} {r['misses']:>3}")
        print(f"{dl:>4g}h/{co:<4g}h " + " ".join(f"{x:>24}" for x in parts))
    rel = np.array(
        [
            by[("deadline_aware", dl, co)]["mean_cost"]
            / by[("uniform_progress", dl, co)]["mean_cost"]
            - 1
            for dl, co in cells
        ]
    )
    gap_up = np.array([by[("uniform_progress", dl, co)]["gap_to_omniscient"] for dl, co in cells])
    gap_da = np.array([by[("deadline_aware", dl, co)]["gap_to_omniscient"] for dl, co in cells])
    closed = 1 - gap_da / gap_up
    misses = sum(by[(p, dl, co)]["misses"] for p in POLICIES for dl, co in cells)
    print("\ndeadline_aware vs uniform_progress, per cell (mean cost ratio - 1):")
    print("  " + " ".join(f"{100 * x:+.2f}%" for x in rel))
    print(
        f"  mean {100 * rel.mean():+.2f}%   worst cell {100 * rel.max():+.2f}%   best cell {100 * rel.min():+.2f}%"
    )
    print(
        f"  share of UP's gap to omniscient closed: mean {100 * closed.mean():.1f}% (min {100 * closed.min():.1f}%)"
    )
    print(f"  misses, all policies and cells: {misses}")
    print(f"\nsweep wall time: {wall:.1f} s on {args.workers} workers ({len(rows)} runs)")
    for p in ("greedy", "uniform_progress", "deadline_aware"):
        print(f"time per decision, {p}: {per_decision_us(p):.2f} us")


if __name__ == "__main__":
    main()
