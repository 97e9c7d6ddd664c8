"""The chaos benchmark's deployment and the tools of its orchestration faults (imported by
``benchmarks/chaos.py``; issue 34).

The deployment is ``tests/deployment``'s with the CeleryExecutor: a private PostgreSQL, a
private Redis (the broker), the scheduler, dag-processor, triggerer, api-server and two Celery
workers, each a process of its own on 127.0.0.1, with :data:`airflow_spot.production.
WORKER_SETTINGS` (what the README recommends to ride out api-server and broker restarts) on
every component.

:class:`Supervisor` is the emulated supervisor the README recommends for production (the units
in ``deploy/systemd``: ``Restart=always``, ``RestartSec=5``). Any component that exits (a
SIGKILL, PostgreSQL going away under the scheduler) is started again :data:`RESTART_S` seconds
later, except while a fault holds it down on purpose; what is left of its process group is
killed first (``KillMode=mixed``), but for a Celery worker's (``KillMode=process``: its
attempts' supervisors must outlive it).

:class:`Watch` reads the run's task instance from the metadata database every
:data:`Watch.EVERY_S` seconds, the api-server being one of the things taken down: each change
of its state, try, host and pid, timed on this process's clock (a skewed worker stamps the
task instance's own dates on its clock).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import conftest as deploy  # tests/deployment (chaos.py puts it on the path)

from airflow_spot.testing.clock import SKEW_KEYS

RESTART_S = 5.0  # the supervisor's RestartSec
TERMINAL = ("success", "failed", "upstream_failed", "skipped", "removed")
TRY_ENDED = ("failed", "up_for_retry")
STATE_KEY = "airflow_spot_job"  # airflow_spot.operators.spot_training.STATE_KEY
TRAINER = "airflow_spot.examples.train_logreg"


def healthy(dep: deploy.AirflowDeployment) -> bool:
    """Every component runs and the api-server reports the database, scheduler, triggerer and
    dag-processor healthy (False, not an error, while one that exited waits for the
    supervisor). A worker counts once its process runs: the ready line that ``dep.healthy``
    looks for is long gone from the end of its log after a few runs."""
    if any(c.proc is None or c.proc.poll() is not None for c in dep.components):
        return False
    try:
        health = dep.get("/api/v2/monitor/health")
    except Exception:  # noqa: BLE001 - down or restarting
        return False
    keys = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(k) or {}).get("status") == "healthy" for k in keys)


def wait_healthy(dep: deploy.AirflowDeployment, timeout: float = 240.0) -> float:
    """Seconds until every component is healthy again."""
    t0 = time.time()
    deploy.wait_for("components healthy", lambda: healthy(dep), timeout, every=1.0)
    return time.time() - t0


def stop_component(c: deploy.Component, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """``sig`` to the component's process group; SIGKILL to what is left after ``timeout``."""
    c.signal(sig)
    with contextlib.suppress(TimeoutError):
        deploy.wait_for(f"{c.name} stopped", c.stopped, timeout, every=0.2)
        return
    c.signal(signal.SIGKILL)
    deploy.wait_for(f"{c.name} killed", c.stopped, 30, every=0.2)


class Supervisor:
    """systemd's ``Restart=always``, ``RestartSec=5`` over every component of ``dep``: a thread
    that starts again, :data:`RESTART_S` after it exited, any component no fault holds. This
    restarter is the supervisor the README recommends, emulated."""

    def __init__(self, dep: deploy.AirflowDeployment) -> None:
        self.dep = dep
        self.restarts: Counter = Counter()  # component -> times started again
        self._held: set[str] = set()
        self._down_since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    @contextlib.contextmanager
    def holding(self, *names: str) -> Iterator[None]:
        """Leave these components alone meanwhile (``systemctl stop``: a fault holds them down
        or restarts them itself). Waits for a restart in progress to finish first."""
        with self._lock:
            self._held.update(names)
        try:
            yield
        finally:
            with self._lock:
                self._held.difference_update(names)
                for name in names:
                    self._down_since.pop(name, None)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            for c in self.dep.components:
                with self._lock:
                    if self._stop.is_set() or c.name in self._held or c.proc is None:
                        continue
                    if c.proc.poll() is None:
                        self._down_since.pop(c.name, None)
                        continue
                    since = self._down_since.setdefault(c.name, time.time())
                    if time.time() - since < RESTART_S:
                        continue
                    if c.name not in deploy.CELERY_WORKERS:  # KillMode=mixed: the rest too
                        c.signal(signal.SIGKILL)
                        with contextlib.suppress(TimeoutError):
                            deploy.wait_for(f"{c.name} gone", c.stopped, 10, every=0.2)
                    c.start(self.dep.env)
                    self.restarts[c.name] += 1
                    self._down_since.pop(c.name, None)


