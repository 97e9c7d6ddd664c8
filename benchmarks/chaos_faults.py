"""The chaos benchmark's process faults (``benchmarks/chaos.py``): what each one does, the
moment it waits for, and what counts as its hit; and the two counters they call for,
``tries_lost_to_outages`` and ``unwatched_s``.

A fault function takes the :class:`Run` and its :class:`Planned` draw and returns None while
its moment has not come (it is tried again each second), a :class:`Missed` when it acted but
hit nothing, else what it hit (True or a note), or a function that tells that at the run's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import conftest as deploy  # tests/deployment (chaos.py puts it on the path)
from chaos_deploy import (
    RESTART_S,
    TERMINAL,
    TRY_ENDED,
    Armed,
    Missed,
    SmallDisk,
    Supervisor,
    Watch,
    connect,
    job_state,
    kill_runner,
    look_up,
    read_from,
    recorded_dirs,
    restart_postgres,
    restart_workers,
    stop_component,
    trainers_of,
    wait_healthy,
)

from airflow_spot.checkpoint import Store
from airflow_spot.checkpoint.writable import REASON_FILE
from airflow_spot.exceptions import BudgetExhausted, ConfigError
from airflow_spot.testing.clock import skew_env

# An outage (api-server, Redis, PostgreSQL) begins at most this long after the task deferred
# anew: its trigger holds every event for min_deferral (10.5 s), so no try runs while the
# outage begins, and fires within the decision interval (12 s), so one fires during it. A try
# that *runs* through an outage misses its heartbeats, and the benchmark's heartbeat timeout
# is 10 s (scaled down with everything else), where production's 300 s outlasts such outages.
FRESH_S = 3.0
OUTAGE_MARGIN_S = 60.0  # a try failed this long after an outage ended is still its loss
STOP_S = 3.2  # the notice (0.2 s), the grace (2 s) and a second to send the stop
LAST_TRY = "last_try_before_code"
HOLDS = {  # seconds a hold-down fault keeps its target down, drawn between these
    "api_server_down": (30.0, 90.0),
    "redis_restart": (15.0, 40.0),
    "postgres_restart": (5.0, 20.0),
    "disk_full": (5.0, 15.0),
}
# what a run's deadline gains for each fault it draws: the wall time the fault takes from the
# job (at 1800 market seconds a wall second, a 60 s outage is 30 market hours, which no
# production deadline would have to absorb); the base deadline covers the original faults
SLACK_S = {
    "api_server_down": 30.0,  # + the hold: a worker calls again within 20 s of its return
    "redis_restart": 10.0,  # + the hold
    "postgres_restart": 40.0,  # + the hold: components restarted, then healthy again
    "disk_full": 5.0,  # + the hold
    "kill_worker": 30.0,  # heartbeat timeout (10 s), retry_delay (10 s), the next try's start
    "kill_runner_after_launch": 20.0,  # retry_delay and the next try's start
    "delete_checkpoints": 30.0,  # an attempt preempted before its next save starts again
    "kill_triggerer": RESTART_S,
    "kill_scheduler": RESTART_S,
}


@dataclass
class Planned:
    """One fault drawn for a run: its kind, when (seconds after the run's start), how long it
    holds its target down and which way a clock skew goes."""

    kind: str
    at: float
    hold: float = 0.0
    sign: str = ""

    def slack(self) -> float:
        return SLACK_S.get(self.kind, 0.0) + self.hold


@dataclass
class Run:
    """One DAG run under faults: what the faults act on, and what they leave for the judge."""

    dep: deploy.AirflowDeployment
    sup: Supervisor
    pg: deploy.PostgresServer
    redis: deploy.RedisServer
    disk: SmallDisk | None
    dag_id: str
    run_id: str
    root: Path
    start: float
    deadline_s: float
    watch: Watch
    store: Store  # where the run checkpoints, read directly (not through the S3 proxy)
    ckpt_dir: Path | None  # its folder, when it checkpoints to the small disk
    lib: Path | None  # libfaketime
    kills: set[int] = field(default_factory=set)  # tries killed on purpose
    outages: list[tuple[str, float, float]] = field(default_factory=list)
    deleted: set[int] = field(default_factory=set)  # steps of checkpoints deleted
    skewed_at: float | None = None
    armed: dict[int, Armed] = field(default_factory=dict)  # by id() of the Planned
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def safe(self) -> str:
        return self.run_id.replace(":", "_").replace("+", "_")

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / self.dag_id / self.safe

    def attempt_dirs(self, leftovers: bool = False) -> list[Path]:
        return [
            p
            for p in self.run_dir.glob("train/-1/attempt-*")
            if p.is_dir() and (leftovers or ".leftover-" not in p.name)
        ]

    def component(self, name: str) -> deploy.Component:
        return next(c for c in self.dep.components if c.name == name)

    def worker(self, hostname: str) -> deploy.Component | None:
        return next((w for w in self.dep.workers if w.name.replace("_", "-") == hostname), None)

    def worker_sessions(self) -> set[int]:
        return {w.proc.pid for w in self.dep.workers if w.proc is not None}

    def try_log(self, n: int) -> Path:
        return (
            self.dep.root / "logs" / f"dag_id={self.dag_id}" / f"run_id={self.run_id}"
            / "task_id=train" / f"attempt={n}.log"
        )  # fmt: skip

    def checkpoints(self) -> list[str]:
        return [k for k in self.store.list("ckpt-") if k.endswith("/MANIFEST.json")]

    def arm(self, p: Planned, body: Callable[[], Any]) -> Any:
        """``body`` in a thread of its own, started on the first call: its result once done."""
        armed = self.armed.get(id(p))
        if armed is None:
            armed = self.armed[id(p)] = Armed(body, p.kind)
            armed.start()
        return None if armed.is_alive() else armed.result


def fresh_deferral(run: Run) -> bool:
    """The task deferred anew (see :data:`FRESH_S`)."""
    since = run.watch.since("deferred")
    return since is not None and since < FRESH_S


# -- the components -----------------------------------------------------------------------
def kill_training(run: Run, p: Planned) -> Any:
    """SIGKILL the training process of the live attempt, wherever it is (None: nothing
    trains)."""
    for pid in trainers_of(run.run_dir):
        os.kill(pid, signal.SIGKILL)
        return True
    return None


def kill_component(run: Run, p: Planned) -> Any:
    """SIGKILL the triggerer's (or the scheduler's) process group; the supervisor starts it
    again. Hit: always (it is running)."""
    run.component("triggerer" if p.kind == "kill_triggerer" else "scheduler").signal(signal.SIGKILL)
    return True


def restart_api_server(run: Run, p: Planned) -> Any:
    """SIGTERM the api-server and start it again at once, just after the task deferred. Hit:
    always."""
    if not fresh_deferral(run):
        return None
    c, t0 = run.component("api_server"), time.time()
    with run.sup.holding(c.name):
        stop_component(c)
        c.start(run.dep.env)
    back = wait_healthy(run.dep)
    run.outages.append((p.kind, t0, time.time()))
    return f"up again {back:.0f} s later"


def api_server_down(run: Run, p: Planned) -> Any:
    """SIGTERM the api-server just after the task deferred, hold it down ``p.hold`` s (30-90),
    start it again. Hit: the task's trigger fired while it was down (the task instance left
    ``deferred``, as the metadata database shows), so a try had to start without it."""
    if not fresh_deferral(run):
        return None
    c, t0 = run.component("api_server"), time.time()
    with run.sup.holding(c.name):
        stop_component(c)
        time.sleep(max(0.0, t0 + p.hold - time.time()))
        c.start(run.dep.env)
    t1 = time.time()
    back = wait_healthy(run.dep)
    run.outages.append((p.kind, t0, t1 + back))
    return _fired(run, t0, t1, f"down {t1 - t0:.0f} s, healthy {back:.0f} s later")


def redis_restart(run: Run, p: Planned) -> Any:
    """Stop Redis (the broker) just after the task deferred, hold it down ``p.hold`` s
    (15-40), start it again, empty (no persistence). Hit: the trigger fired while it was down
    (the scheduler had a try to send through it)."""
    if not fresh_deferral(run):
        return None
    t0 = time.time()
    run.redis.stop()
    time.sleep(p.hold)
    run.redis.start()
    t1 = time.time()
    run.outages.append((p.kind, t0, t1))
    return _fired(run, t0, t1, f"down {t1 - t0:.0f} s")


def _fired(run: Run, t0: float, t1: float, what: str) -> Any:
    fired = run.watch.left("deferred", t0, t1)
    if fired is None:
        return Missed(f"{what}; no trigger fired meanwhile")
    return f"{what}; the trigger fired {fired:.0f} s in"


def postgres_restart(run: Run, p: Planned) -> Any:
    """A fast shutdown of PostgreSQL just after the task deferred, ``p.hold`` s (5-20) down,
    then started again; the components that exit meanwhile are started again by the
    supervisor. Hit: the database went down while the task instance was live (deferred)."""
    if not fresh_deferral(run):
        return None
    before, t0 = dict(run.sup.restarts), time.time()
    restart_postgres(run.pg, p.hold)
    t1 = time.time()
    back = wait_healthy(run.dep)
    run.outages.append((p.kind, t0, t1 + back))
    restarted = sorted(k for k, v in run.sup.restarts.items() if v > before.get(k, 0))
    return (
        f"down {t1 - t0:.0f} s, healthy {back:.0f} s later; the supervisor restarted "
        f"{', '.join(restarted) or 'nothing'}"
    )


def kill_worker(run: Run, p: Planned) -> Any:
    """SIGKILL the whole session of the Celery worker running the task's try (its main
    process, pool child and task runner), as a lost machine; the supervisor starts it again.
    Hit: the try's task runner was among the processes killed."""
    look = run.watch.now()
    if look is None or look.state != "running" or run.worker(look.hostname) is None:
        return None
    worker = run.worker(look.hostname)
    with run.sup.holding(worker.name):  # type: ignore[union-attr]
        killed = worker.kill_session()  # type: ignore[union-attr]
    if look.pid not in killed:
        return Missed(f"{look.hostname}: the try had ended")
    run.kills.add(look.try_number)
    return f"{look.hostname}, try {look.try_number}"


