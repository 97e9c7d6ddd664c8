"""Multi-zone spot vs one zone, on the AWS p3.2xlarge trace (5 zones, real prices).

    python benchmarks/multi_zone.py [--windows 60] [--deadline 60 ...] [--changeover 0.2]

For random 92 h windows of ``aws-p3-2month`` (all five zones aligned, ~195 s probes resampled
onto 600 s ticks, spot billed at each zone's own price per tick, on-demand $3.06/h), runs
``deadline_aware`` (and Uniform Progress) in each single zone and over all five zones with the
cheapest-available choice and a 1 h cool-down after a preemption, and prints mean normalised
cost, savings and the saving of multi-zone over the mean single zone and the best single zone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT  # noqa: E402

from airflow_spot.policy import HOUR, JobSpec, get_policy  # noqa: E402
from airflow_spot.simulate.pools import replay_pools  # noqa: E402
from airflow_spot.simulate.traces import load_trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=60)
    ap.add_argument("--deadline", type=float, action="append")
    ap.add_argument("--changeover", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    zones = [load_trace(f, gap_s=600.0) for f in sorted((ROOT / "aws-p3-2month").glob("*.csv"))]
    n = min(len(z) for z in zones)
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, n - 554, size=args.windows)
    t0 = time.time()
    print(
        f"aws-p3-2month: {len(zones)} zones, {args.windows} random 92 h windows, changeover {args.changeover} h, "
        "spot at each zone's own price, on-demand $3.06/h\n"
    )
    print(
        f"{'deadline':>8} {'policy':<18} "
        + " ".join(f"{z.name[:10]:>10}" for z in zones)
        + f" {'mean 1-zone':>11} {'multi-zone':>10} {'vs mean':>8} {'vs best':>8}"
    )
    for dl in args.deadline or [56.0, 60.0, 70.0]:
        job = JobSpec(
            48 * HOUR, dl * HOUR, args.changeover * HOUR, spot_price=1.0, on_demand_price=3.06
        )
        for name in ("uniform_progress", "deadline_aware"):
            single = np.zeros((len(zones), len(starts)))
            multi = np.zeros(len(starts))
            misses = 0
            for j, s in enumerate(starts):
                windows = [z.window(int(s), 554) for z in zones]
                for i, w in enumerate(windows):
                    r = replay_pools(get_policy(name), [w], job, cooldown_ticks=0)
                    single[i, j] = r.normalized_cost
                    misses += not r.met
                r = replay_pools(get_policy(name), windows, job, cooldown_ticks=6)
                multi[j] = r.normalized_cost
                misses += not r.met
            per_zone = single.mean(axis=1)
            mean1, best1, m = per_zone.mean(), per_zone.min(), multi.mean()
            print(
                f"{dl:>7g}h {name:<18} "
                + " ".join(f"{c:>10.4f}" for c in per_zone)
                + f" {mean1:>11.4f} {m:>10.4f} {100 * (1 - m / mean1):>7.1f}% {100 * (1 - m / best1):>7.1f}%  misses {misses}"
            )
    print(
        f"\n(normalised cost = cost / 48 h on-demand; 'vs' = multi-zone saving; {time.time() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
