"""Simulator speed: the replay against a plain per-tick reference loop (issue 19, item 8).

    SPOT_TRACES=/work/shared/traces python benchmarks/sim_speed.py [--repeat 3] [--per-env N]

On the paper's 1,200 us-west-2a windows (work 48 h, deadline 60 h, changeover 0.2 h, spot
$0.9731, on-demand $3.06), times, median of ``--repeat``:

(a) a plain per-tick reference: one straightforward Python loop per window implementing
    Greedy and Uniform Progress under the paper's (oracle) rules exactly as the engine
    applies them (billing of whole intervals, changeover delaying progress, preemption at the
    tick boundary, the shared safety net), with no ledger and no policy objects;
(b) the replay as ``sweep(..., workers=1)`` (and so ``airflow-spot simulate``) runs it, under
    ``observe="oracle"`` and ``observe="cluster"``, with the fast-forward on (the default)
    and off;

and prints each replay's ratio to the reference, and whether the oracle replay's costs equal
the reference's (``RunResult.row()``'s six decimals; the raw difference is printed too).
A benchmark, not a test: it prints figures and exits 0.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import paper_windows  # noqa: E402

from airflow_spot.policy import get_policy  # noqa: E402
from airflow_spot.simulate import engine  # noqa: E402
from airflow_spot.simulate.engine import replay  # noqa: E402
from airflow_spot.simulate.sweep import Setting, sweep  # noqa: E402

EPS = 1e-3  # seconds of work or changeover treated as zero (as the engine and the paper)
NONE, SPOT, OD = 0, 1, 2
POLICIES = ("greedy", "uniform_progress")


def reference(
    avail: list[bool],
    policy: str,
    work: float,
    deadline: float,
    d: float,
    gap: float,
    spot_price: float,
    od_price: float,
) -> float:
    """Cost of Greedy or Uniform Progress on one window: the paper's rules, tick by tick."""
    n = len(avail)
    cur, rro, done, cost, t = NONE, 0.0, 0.0, 0.0, 0
    greedy = policy == "greedy"
    while True:
        now = t * gap
        has = avail[t] if t < n else False
        if cur != NONE:  # bill [t-1, t) in full; progress is what the changeover left of it
            w = gap - rro if gap > rro else 0.0
            rro -= gap - w
            if rro < EPS:
                rro = 0.0
            done += min(w, work - done)
            cost += gap / 3600.0 * (od_price if cur == OD else spot_price)
            if cur == SPOT and not has:  # reclaimed at the tick boundary
                cur = NONE
        if work - done <= EPS or now >= deadline:
            break
        left = math.floor((deadline - now) / gap)
        need2 = math.ceil((work - done + 2 * d) / gap)
        if greedy:
            req = SPOT if has else NONE  # spot when it is up, idle when it is down
            if need2 >= left:  # the slack is gone: keep running spot, else on-demand
                req = SPOT if cur == SPOT and has else OD
        else:
            if has:
                req = SPOT
            elif now * work / deadline - done > 0:
                req = OD
            else:
                req = NONE
            if cur == OD and (not has or (now + 2 * d) * work / deadline - done >= 0):
                req = OD  # hysteresis: stay until ahead of the line two changeovers from now
            if cur != SPOT and need2 >= left:
                req = OD
        # the safety net: on-demand once the work plus one changeover no longer fits
        if (
            req != OD
            and math.ceil((work - done + d) / gap) >= left
            and not (cur == SPOT and req == SPOT and rro < EPS)
        ):
            req = OD
        if req != cur and req != NONE:
            rro = d
        cur = req
        t += 1
    return cost


def _median(fn: Callable[[], object], repeat: int) -> tuple[float, list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--per-env", type=int)
    args = ap.parse_args()
    s = Setting(48.0, 60.0, 0.2, 0.9731, 3.06)
    traces = paper_windows(args.per_env)
    gap = traces[0].gap_s
    job = s.job(gap)
    print(
        f"{len(traces)} windows, R = {s.deadline_h:g} h, d = {s.changeover_h:g} h, {gap:g} s ticks"
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def run_reference() -> dict[tuple[str, str], float]:
        out = {}
        for p in POLICIES:
            for tr in traces:
                avail = tr.available.tolist()
                out[(p, tr.name)] = reference(
                    avail,
                    p,
                    job.work_s,
                    job.deadline_s,
                    job.changeover_s,
                    gap,
                    job.spot_price,
                    job.on_demand_price,
                )
        return out

    ref_s, ref_times, ref = _median(run_reference, args.repeat)
    assert isinstance(ref, dict)
    print(f"\n(a) reference: {ref_s:.3f} s  (runs {', '.join(f'{x:.3f}' for x in ref_times)})")

    print("\n(b) replay via sweep(workers=1)")
    print(f"{'observe':>8} {'fast':>5} {'median s':>9} {'runs':>24} {'ratio':>6}")
    fast0 = engine.FAST
    results: dict[tuple[str, bool], list[dict]] = {}
    try:
        for observe in ("oracle", "cluster"):
            for fast in (True, False):
                engine.FAST = fast

                def run_replay(observe: str = observe) -> list[dict]:
                    return sweep(traces, POLICIES, [s], observe=observe, workers=1)

                sec, times, rows = _median(run_replay, args.repeat)
                assert isinstance(rows, list)
                results[(observe, fast)] = rows
                runs = ", ".join(f"{x:.3f}" for x in times)
                print(f"{observe:>8} {str(fast):>5} {sec:9.3f} {runs:>24} {sec / ref_s:6.2f}x")
    finally:
        engine.FAST = fast0
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    print("\n(c) costs")
    for observe in ("oracle", "cluster"):
        same = results[(observe, True)] == results[(observe, False)]
        print(f"{observe}: fast-forward rows == per-tick rows: {same}")
    bad, worst = [], 0.0
    raw = {
        (p, tr.name): replay(get_policy(p), tr, job, observe="oracle").cost
        for p in POLICIES
        for tr in traces
    }
    for r in results[("oracle", True)]:
        want = ref[(r["policy"], r["trace"])]
        worst = max(worst, abs(raw[(r["policy"], r["trace"])] - want))
        if r["cost"] != round(want, 6):
            bad.append((r["policy"], r["trace"], r["cost"], want))
    print(
        f"oracle replay vs reference: {len(results[('oracle', True)]) - len(bad)}/"
        f"{len(results[('oracle', True)])} costs equal to the 6th decimal "
        f"(largest difference of the unrounded costs {worst:.2e})"
    )
    for b in bad[:20]:
        print("   mismatch", b)


if __name__ == "__main__":
    main()
