"""Triggerer load (issue 21, deliverable 5): one event loop watching N deferred attempts.

    python benchmarks/triggerer_load.py [--attempts 200] [--poll 1.0] [--seed 7]

N real local attempts (each a detached supervisor running ``sleep``, on spot replayed from a
scripted market that goes down once, at a random time after every attempt has started) are
watched by N ``AttemptTrigger`` objects, each run as Airflow's triggerer runs a trigger
(``async for event in trigger.run()``, all in one asyncio loop, polls in its thread pool).
What is measured:

* the wake-up latency: from the moment spot goes away (the market's tick boundary) to the
  trigger's event for that attempt (the supervisor's notice and SIGTERM, its verdict, and
  the trigger's next poll). Airflow's scheduler then resumes the task (not measured here:
  that is the deployment's, see tests/deployment);
* ``loop_blocked_max_s``: the longest a 10 ms ticker in the same loop was held up (a
  blocked event loop delays every trigger of the triggerer);
* the CPU of this process (the triggerer's share) while it watched.

The last line is for a machine: ``triggerer: attempts=N p50_s=.. p99_s=.. loop_blocked_max_s=..``
(targets: p99 under 2 s, the loop never blocked more than 0.1 s). A benchmark, not a test: it
prints figures and exits 0; every supervisor it started is gone at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_spot.backends.base import TaskIdentity  # noqa: E402
from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import read_status
from airflow_spot.triggers.attempt import AttemptTrigger

GAP_S = 600  # trace tick (market seconds); at time_scale 600 one tick is one wall second


def write_market(path: Path, up_ticks: int) -> None:
    data = [1] * up_ticks + [0] * 5000
    path.write_text(json.dumps({"metadata": {"gap_seconds": GAP_S}, "data": data}))


async def watch(trig: AttemptTrigger, out: dict, key: int) -> None:
    async for event in trig.run():
        out[key] = (time.time(), event.payload)
        return


async def ticker(stop: asyncio.Event, lag: list[float]) -> None:
    step = 0.01
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(step)
        lag.append(time.perf_counter() - t0 - step)


async def main_async(args: argparse.Namespace, root: Path) -> None:
    rng = random.Random(args.seed)
    n = args.attempts
    loop = asyncio.get_running_loop()
    from concurrent.futures import ThreadPoolExecutor

    # the triggerer's own loop uses the default executor for to_thread; size it as Airflow's does
    loop.set_default_executor(ThreadPoolExecutor(max_workers=args.threads))
    start_budget = 0.25 * n + 10  # seconds to start every supervisor before the first reclaim
    t_launch = time.time()
    handles, downs, backends = [], [], []
    for i in range(n):
        trace = root / f"m{i}.json"
        up_ticks = int(start_budget) + rng.randint(5, 25)
        write_market(trace, up_ticks)
        b = LocalBackend(
            trace=str(trace),
            polarity="available",
            time_scale=float(GAP_S),
            work_dir=str(root / "runs"),
            notice_s=0.0,
            grace_s=1.0,
        )
        epoch = t_launch + rng.random()  # reclaims at any phase of the polls
        market = b.market_spec(epoch)
        h = b.launch(
            TaskIdentity("load", f"t{i}", "r"),
            1,
            "spot",
            ["sleep", "600"],
            checkpoint_uri=str(root / "ckpt" / str(i)),
            changeover_wall_s=0.0,
            market=market,
        )
        handles.append(h)
        backends.append(b)
        downs.append(epoch + up_ticks)  # spot goes down at this wall time (1 tick = 1 s)
    started = time.time()
    print(f"{n} supervisors started in {started - t_launch:.1f} s", flush=True)
    out: dict[int, tuple[float, dict]] = {}
    trigs = [
        AttemptTrigger(
            handle=h.to_dict(),
            backend=b.to_dict(),
            market=None,
            spot_was=True,
            wake_at=time.time() + 3600,
            poll_interval=args.poll,
        )
        for h, b in zip(handles, backends, strict=True)
    ]
    stop, lag = asyncio.Event(), []
    tick = asyncio.create_task(ticker(stop, lag))
    ru0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    await asyncio.wait_for(
        asyncio.gather(*(watch(t, out, i) for i, t in enumerate(trigs))),
        timeout=start_budget + 120,
    )
    ru1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    stop.set()
    await tick
    lat = sorted(out[i][0] - downs[i] for i in range(n))
    kinds = {out[i][1].get("kind") for i in range(n)}
    outcomes = {read_status(h).outcome.value for h in handles if read_status(h).outcome}
    cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / (w1 - w0)
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    print(f"events: {sorted(k for k in kinds if k)}; attempt outcomes: {sorted(outcomes)}")
    print(
        f"wake-up latency (spot gone -> trigger event), poll_interval {args.poll:g} s, "
        f"{args.threads} poll threads: min {lat[0]:.3f} s, p50 {p50:.3f} s, p99 {p99:.3f} s, "
        f"max {lat[-1]:.3f} s"
    )
    print(
        f"triggerer CPU while watching: {100 * cpu:.1f} % of one core over {w1 - w0:.1f} s; "
        f"event-loop lag: p99 {sorted(lag)[int(0.99 * (len(lag) - 1))]:.4f} s, max {max(lag):.4f} s"
    )
    print(
        f"triggerer: attempts={n} p50_s={p50:.2f} p99_s={p99:.2f} loop_blocked_max_s={max(lag):.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--attempts", type=int, default=200)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="triggerer-load-") as tmp:
        root = Path(tmp)
        try:
            asyncio.run(main_async(args, root))
        finally:  # nothing is left running
            subprocess.run(
                ["pkill", "-KILL", "-f", f"airflow_spot.backends.local.supervisor {root}"],
                check=False,
            )
            subprocess.run(["pkill", "-KILL", "-f", "^sleep 600$"], check=False)


if __name__ == "__main__":
    sys.exit(main())