@dataclass(frozen=True)
class Look:
    """The task instance as the metadata database had it."""

    state: str | None
    try_number: int
    max_tries: int
    hostname: str
    pid: int | None
    run_state: str | None


TI_SQL = (
    "SELECT ti.state, ti.try_number, ti.max_tries, ti.hostname, ti.pid, dr.state "
    "FROM dag_run dr LEFT JOIN task_instance ti ON ti.dag_id = dr.dag_id "
    "AND ti.run_id = dr.run_id AND ti.task_id = %s AND ti.map_index = -1 "
    "WHERE dr.dag_id = %s AND dr.run_id = %s"
)


def connect(port: int) -> Any:
    import psycopg2

    conn = psycopg2.connect(
        host="127.0.0.1", port=port, user="airflow", dbname="airflow", connect_timeout=2
    )
    conn.autocommit = True
    return conn


def look_up(conn: Any, dag_id: str, run_id: str, task_id: str = "train") -> Look | None:
    with conn.cursor() as cur:
        cur.execute(TI_SQL, (task_id, dag_id, run_id))
        row = cur.fetchone()
    if row is None:
        return None
    state, try_number, max_tries, hostname, pid, run_state = row
    return Look(state, int(try_number or 0), int(max_tries or 0), hostname or "", pid, run_state)


def job_state(port: int, dag_id: str, run_id: str, task_id: str = "train") -> dict | None:
    """The job's state as the operator saved it in the task state store (None: none saved, or
    the database did not answer)."""
    try:
        conn = connect(port)
    except Exception:  # noqa: BLE001 - the database is down: nothing known
        return None
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT value FROM task_state_store WHERE dag_id = %s AND run_id = %s "
                "AND task_id = %s AND map_index = -1 AND key = %s",
                (dag_id, run_id, task_id, STATE_KEY),
            )
            row = cur.fetchone()
        return json.loads(row[0]) if row else None
    finally:
        conn.close()


def recorded_dirs(state: dict | None) -> set[str]:
    """The attempt folders the job's state records (its ledger's rows)."""
    dirs = set()
    for a in (state or {}).get("attempts") or []:
        run_dir = (a.get("handle") or {}).get("run_dir")
        if run_dir:
            dirs.add(os.path.realpath(run_dir))
    return dirs


