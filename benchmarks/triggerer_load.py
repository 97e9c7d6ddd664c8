"""Triggerer load (issue 21, deliverable 5; issue 34): one event loop watching N deferred attempts.

    python benchmarks/triggerer_load.py [--attempts 200] [--capacity 1000] [--poll 1.0]
        [--threads 8] [--seed 7]

Two runs, one after the other (``--attempts 0`` or ``--capacity 0`` skips one):

* ``--attempts`` (200): N real local attempts, each a detached supervisor running ``sleep``,
  on spot replayed from a scripted market that goes down once, at a random time after every
  attempt has started. Starting a supervisor costs about 0.3 s of CPU (two Python start-ups),
  so this run cannot reach the triggerer's capacity on a small machine.
* ``--capacity`` (1000, Airflow's ``[triggerer] capacity`` default): the triggerer at its
  capacity, with the attempts' start-up taken out. Each attempt is launched by
  ``LocalBackend.launch`` (its run folder and ``spec.json`` as in production), but the detached
  supervisor launch would start is replaced by a stand-in: a ``sh`` process blocked on a pipe,
  whose command line names the supervisor module and the run folder, which is what
  ``read_status`` checks in ``/proc`` to tell a live supervisor. One separate process writes
  every attempt's ``status.json`` with the supervisor's own code (``Supervisor.publish`` and
  ``finish``): running, a heartbeat every 0.5 s as the supervisor beats, then, once the
  attempt's market takes spot away, the notice and the ``preempted`` verdict (at once: the
  ~20 ms a real ``sleep`` takes to die of SIGTERM is left out). The triggers read those files
  exactly as in production.

In both runs the attempts are watched by N ``AttemptTrigger`` objects, each run as Airflow's
triggerer runs a trigger (created one by one, yielding to the loop between two, as
``TriggerRunner.create_triggers`` does; ``async for event in trigger.run()``, all in one
asyncio loop, polls in its thread pool). What is measured:

* the wake-up latency: from the moment spot goes away (the market's tick boundary) to the
  trigger's event for that attempt (the supervisor's notice and SIGTERM, its verdict, and
  the trigger's next poll); in the capacity run also from the verdict's write (its
  ``ended_at``) to the event: the triggerer's own share. Airflow's scheduler then resumes
  the task (not measured here: that is the deployment's, see tests/deployment);
* ``loop_blocked_max_s``: the longest a 10 ms ticker in the same loop was held up (a
  blocked event loop delays every trigger of the triggerer), split into the start (every
  trigger created and polled once) and after, with the garbage collector's pauses beside it:
  a full collection stops every thread for a time that grows with the heap, so this process
  imports the triggerer's own modules too, to hold about the heap a triggerer holds. The
  first trigger to run freezes that heap (``gc.freeze()``, see ``airflow_spot/triggers/base.py``:
  without it, full collections held the loop 0.1-0.26 s with 1,000 triggers here);
* the CPU of this process (the triggerer's share) while it watched.

Each run ends with a line for a machine: ``triggerer: attempts=N p50_s=.. p99_s=..
loop_blocked_max_s=..`` (the capacity run's adds ``supervisors=stand-in``, and says whether
it met the targets: p99 under 2 s, the loop never blocked more than 0.1 s). A benchmark, not a test: it prints figures and
exits 0. Every process it started is gone at the end: stand-ins and the status writer by
their ids, and, as a last sweep, any process whose command line or environment names the
run's own temporary folder (the detached supervisors and their ``sleep``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

from airflow_spot.backends.base import Outcome, State, TaskIdentity
from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import read_status

GAP_S = 600  # trace tick (market seconds); at time_scale 600 one tick is one wall second
SUPERVISOR = "airflow_spot.backends.local.supervisor"  # what read_status looks for in /proc
HEARTBEAT_S = 0.5  # the supervisor's heartbeat (Supervisor._watch)
WRITER_POLL_S = 0.02  # the supervisor's poll (supervisor.POLL_S)
RECLAIMED = "spot capacity reclaimed (notice, SIGTERM, SIGKILL after grace)"  # its verdict


def write_market(path: Path, up_ticks: int) -> None:
    data = [1] * up_ticks + [0] * 5000
    path.write_text(json.dumps({"metadata": {"gap_seconds": GAP_S}, "data": data}))


# -- the triggerer ---------------------------------------------------------------------------
async def watch(trig: Any, out: dict, key: int) -> None:
    async for event in trig.run():
        out[key] = (time.time(), event.payload)
        return


async def ticker(stop: asyncio.Event, lags: list[tuple[float, float]]) -> None:
    """Every 10 ms: how much later than asked the loop woke it (wall time, lag)."""
    step = 0.01
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(step)
        lags.append((time.time(), time.perf_counter() - t0 - step))


class Collections:
    """The garbage collector's pauses while it is installed (a full collection stops every
    thread, the event loop's too: how long one takes grows with the process's heap)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float, float]] = []  # (generation, wall start, seconds)
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.time()
        else:
            self.pauses.append((info["generation"], self._t0, time.time() - self._t0))

    def line(self, lags: list[tuple[float, float]]) -> str:
        """What it did, and how many of the loop's blocks over 0.1 s a full one overlaps."""
        full = [(t, s) for g, t, s in self.pauses if g == 2]
        young = [s for g, _, s in self.pauses if g < 2]
        blocks = [(t - x - 0.01, t) for t, x in lags if x > 0.1]
        in_gc = sum(any(t < b1 and b0 < t + s for t, s in full) for b0, b1 in blocks)
        return (
            f"garbage collector: {len(full)} full collections over {len(gc.get_objects())} "
            f"objects, longest {max((s for _, s in full), default=0.0):.3f} s; {len(young)} "
            f"young ones, longest {max(young, default=0.0):.3f} s; loop blocks over 0.1 s: "
            f"{len(blocks)}, {len(blocks) - in_gc} of them outside a full collection"
        )