def skew_workers(
    dep: deploy.AirflowDeployment, sup: Supervisor, lib: Path, shim: Path, p: Planned
) -> float:
    """Before the run is triggered: restart both Celery workers with their clocks ten minutes
    off (libfaketime, ``p.sign``: ahead or behind), as finding 3's deployment had them; the
    attempts they launch inherit it, the scheduler, triggerer and api-server keep the true
    clock. They stay so to the run's end. Returns when it began."""
    t0 = time.time()
    restart_workers(dep, sup, skew_env(lib, f"{p.sign}10m", shim))
    return t0


def skew_hit(run: Run, p: Planned) -> Callable[[], Any]:
    """What the skew hit, told at the run's end: a try of the task ran on a skewed worker."""
    hosts = {w.name.replace("_", "-") for w in run.dep.workers}

    def hit() -> Any:
        look = run.watch.ran_on(hosts, run.skewed_at or 0.0)
        if look is None:
            return Missed(f"{p.sign}10m; no try ran on a skewed worker")
        return f"{p.sign}10m; try {look.try_number} ran on {look.hostname}{_skews(run)}"

    return hit


def _skews(run: Run) -> str:
    """How far the attempts' supervisors' clocks were off (a status's heartbeat against the
    time the file was written), where they were."""
    off = []
    for d in run.attempt_dirs():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            st = d / "status.json"
            beat = float(json.loads(st.read_text())["heartbeat"]) - st.stat().st_mtime
            if abs(beat) > 60:
                off.append(beat)
    if not off:
        return ""
    return f"; {len(off)} attempts' supervisors {min(off):+.0f} to {max(off):+.0f} s off"