class Watch:
    """The run's task instance, read from the metadata database by a thread every ``EVERY_S``
    seconds (through api-server outages; none while PostgreSQL is down): ``looks`` holds
    (time, :class:`Look`) for each change."""

    EVERY_S = 0.2

    def __init__(self, port: int, dag_id: str, run_id: str) -> None:
        self.port, self.dag_id, self.run_id = port, dag_id, run_id
        self.looks: list[tuple[float, Look]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        conn = None
        while not self._stop.is_set():
            try:
                conn = conn or connect(self.port)
                look = look_up(conn, self.dag_id, self.run_id)
            except Exception:  # noqa: BLE001 - down or restarting: look again
                with contextlib.suppress(Exception):
                    conn.close()  # type: ignore[union-attr]
                conn, look = None, None
            if look is not None and (not self.looks or self.looks[-1][1] != look):
                self.looks.append((time.time(), look))
            self._stop.wait(self.EVERY_S)
        with contextlib.suppress(Exception):
            conn.close()  # type: ignore[union-attr]

    def now(self) -> Look | None:
        return self.looks[-1][1] if self.looks else None

    def since(self, state: str) -> float | None:
        """Seconds the task instance has been in ``state`` (None: it is not)."""
        if not self.looks or self.looks[-1][1].state != state:
            return None
        at = self.looks[-1][0]
        for t, look in reversed(self.looks):
            if look.state != state:
                break
            at = t
        return time.time() - at

    def left(self, state: str, t0: float, t1: float) -> float | None:
        """Seconds after ``t0`` the task instance first left ``state`` before ``t1`` (None: it
        did not)."""
        was = next((lk.state for t, lk in reversed(self.looks) if t <= t0), None)
        for t, look in self.looks:
            if t0 < t <= t1:
                if was == state and look.state != state:
                    return t - t0
                was = look.state
        return None

    def ran_on(self, hosts: set[str], after: float) -> Look | None:
        """The first look after ``after`` of a try running on one of ``hosts``."""
        return next(
            (
                lk
                for t, lk in self.looks
                if t > after and lk.state == "running" and lk.hostname in hosts
            ),
            None,
        )

    def try_ended_at(self, n: int) -> float | None:
        """When try ``n`` was first seen over: failed, up for retry, or a later try begun."""
        for t, look in self.looks:
            if look.try_number > n or (look.try_number == n and look.state in TRY_ENDED):
                return t
        return None

    def terminal_at(self) -> float | None:
        """When the task instance was first seen in a terminal state."""
        return next((t for t, lk in self.looks if lk.state in TERMINAL), None)


def restart_postgres(pg: deploy.PostgresServer, down_s: float) -> None:
    """A fast shutdown, ``down_s`` seconds down, then the same server started again (its
    options as ``postmaster.opts`` recorded them)."""
    recorded = shlex.split((pg.data / "postmaster.opts").read_text())
    opts = recorded[1:]
    if "-D" in opts:  # pg_ctl gives the data folder itself
        i = opts.index("-D")
        del opts[i : i + 2]
    pg._as_owner("pg_ctl", "-D", str(pg.data), "-m", "fast", "-w", "stop")
    time.sleep(down_s)
    started = pg._as_owner("pg_ctl", "-D", str(pg.data), "-l", str(pg.log), "-o",
                           shlex.join(opts), "-w", "-t", "60", "start")  # fmt: skip
    if started.returncode:
        raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{deploy.tail(pg.log)}")
    pg.ledger.snapshot([pg.pid() or -1])


def restart_workers(
    dep: deploy.AirflowDeployment, sup: Supervisor, extra: dict[str, str] | None
) -> None:
    """Stop both Celery workers (a warm shutdown: none runs a try now), start them again with
    ``extra`` in their environment (the skew's variables, a ``PYTHONPATH`` put before theirs;
    None: without them) and wait until they say they are ready."""
    names = [w.name for w in dep.workers]
    with sup.holding(*names):
        for w in dep.workers:
            w.signal(signal.SIGTERM)
        for w in dep.workers:
            stop_component(w, signal.SIGTERM, 60)
        sizes = {}
        for w in dep.workers:
            base = _BASE_PATH.setdefault(w.name, w.extra_env.get("PYTHONPATH", ""))
            for key in SKEW_KEYS:
                w.extra_env.pop(key, None)
            w.extra_env["PYTHONPATH"] = base
            for key, value in (extra or {}).items():
                w.extra_env[key] = os.pathsep.join((value, base)) if key == "PYTHONPATH" else value
            sizes[w.name] = w.log.stat().st_size if w.log.exists() else 0
            w.start(dep.env)

        def ready() -> bool:
            return all(
                f"celery@{w.name.replace('_', '-')} ready." in read_from(w.log, sizes[w.name])
                for w in dep.workers
            )

        deploy.wait_for("workers ready", ready, 120, every=0.5)


_BASE_PATH: dict[str, str] = {}  # a worker's own PYTHONPATH (its hostname module's folder)


def read_from(path: Path, offset: int) -> str:
    """What ``path`` holds past ``offset`` bytes."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


class SmallDisk:
    """A 512 KB tmpfs the benchmark mounts for the runs that checkpoint to a local root: a
    real file system, filled to the last byte for a while (the kernel's ENOSPC)."""

    SIZE = "512k"

    def __init__(self, where: Path) -> None:
        self.where = where
        self.filler = where / "filler"

    @classmethod
    def mount(cls, where: Path) -> tuple[SmallDisk | None, str]:
        """The mounted disk, or None and why not (mounting needs CAP_SYS_ADMIN)."""
        where.mkdir(parents=True, exist_ok=True)
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={cls.SIZE},mode=0755", "tmpfs", str(where)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except OSError as e:
            return None, f"cannot mount a small tmpfs: {e}"
        if done.returncode:
            return None, f"cannot mount a small tmpfs: {done.stderr.strip()}"
        return cls(where), ""

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as fh:
            for block in (1 << 16, 4096, 1):
                with contextlib.suppress(OSError):
                    while True:
                        fh.write(b"\0" * block)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.where)], capture_output=True, timeout=30)


def kill_runner(pid: int, worker_sessions: set[int]) -> bool:
    """SIGKILL the task runner ``pid`` (only if it runs in a Celery worker's session)."""
    try:
        if os.getsid(pid) not in worker_sessions:
            return False
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def trainers_of(run_dir: Path) -> list[int]:
    """The training processes of a run (their environment names its folder)."""
    out = subprocess.run(["pgrep", "-f", TRAINER], capture_output=True, text=True)
    pids = []
    for pid in out.stdout.split():
        with contextlib.suppress(OSError):
            if str(run_dir).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                pids.append(int(pid))
    return pids


@dataclass(frozen=True)
class Missed:
    """What a fault did when it hit nothing (it is not counted)."""

    why: str


class Armed(threading.Thread):
    """A fault that waits for its moment in a thread of its own (a new attempt's spec, a
    trigger firing); ``result`` once done, as the fault functions return it."""

    def __init__(self, body: Callable[[], Any], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.body = body
        self.result: Any = None

    def run(self) -> None:
        try:
            self.result = self.body()
        except Exception as e:  # noqa: BLE001 - a fault that broke is told, not raised
            self.result = Missed(f"error: {type(e).__name__}: {e}")