async def start_triggers(args: argparse.Namespace, handles, backends, out: dict) -> list:
    """One trigger per attempt, created as ``TriggerRunner.create_triggers`` does: a task
    each, one per loop pass."""
    from airflow_spot.triggers.attempt import AttemptTrigger

    tasks = []
    for i, (h, b) in enumerate(zip(handles, backends, strict=True)):
        trig = AttemptTrigger(
            handle=h.to_dict(),
            backend=b.to_dict(),
            market=None,
            spot_was=True,
            wake_at=time.time() + 3600,
            poll_interval=args.poll,
            issued_at=time.time(),  # as the operator builds it (the worker's clock)
        )
        tasks.append(asyncio.create_task(watch(trig, out, i)))
        await asyncio.sleep(0)
    return tasks


async def watch_all(args: argparse.Namespace, handles, backends, timeout: float) -> dict:
    """Run one trigger per attempt in this loop until each has fired; what it measured."""
    # imported before measuring (here, not at the top: the status writer needs none): the
    # trigger, and the triggerer's own modules, for this process to hold a triggerer's heap (a
    # full garbage collection, which stops the loop, takes longer the larger the heap)
    import airflow.jobs.triggerer_job_runner  # noqa: F401

    import airflow_spot.triggers.attempt  # noqa: F401

    loop = asyncio.get_running_loop()
    # the triggerer's own loop uses the default executor for to_thread; size it as Airflow's does
    loop.set_default_executor(ThreadPoolExecutor(max_workers=args.threads))
    out: dict[int, tuple[float, dict]] = {}
    stop, lags, collections = asyncio.Event(), [], Collections()
    gc.callbacks.append(collections)
    tick = asyncio.create_task(ticker(stop, lags))
    ru0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    try:
        tasks = await start_triggers(args, handles, backends, out)
        started = time.time()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=timeout)
    finally:
        gc.callbacks.remove(collections)
    ru1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    stop.set()
    await tick
    first_round = started + args.poll  # created, and each trigger's first poll done
    return {
        "out": out,
        "lag": [x for _, x in lags],
        "cpu": (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / (w1 - w0),
        "span": w1 - w0,
        "started": started,
        "blocked": (
            max((x for t, x in lags if t <= first_round), default=0.0),
            max((x for t, x in lags if t > first_round), default=0.0),
            started - w0,
        ),
        "gc": collections.line(lags),
    }


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of sorted ``xs`` (nearest rank, as issue 21's figures were computed)."""
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def latency_line(what: str, lat: list[float]) -> str:
    return (
        f"{what}: min {lat[0]:.3f} s, p50 {statistics.median(lat):.3f} s, "
        f"p99 {pct(lat, 0.99):.3f} s, max {lat[-1]:.3f} s"
    )


def report(args, n: int, handles, downs: list[float], seen: dict, tag: str = "") -> None:
    out, lag = seen["out"], seen["lag"]
    lat = sorted(out[i][0] - downs[i] for i in range(n))
    kinds = {out[i][1].get("kind") for i in range(n)}
    outcomes = {read_status(h).outcome.value for h in handles if read_status(h).outcome}
    p50, p99 = statistics.median(lat), pct(lat, 0.99)
    print(f"events: {sorted(k for k in kinds if k)}; attempt outcomes: {sorted(outcomes)}")
    print(
        latency_line(
            f"wake-up latency (spot gone -> trigger event), poll_interval {args.poll:g} s, "
            f"{args.threads} poll threads",
            lat,
        )
    )
    lag_p99 = sorted(lag)[int(0.99 * (len(lag) - 1))]
    print(
        f"triggerer CPU while watching: {100 * seen['cpu']:.1f} % of one core over "
        f"{seen['span']:.1f} s; event-loop lag: p99 {lag_p99:.4f} s, max {max(lag):.4f} s"
    )
    early, later, creating = seen["blocked"]
    print(
        f"loop blocked at most {early:.3f} s while the {n} triggers were created ({creating:.2f} s)"
        f" and polled once, {later:.3f} s after; {seen['gc']}"
    )
    if tag:  # the capacity run says whether it met the targets
        met = [p99 < 2.0, max(lag) <= 0.1]
        print(
            f"targets: p99 wake-up under 2 s: {'met' if met[0] else 'MISSED'} ({p99:.2f} s); "
            f"loop never blocked over 0.1 s: {'met' if met[1] else 'MISSED'} ({max(lag):.3f} s)"
        )
    print(
        f"triggerer: attempts={n} p50_s={p50:.2f} p99_s={p99:.2f} "
        f"loop_blocked_max_s={max(lag):.3f}{tag}",
        flush=True,
    )


# -- run 1: real supervisors -----------------------------------------------------------------
async def supervisors_run(args: argparse.Namespace, root: Path) -> None:
    rng = random.Random(args.seed)
    n = args.attempts
    start_budget = 0.25 * n + 10  # seconds to start every supervisor before the first reclaim
    t_launch = time.time()
    handles, downs, backends = [], [], []
    for i in range(n):
        trace = root / f"m{i}.json"
        up_ticks = int(start_budget) + rng.randint(5, 25)
        write_market(trace, up_ticks)
        b = local_backend(trace, root)
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
    print(f"{n} supervisors started in {time.time() - t_launch:.1f} s", flush=True)
    seen = await watch_all(args, handles, backends, max(downs) - time.time() + 120)
    report(args, n, handles, downs, seen)


def local_backend(trace: Path, root: Path) -> LocalBackend:
    return LocalBackend(
        trace=str(trace),
        polarity="available",
        time_scale=float(GAP_S),
        work_dir=str(root / "runs"),
        notice_s=0.0,
        grace_s=1.0,
    )


# -- run 2: the triggerer at its capacity ----------------------------------------------------
class StandInStart:
    """Takes the place of the ``subprocess`` module in ``LocalBackend.launch``: where launch
    starts the detached supervisor of ``RUN_DIR``, start its stand-in instead, a ``sh`` blocked
    on ``stdin`` (a pipe only this process writes to: it ends when that pipe closes) whose
    command line names the supervisor module and ``RUN_DIR`` as the supervisor's does."""

    DEVNULL = subprocess.DEVNULL

    def __init__(self, stdin_fd: int) -> None:
        self.stdin_fd = stdin_fd
        self.procs: list[subprocess.Popen] = []

    def run(self, cmd: list[str], **_: Any) -> None:
        assert cmd[-3:-1] == [SUPERVISOR, "--detach"], cmd  # launch's own supervisor start
        self.procs.append(
            subprocess.Popen(
                ["/bin/sh", "-c", "read _", SUPERVISOR, cmd[-1]],
                stdin=self.stdin_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own group, as the supervisor's child has
            )
        )


def launch_standins(n: int, root: Path, rng: random.Random, start_budget: float, fd: int):
    """Launch ``n`` attempts through ``LocalBackend.launch`` under stand-in supervisors."""
    from airflow_spot.backends.local import backend as backend_module

    starter = StandInStart(fd)
    handles, backends, downs, traces = [], [], [], {}
    t_launch = time.time()
    with mock.patch.object(backend_module, "subprocess", starter):
        for i in range(n):
            up_ticks = int(start_budget) + rng.randint(5, 25)
            if up_ticks not in traces:  # a market file per reclaim tick, shared
                traces[up_ticks] = root / f"m{up_ticks}.json"
                write_market(traces[up_ticks], up_ticks)
            b = local_backend(traces[up_ticks], root)
            epoch = t_launch + rng.random()  # reclaims at any phase of the polls
            h = b.launch(
                TaskIdentity("load", f"t{i}", "r"),
                1,
                "spot",
                ["sleep", "600"],  # never started: the stand-in runs nothing
                checkpoint_uri=str(root / "ckpt" / str(i)),
                changeover_wall_s=0.0,
                market=b.market_spec(epoch),
            )
            handles.append(h)
            backends.append(b)
            downs.append(epoch + up_ticks)
    return starter.procs, handles, backends, downs


async def capacity_run(args: argparse.Namespace, root: Path, procs: list) -> None:
    rng = random.Random(args.seed)
    n = args.capacity
    start_budget = 0.01 * n + 10  # seconds to set everything up before the first reclaim
    read_fd, write_fd = os.pipe()  # the stand-ins' stdin: they end when write_fd closes
    procs.append(write_fd)
    t_launch = time.time()
    try:
        standins, handles, backends, downs = launch_standins(n, root, rng, start_budget, read_fd)
    finally:
        os.close(read_fd)
    procs.extend(standins)
    plan = root / "plan.json"
    plan.write_text(
        json.dumps(
            [
                {"run_dir": h.run_dir, "pid": p.pid, "down_at": d}
                for h, p, d in zip(handles, standins, downs, strict=True)
            ]
        )
    )
    writer = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--write-statuses", str(plan)],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(writer)
    if writer.stdout is None or writer.stdout.readline().strip() != "ready":
        raise SystemExit("the status writer failed before every attempt was running")
    print(
        f"{n} attempts launched and running in {time.time() - t_launch:.1f} s "
        f"(LocalBackend.launch, stand-in supervisors; status.json by one writer process)",
        flush=True,
    )
    seen = await watch_all(args, handles, backends, max(downs) - time.time() + 120)
    stats = json.loads(writer.stdout.readline() or "{}")
    writer.wait(timeout=30)
    out = seen["out"]
    verdict = sorted(out[i][0] - out[i][1]["status"]["ended_at"] for i in range(n))
    early = sum(d < seen["started"] + args.poll for d in downs)
    print(
        f"status writer: {stats.get('beats', 0)} heartbeats, verdicts written at most "
        f"{stats.get('verdict_lag_max_s', float('nan')):.3f} s after spot went, "
        f"{100 * stats.get('cpu', 0.0):.1f} % of one core; reclaims before every trigger "
        f"ran: {early}"
    )
    print(latency_line("wake-up latency (verdict written -> trigger event)", verdict))
    report(args, n, handles, downs, seen, tag=" supervisors=stand-in")


def write_statuses(plan: Path) -> int:
    """The stand-in supervisors' status writer (a process of its own, as supervisors are):
    each attempt running, heartbeats, then its reclaim verdict once its market took spot away,
    written by the supervisor's own code."""
    from airflow_spot.backends.local.supervisor import Supervisor

    os.umask(0o077)  # as the supervisor: the attempt's files are this user's only
    todo = json.loads(plan.read_text())
    sups = []
    for a in todo:
        sup = Supervisor(Path(a["run_dir"]))
        sup.doc["supervisor_pid"] = a["pid"]  # the stand-in read_status finds in /proc
        now = time.time()
        sup.publish(
            state=State.RUNNING.value,
            granted_at=now,
            started_at=now,
            child_pid=a["pid"],
            pgid=a["pid"],
        )
        sups.append(sup)
    print("ready", flush=True)
    pending = deque(sorted(range(len(todo)), key=lambda i: todo[i]["down_at"]))
    t0, n = time.time(), len(todo)
    beats = deque((t0 - HEARTBEAT_S * i / n, i) for i in range(n))  # spread, as they would be
    ended: set[int] = set()
    lags, n_beats = [], 0
    ru0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    while pending:
        now = time.time()
        while pending and todo[pending[0]]["down_at"] <= now:
            sup = sups[pending[0]]
            if sup.spot_up():  # its tick boundary, a float's width away: the next look
                break
            i = pending.popleft()
            reclaim(sup, now)
            ended.add(i)
            lags.append(sup.doc["ended_at"] - todo[i]["down_at"])
        while beats and beats[0][0] + HEARTBEAT_S <= now:
            _, i = beats.popleft()
            if i not in ended:
                sups[i].publish()
                n_beats += 1
                beats.append((now, i))
        time.sleep(WRITER_POLL_S)
    ru1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / max(w1 - w0, 1e-9)
    print(json.dumps({"beats": n_beats, "verdict_lag_max_s": max(lags), "cpu": cpu}), flush=True)
    return 0


def reclaim(sup: Any, now: float) -> None:
    """What the supervisor writes when its market takes spot away: the notice, ``preempting``,
    then (its ``sleep`` dead of SIGTERM) the ``preempted`` verdict."""
    tick = sup.market.tick_at(now)
    sup.notice_path.write_text(json.dumps({"reason": "spot capacity reclaimed", "at": now}))
    sup.publish(state=State.PREEMPTING.value, notice_at=now, market_tick=tick)
    sup.finish(Outcome.PREEMPTED, RECLAIMED, exit_code=-signal.SIGTERM, market_tick=tick)


# -- nothing left running --------------------------------------------------------------------
def stop_all(procs: list, root: Path) -> None:
    """Stop every process this benchmark started: its own children by id (the stand-ins end
    when their pipe closes), then any process naming ``root`` in its command line or
    environment (detached supervisors and the commands they started)."""
    for p in procs:
        if isinstance(p, int):
            with contextlib.suppress(OSError):
                os.close(p)
    for p in procs:
        if isinstance(p, subprocess.Popen) and p.poll() is None:
            p.kill()
    for p in procs:
        if isinstance(p, subprocess.Popen):
            p.wait()
    mark = str(root).encode()
    for _ in range(3):  # a supervisor killed mid-start may still have forked
        found = [pid for pid in _pids() if _names(pid, mark)]
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not found:
            return
        time.sleep(0.2)


def _pids() -> list[int]:
    me = os.getpid()
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != me]


def _names(pid: int, mark: bytes) -> bool:
    for what in ("cmdline", "environ"):
        try:
            if mark in Path(f"/proc/{pid}/{what}").read_bytes():
                return True
        except OSError:  # gone, or another user's
            continue
    return False


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-statuses":
        return write_statuses(Path(sys.argv[2]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--attempts", type=int, default=200, help="real supervisors (0: skip)")
    ap.add_argument("--capacity", type=int, default=1000, help="stand-in supervisors (0: skip)")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    for run, n in ((supervisors_run, args.attempts), (capacity_run, args.capacity)):
        if n <= 0:
            continue
        with tempfile.TemporaryDirectory(prefix="triggerer-load-") as tmp:
            root, procs = Path(tmp), []
            t0 = time.time()
            try:
                if run is supervisors_run:
                    asyncio.run(run(args, root))
                else:
                    asyncio.run(run(args, root, procs))
            finally:  # nothing is left running
                stop_all(procs, root)
            print(f"({run.__name__.replace('_', ' ')}: {time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
