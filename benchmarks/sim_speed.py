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
the reference's (``RunResult.row()``'s six decimals; the raw difference is printed too);

(d) the command the issue timed, ``airflow-spot simulate`` on the same windows and job
    (``--workers 1``, then the default workers), as whole processes, at this tree and at
    ``--baseline`` (default 4d5a27b, the commit issue 19 was filed at, exported from git to a
    temporary folder), interleaved, with bytecode compiled for both; the speedup, and what it
    makes of the issue's own figures (5.3 s for the command against 3.1 s for its
    reference: 1.71x). ``--baseline ''`` skips it.

A benchmark, not a test: it prints figures and exits 0.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PAPER_ENVS, ROOT, paper_windows  # noqa: E402

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
    ap.add_argument("--baseline", default="4d5a27b", help="commit to time the command at")
    ap.add_argument("--cli-repeat", type=int, default=5)
    ap.add_argument("--reference-only", action="store_true", help="(d)'s reference process")
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

    if args.reference_only:  # the reference as a process of its own, as (d) times it
        run_reference()
        return
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

    if args.baseline and not args.per_env:
        cli_against(args.baseline, args.cli_repeat)


ISSUE_RATIO = 5.3 / 3.1  # the command against the issue's reference, as issue 19 measured
REPO = Path(__file__).resolve().parents[1]


def cli_against(baseline: str, repeat: int) -> None:
    """(d): the whole command at this tree and at ``baseline``, interleaved."""
    print(f"\n(d) airflow-spot simulate as a process, here and at {baseline} (median of {repeat})")
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", baseline, "airflow_spot"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"   skipped: cannot export {baseline} from git ({e})")
        return
    old = Path(tempfile.mkdtemp(prefix="sim-speed-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            tf.extractall(old, filter="data")
        for tree in (old, REPO):  # as an installed package runs: bytecode compiled once
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(tree / "airflow_spot")],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        folders = [str(ROOT / "cant-be-late-windows" / env) for env in PAPER_ENVS]
        job = [*folders, "--polarity", "unavailable", "--deadline", "60h", "--changeover"]
        job += ["0.2h", "--policy", "greedy", "--policy", "uniform_progress"]
        runs = [  # (how the workers are set, what runs, tree, argv)
            (label, name, tree, job + extra + more)
            for label, more in (("--workers 1", ["--workers", "1"]), ("default workers", []))
            for name, tree, extra in (
                (baseline, old, []),
                ("here, oracle", REPO, ["--observe", "oracle"]),
                ("here, cluster", REPO, ["--observe", "cluster"]),
            )
        ]
        times: dict[tuple[str, str], list[float]] = {(r[0], r[1]): [] for r in runs}
        reference_s: list[float] = []
        for _ in range(repeat):
            for label, name, tree, argv in runs:
                times[(label, name)].append(_simulate_wall(tree, argv))
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, __file__, "--reference-only"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            reference_s.append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        ref_process = statistics.median(reference_s)
        print(
            f"{'workers':>16} {'tree':>14} {'median s':>9} {'speedup':>8} {'issue ref':>10} "
            f"{'(a) as process':>15}"
        )
        for label, name, _, _ in runs:
            speed = med[(label, baseline)] / med[(label, name)]
            print(
                f"{label:>16} {name:>14} {med[(label, name)]:9.3f} {speed:7.2f}x "
                f"{ISSUE_RATIO / speed:9.2f}x {med[(label, name)] / ref_process:14.2f}x"
            )
        print(
            "issue ref: the command's time against the issue's reference, scaled from the "
            f"issue's {ISSUE_RATIO:.2f}x at {baseline} by the speedup (target: 0.5x)\n"
            f"(a) as process: against (a)'s reference run as a process of its own (loading "
            f"the windows too, one core): {ref_process:.3f} s"
        )
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _simulate_wall(tree: Path, argv: list[str]) -> float:
    """Seconds of one ``airflow-spot simulate`` process running the package in ``tree``."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import airflow_spot; "
        "assert airflow_spot.__file__.startswith(sys.argv[1]), airflow_spot.__file__; "
        "from airflow_spot.cli import main; sys.argv = ['airflow-spot', 'simulate', "
        "*sys.argv[2:]]; sys.exit(main())"
    )
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code, str(tree), *argv], check=True, stdout=subprocess.DEVNULL
    )
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