# -- the checkpoints ----------------------------------------------------------------------
def disk_full(run: Run, p: Planned) -> Any:
    """(A run that checkpoints to the small disk.) Once an attempt trains and a checkpoint is
    saved, fill the disk to the last byte for ``p.hold`` s (5-15), then free it. Hit: an
    attempt met it (its training process stopped with ``checkpoint-unwritable.json``)."""
    if run.disk is None or not trainers_of(run.run_dir) or not run.checkpoints():
        return None
    t0 = time.time()
    run.disk.fill()
    try:
        time.sleep(p.hold)
    finally:
        run.disk.free()
    met = [
        d.name
        for d in run.attempt_dirs()
        if (d / REASON_FILE).exists() and (d / REASON_FILE).stat().st_mtime >= t0
    ]
    what = f"full {time.time() - t0:.0f} s"
    return f"{what}: {', '.join(met)} met it" if met else Missed(f"{what}: no write met it")


def delete_checkpoints(run: Run, p: Planned) -> Any:
    """Once an attempt trains and a checkpoint is saved, delete the run's whole checkpoint
    location (every object under its S3 prefix, or its folder): checkpoints, manifests and
    the owner claims. Hit: at least one complete checkpoint was deleted while the task ran."""
    ckpts = run.checkpoints()
    if not trainers_of(run.run_dir) or not ckpts:
        return None
    if run.ckpt_dir is not None:
        shutil.rmtree(run.ckpt_dir, ignore_errors=True)
        n = len(ckpts)
    else:
        keys = run.store.list("")
        for key in keys:
            run.store.delete(key)
        n = len(keys)
    steps = {int(k.split("/")[0].split("-")[-1]) for k in ckpts}
    run.deleted |= steps
    return f"{n} objects, checkpoints of steps {min(steps)}-{max(steps)}"


