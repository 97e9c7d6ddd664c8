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

POLICIES = [
    "greedy",
    "uniform_progress",
    "last_attempt_on_demand",
    "slack_reserve",
    "deadline_aware",
    OMNISCIENT,
]


def per_decision_us(name: str, n: int = 200_000) -> float:
    policy = get_policy(name)
    job = JobSpec(48 * 3600, 60 * 3600, 720)
    obs = [
        Observation(i * 60.0, i * 50.0, Capacity.NONE, i % 3 != 0, 0.0, 0, 600.0, i * 5.0)
        for i in range(2000)
    ]
    policy.decide(job, obs[0])  # the plan is solved once per job shape, not per decision
    t0 = time.perf_counter()
    for i in range(n):
        policy.decide(job, obs[i % 2000])
    return (time.perf_counter() - t0) / n * 1e6


def table(
    family: str, per_zone: int, policies: list[str], targets: list[str], workers: int = 2
) -> list[dict]:
    """Sweep ``policies`` on a family's windows; print the table and each target against UP."""
    traces = family_windows(family, per_zone)
    t0 = time.time()
    rows = sweep(traces, policies, grid(), workers=workers, chunk=400)
    wall = time.time() - t0
    summ = summarise(rows)
    cells = sorted({(r["deadline_h"], r["changeover_h"]) for r in summ})
    by = {(r["policy"], r["deadline_h"], r["changeover_h"]): r for r in summ}
    print(f"family {family}: {len(traces)} windows, {len(cells)} cells\n")
    print("mean normalised cost (cost / 48 h on-demand) [gap to omniscient] misses")
    print(f"{'cell':>11} " + " ".join(f"{p[:24]:>24}" for p in policies))
    for dl, co in cells:
        parts = []
        for p in policies:
            r = by[(p, dl, co)]
            gap = "" if p == OMNISCIENT else f"[{100 * r['gap_to_omniscient']:5.1f}%]"
            parts.append(f"{r['normalized_cost']:.4f} {gap:>8} {r['misses']:>3}")
        print(f"{dl:>4g}h/{co:<4g}h " + " ".join(f"{x:>24}" for x in parts))
    every = sum(r["misses"] for r in summ)
    print(f"\nmissed deadlines, all policies and cells: {every}")
    out = []
    for target in targets:
        rel = np.array(
            [
                by[(target, dl, co)]["mean_cost"] / by[("uniform_progress", dl, co)]["mean_cost"]
                - 1
                for dl, co in cells
            ]
        )
        gap_up = np.array(
            [by[("uniform_progress", dl, co)]["gap_to_omniscient"] for dl, co in cells]
        )
        gap_da = np.array([by[(target, dl, co)]["gap_to_omniscient"] for dl, co in cells])
        closed = 1 - gap_da / gap_up
        misses = sum(by[(target, dl, co)]["misses"] for dl, co in cells)
        print(f"\n{target} vs uniform_progress on {family}, per cell (mean cost ratio - 1):")
        print("  " + " ".join(f"{100 * x:+.2f}%" for x in rel))
        print(
            f"  mean {100 * rel.mean():+.2f}%   worst cell {100 * rel.max():+.2f}%   "
            f"best cell {100 * rel.min():+.2f}%"
        )
        print(
            f"  share of UP's gap to omniscient closed: mean {100 * closed.mean():.1f}% "
            f"(min {100 * closed.min():.1f}%)"
        )
        print(f"  misses of {target}, all cells: {misses}")

        out.append(
            {
                "family": family,
                "target": target,
                "mean": float(rel.mean()),
                "worst": float(rel.max()),
                "closed": float(closed.mean()),
                "misses": misses,
            }
        )
    print(f"sweep wall time: {wall:.1f} s on {workers} workers ({len(rows)} runs)\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="paper")
    ap.add_argument("--per-zone", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    table(args.family, args.per_zone, POLICIES, ["deadline_aware"], args.workers)
    for p in ("greedy", "uniform_progress", "slack_reserve", "deadline_aware"):
        print(f"time per decision, {p}: {per_decision_us(p):.2f} us")


if __name__ == "__main__":
    main()
