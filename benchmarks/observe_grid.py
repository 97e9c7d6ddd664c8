"""What a policy earns as a cluster shows spot (``--observe cluster``) against the paper's
oracle (``--observe oracle``), for greedy, uniform_progress and deadline_aware.

    python benchmarks/observe_grid.py [--family paper|aws-p3|gcp-h100 ...] [--per-zone N]

Per family and observation model: per cell the mean normalised cost and misses; then per
policy the mean cost, savings, gap to the omniscient optimum, misses, probes and probe cost
over the cells, the targets of issue 19, and the time per decision.
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

POLICIES = ["greedy", "uniform_progress", "deadline_aware"]
MODELS = ["oracle", "cluster"]
SHORT = {"oracle": "orac", "cluster": "clus", "cluster-bbm": "bbm"}
# --ablation adds "cluster-bbm": the cluster's view of spot with break-before-make returns, to
# tell what partial observation costs from what make-before-break returns win


def per_decision_us(name: str, unseen: bool, n: int = 100_000) -> float:
    """Mean microseconds per decide(), spot seen (every third look down) or unseen."""
    policy = get_policy(name)
    job = JobSpec(48 * 3600, 60 * 3600, 720)
    obs = [
        Observation(
            i * 60.0,
            i * 50.0,
            Capacity.ON_DEMAND if unseen else Capacity.NONE,
            None if unseen else i % 3 != 0,
            0.0,
            0,
            600.0,
            i * 5.0,
            spot_unseen_s=600.0 * (i % 7) if unseen else 0.0,
            spot_seen=(i % 2 == 0) if unseen else i % 3 != 0,
            spot_source="probe",
        )
        for i in range(2000)
    ]
    policy.decide(job, obs[0])
    t0 = time.perf_counter()
    for i in range(n):
        policy.decide(job, obs[i % 2000])
    return (time.perf_counter() - t0) / n * 1e6


def family_table(family: str, per_zone: int, workers: int) -> dict:
    traces = family_windows(family, per_zone)
    t0 = time.time()
    rows = sweep(
        traces, [*POLICIES, OMNISCIENT], grid(), observe=MODELS, workers=workers, chunk=200
    )
    wall = time.time() - t0
    summ = summarise(rows)
    cells = sorted({(r["deadline_h"], r["changeover_h"]) for r in summ})
    by = {(r["policy"], r["observe"], r["deadline_h"], r["changeover_h"]): r for r in summ}
    cols = [(p, m) for m in MODELS for p in POLICIES]
    print(f"\n## family {family}: {len(traces)} windows, {len(cells)} cells, sweep {wall:.0f} s")
    print("mean normalised cost per cell (misses)")
    print(f"{'cell':>11} " + " ".join(f"{(p[:7] + '/' + SHORT[m]):>15}" for p, m in cols))
    for dl, co in cells:
        print(
            f"{dl:>4g}h/{co:<4g}h "
            + " ".join(
                f"{by[(p, m, dl, co)]['normalized_cost']:.4f} ({by[(p, m, dl, co)]['misses']:>2})".rjust(
                    15
                )
                for p, m in cols
            )
        )
    print(
        f"\n{'policy':>17} {'observe':>8} {'mean cost':>9} {'savings':>8} {'gap omni':>8} "
        f"{'misses':>6} {'probes':>7} {'probe $':>8}"
    )
    out: dict = {}
    for m in MODELS:
        for p in POLICIES:
            rs = [by[(p, m, dl, co)] for dl, co in cells]
            mean = float(np.mean([r["mean_cost"] for r in rs]))
            sav = float(np.mean([r["savings"] for r in rs]))
            gap = float(np.mean([r["gap_to_omniscient"] for r in rs]))
            miss = sum(r["misses"] for r in rs)
            probes = float(np.mean([r["probes"] for r in rs]))
            pcost = float(np.mean([r["probe_cost"] for r in rs]))
            out[(p, m)] = {"mean": mean, "savings": sav, "cells": [r["mean_cost"] for r in rs]}
            print(
                f"{p:>17} {m:>8} {mean:9.3f} {100 * sav:7.2f}% {100 * gap:7.2f}% {miss:>6} "
                f"{probes:7.2f} {pcost:8.3f}"
            )
    da = POLICIES[-1]
    da_c, up_c, up_o, da_o = (
        out[(da, "cluster")],
        out[("uniform_progress", "cluster")],
        out[("uniform_progress", "oracle")],
        out[(da, "oracle")],
    )
    worse = [
        f"{dl:g}h/{co:g}h"
        for (dl, co), a, b in zip(cells, da_c["cells"], up_c["cells"], strict=True)
        if a > b + 1e-9
    ]
    print(f"\ntargets ({da} under cluster):")
    print(
        f"  mean cost {da_c['mean']:.3f} vs uniform_progress under oracle {up_o['mean']:.3f}: "
        f"{'met' if da_c['mean'] <= up_o['mean'] else 'NOT met'}"
    )
    print(
        f"  cells above uniform_progress under cluster: {len(worse)} of {len(cells)} "
        f"{worse if worse else ''}"
    )
    diff = 100 * (da_c["savings"] - da_o["savings"])
    print(
        f"  savings {100 * da_c['savings']:.2f}% vs its oracle {100 * da_o['savings']:.2f}%: "
        f"{abs(diff):.2f} points {'higher' if diff >= 0 else 'lower'} "
        f"({'within' if abs(diff) <= 1.5 else 'NOT within'} 1.5 either way; "
        f"{'not lower' if diff >= -1.5 else 'lower by more than 1.5'})"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", nargs="*", default=["paper", "aws-p3", "gcp-h100"])
    ap.add_argument(
        "--per-zone",
        type=int,
        help="windows per zone (default: 100 per paper environment, 30 per aws-p3 / gcp-h100 zone)",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ablation", action="store_true", help="also replay cluster-bbm")
    ap.add_argument(
        "--deadline-aware",
        default="deadline_aware",
        help="the deadline_aware variant, e.g. deadline_aware@aws-p3 (its prior fitted on "
        "aws-p3 only: scored on gcp-h100 it sees a family it was not fitted on)",
    )
    args = ap.parse_args()
    POLICIES[POLICIES.index("deadline_aware")] = args.deadline_aware
    if args.ablation:
        MODELS.append("cluster-bbm")
    for fam in args.family:
        family_table(fam, args.per_zone or (100 if fam == "paper" else 30), args.workers)
    print()
    for p in POLICIES:
        print(
            f"time per decision, {p}: seen {per_decision_us(p, False):.2f} us, "
            f"unseen {per_decision_us(p, True):.2f} us"
        )


if __name__ == "__main__":
    main()