# -- the task runner ----------------------------------------------------------------------
def kill_runner_after_launch(run: Run, p: Planned) -> Any:
    """Wait for a new attempt's ``spec.json`` (polled every 10 ms) and SIGKILL the task runner
    of the try that launched it at once. Hit: the job's saved state did not record the
    attempt yet (the runner died between the launch and its state save)."""
    until = run.start + run.deadline_s * 0.6
    return run.arm(p, lambda: _kill_after_launch(run, until))


def _kill_after_launch(run: Run, until: float) -> Any:
    known = {d for d in run.attempt_dirs() if (d / "spec.json").exists()}
    while time.time() < until and not run.ended.is_set():
        new = [d for d in run.attempt_dirs() if d not in known and (d / "spec.json").exists()]
        look = run.watch.now()
        running = new and look is not None and look.state == "running" and look.pid
        if running and kill_runner(look.pid, run.worker_sessions()):  # type: ignore[union-attr,arg-type]
            late = time.time() - (new[0] / "spec.json").stat().st_mtime
            run.kills.add(look.try_number)  # type: ignore[union-attr]
            time.sleep(1.0)  # a save in flight lands (nothing comes after: the runner died)
            state = job_state(run.pg.port, run.dag_id, run.run_id)
            if os.path.realpath(new[0]) in recorded_dirs(state):
                return Missed(f"{new[0].name}: recorded before the kill")
            return (
                f"{new[0].name}: try {look.try_number}'s task runner "  # type: ignore[union-attr]
                f"{late * 1000:.0f} ms after its spec"
            )
        known.update(new)
        time.sleep(0.01)
    return Missed("no new attempt launched")


def last_try_before_code(run: Run, p: Planned) -> Any:
    """(A run of the DAG whose task has ``retries=0``: its first try is its last.) Wait for the
    task's trigger to fire while its attempt trains, then SIGKILL the session of the worker
    that starts the resumed try as soon as the try is ``running`` (looked at every 50 ms):
    Airflow fails the task instance for good (the executor reports the try failed) without
    its operator having run, and the attempt is left training. Hit: the task instance then
    failed."""
    until = run.start + run.deadline_s * 0.6
    return run.arm(p, lambda: _kill_last_try(run, until))


def _kill_last_try(run: Run, until: float) -> Any:
    conn = connect(run.pg.port)
    try:
        found = _resumed_while_training(run, conn, until)
    finally:
        conn.close()
    if isinstance(found, Missed):
        return found
    look, worker, fired, size = found
    with run.sup.holding(worker.name):
        worker.kill_session()
    killed_at = time.time()
    run.kills.add(look.try_number)
    training = bool(trainers_of(run.run_dir))
    ops = [
        line
        for line in read_from(run.try_log(look.try_number), size or 0).splitlines()
        if "airflow_spot" in line or "SpotTrainingOperator" in line
    ]
    deploy.wait_for("the task instance ended", run.watch.terminal_at, 180, every=0.5)
    ended = run.watch.now()
    what = (
        f"try {look.try_number} of {look.max_tries + 1}: {worker.name} killed "
        f"{killed_at - fired:.1f} s after the trigger fired, "
        f"{len(ops)} operator log lines, its attempt {'training' if training else 'ended'}"
    )
    if ended is None or ended.state != "failed":
        return Missed(f"{what}; the task instance ended {ended.state if ended else '?'}")
    failed_at: float = run.watch.terminal_at()  # type: ignore[assignment]
    what += f"; failed {failed_at - killed_at:.0f} s later"
    if training:  # how long it trained on once the task had failed
        wait_attempts_end(run, 60.0)
        last = max(
            (d / "progress.json").stat().st_mtime
            for d in run.attempt_dirs()
            if (d / "progress.json").exists()
        )
        what += f", its attempt's last step {last - failed_at:+.1f} s after that"
    return what


