"""Cross-check the replay and the omniscient optimum against the published per-window results.

    python benchmarks/crosscheck.py [--envs us-west-2a_k80_1 ...] [--per-env 300]

For every setting in ``cant-be-late-windows/reference_results.csv`` and each of greedy,
uniform_progress and omniscient, prints the share of windows whose cost equals the
reference within 1e-3 relative, and lists any mismatches.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PAPER_ENVS, ROOT, paper_windows  # noqa: E402

from airflow_spot.simulate.sweep import OMNISCIENT, Setting, sweep  # noqa: E402

COLUMNS = {"greedy": "greedy_cost", "uniform_progress": "up_cost", OMNISCIENT: "omniscient_cost"}


def load_reference(path: Path) -> dict[tuple, dict]:
    with path.open() as fh:
        return {
            (r["env"], r["idx"], float(r["deadline_h"]), float(r["overhead_h"])): r
            for r in csv.DictReader(fh)
        }


def check(rows: list[dict], ref: dict[tuple, dict]) -> dict[tuple, list]:
    """(policy, deadline, changeover) -> [matched, total, mismatches]."""
    out: dict[tuple, list] = {}
    for r in rows:
        env, idx = r["trace"].split("/")
        want = float(ref[(env, idx, r["deadline_h"], r["changeover_h"])][COLUMNS[r["policy"]]])
        cell = out.setdefault((r["policy"], r["deadline_h"], r["changeover_h"]), [0, 0, []])
        cell[1] += 1
        if abs(r["cost"] - want) <= 1e-3 * abs(want):
            cell[0] += 1
        else:
            cell[2].append((r["trace"], r["cost"], want))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-env", type=int)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    ref = load_reference(ROOT / "cant-be-late-windows" / "reference_results.csv")
    settings = sorted({(k[2], k[3]) for k in ref})
    traces = paper_windows(args.per_env)
    t0 = time.time()
    rows = sweep(
        traces,
        list(COLUMNS),
        [Setting(48.0, dl, co, 0.9731, 3.06) for dl, co in settings],
        observe="oracle",  # the paper's model: the published results are replayed with it
        workers=args.workers,
    )
    res = check(rows, ref)
    worst = 1.0
    print(f"{len(traces)} windows of {', '.join(PAPER_ENVS)}")
    print(f"{'deadline':>8} {'changeover':>10} " + " ".join(f"{p:>18}" for p in COLUMNS))
    for dl, co in settings:
        cells = [res[(p, dl, co)] for p in COLUMNS]
        worst = min([worst] + [c[0] / c[1] for c in cells])
        print(
            f"{dl:>7g}h {co:>9g}h "
            + " ".join(f"{c[0]:>8}/{c[1]:<4} {100 * c[0] / c[1]:5.1f}%" for c in cells)
        )
    mism = [(k, m) for k, c in res.items() for m in c[2]]
    print(
        f"\nworst share matched in any setting: {100 * worst:.2f}%   mismatches: {len(mism)}   ({time.time() - t0:.0f} s)"
    )
    for k, m in mism[:20]:
        print("  ", k, m)
    sys.exit(0 if worst >= 0.99 else 1)


if __name__ == "__main__":
    main()