def _resumed_while_training(run: Run, conn: Any, until: float) -> Any:
    """Once the task deferred, wait for its trigger to fire while the attempt trains (a
    decision tick, not the attempt's end), then for the resumed try to run: (its look, its
    worker, when the trigger fired, the try log's size then), looked at every 50 ms."""
    deferred, fired, size = False, 0.0, 0
    while not run.ended.is_set():
        look = look_up(conn, run.dag_id, run.run_id)
        if look is None or look.state in TERMINAL:
            return Missed("the task ended before its try started again")
        if not fired and not deferred:  # wait for a deferral
            if time.time() > until:
                return Missed("its trigger never fired while the attempt trained")
            deferred = look.state == "deferred"
            time.sleep(0.2)
            continue
        if not fired and look.state == "deferred":
            time.sleep(0.05)
            continue
        if not fired:  # it fired just now
            if not trainers_of(run.run_dir):
                deferred = False  # the attempt's end fired it: wait for the next deferral
                continue
            fired, log = time.time(), run.try_log(look.try_number)
            size = log.stat().st_size if log.exists() else 0
        worker = run.worker(look.hostname) if look.state == "running" else None
        if worker is not None:
            return look, worker, fired, size
        time.sleep(0.05)
    return Missed("the run ended")


FAULTS: dict[str, Callable[[Run, Planned], Any]] = {
    "kill_training": kill_training,
    "kill_triggerer": kill_component,
    "kill_scheduler": kill_component,
    "restart_api_server": restart_api_server,
    "api_server_down": api_server_down,
    "redis_restart": redis_restart,
    "postgres_restart": postgres_restart,
    LAST_TRY: last_try_before_code,
    "disk_full": disk_full,
    "delete_checkpoints": delete_checkpoints,
    "kill_runner_after_launch": kill_runner_after_launch,
    "kill_worker": kill_worker,
}
OUTAGES = ("restart_api_server", "api_server_down", "redis_restart", "postgres_restart")
SPEND_A_TRY = ("kill_worker", "kill_runner_after_launch")  # by design: never with LAST_TRY
ARMED = ("kill_runner_after_launch", LAST_TRY)  # wait in a thread of their own


# -- the counters -------------------------------------------------------------------------
def tries_lost(run: Run, tries: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """Tries that failed during an outage of the api-server, Redis or PostgreSQL (or within
    :data:`OUTAGE_MARGIN_S` after it), leaving out those a fault of ours killed on purpose and
    those the operator failed itself with a verdict (a spent budget, an infeasible deadline:
    its retry policy fails them at once); notes for every failed try."""
    lost, notes = 0, []
    for t in tries:
        n = int(t["try_number"])
        if t.get("state") not in TRY_ENDED:
            continue
        verdict = operator_verdict(run.try_log(n))
        if n in run.kills or verdict:
            why = "killed on purpose" if n in run.kills else f"the operator's {verdict}"
            notes.append(f"try {n} {t['state']} ({why})")
            continue
        ended = run.watch.try_ended_at(n) or time.time()
        cause = next((k for k, s, e in run.outages if s <= ended <= e + OUTAGE_MARGIN_S), None)
        lost += cause is not None
        notes.append(f"try {n} {t['state']} ({f'lost to {cause}' if cause else 'no outage'})")
    return lost, notes


def operator_verdict(log: Path) -> str | None:
    """The exception the operator failed the try with, if it is one of its verdicts (a
    configuration error or a spent budget: ``ConfigError``, ``BudgetExhausted`` and theirs)."""
    verdict = None
    for line in read_from(log, 0).splitlines():
        if '"Task failed with exception"' not in line:
            continue
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            kind = json.loads(line)["error_detail"][-1]["exc_type"]
            verdict = kind if kind in VERDICTS else None
    return verdict


def _subclasses(*bases: type) -> set[str]:
    found = set()
    for base in bases:
        found.add(base.__name__)
        found |= _subclasses(*base.__subclasses__())
    return found


VERDICTS = _subclasses(ConfigError, BudgetExhausted)


def unwatched_seconds(dirs: list[Path], terminal_at: float | None) -> float:
    """Seconds any attempt trained after its task instance reached a terminal state, beyond
    the :data:`STOP_S` a stop takes: the last step each reported (its progress file's time of
    writing, on this host's clock whatever the trainer's) against that moment."""
    if terminal_at is None:
        return 0.0
    total = 0.0
    for d in dirs:
        progress = d / "progress.json"
        if progress.exists():
            total += max(0.0, progress.stat().st_mtime - terminal_at - STOP_S)
    return total


def wait_attempts_end(run: Run, timeout: float) -> None:
    """Until no training process of the run is left (an unwatched one stops at the end of its
    lease at the latest), or ``timeout``."""
    end = time.time() + timeout
    while trainers_of(run.run_dir) and time.time() < end:
        time.sleep(1.0)
