"""A real Airflow deployment on 127.0.0.1, started by the tests themselves: a private PostgreSQL
(Debian's, run as the ``postgres`` user), ``airflow db migrate``, then the scheduler
(LocalExecutor), dag-processor, triggerer and api-server, each a process of its own. With
``executor="CeleryExecutor"``, a private Redis (Debian's ``redis-server``) is the broker and two
Celery workers (``airflow celery worker``) run the tasks instead.

Nothing binds anything but 127.0.0.1: the api-server gets ``--host 127.0.0.1`` and a free port,
Redis ``--bind 127.0.0.1``, and the scheduler, triggerer and workers run with
``--skip-serve-logs`` (Airflow's log server listens on every interface; the api-server reads the
task logs from the shared ``AIRFLOW_HOME``).

Setup cost: the session migrates one database once (``postgres_template``: initdb, ``airflow db
migrate``, a clean stop); each module's server is a copy of that data directory with its own
port, processes and database, started in about a second. A module whose settings the migration
reads (:data:`MIGRATE_SETTINGS`) gets its database migrated anew. The components start at once
and are polled every 0.25 s until healthy (their start is CPU-bound: ~17 s of CPU for a Celery
deployment). After the module they are SIGKILLed, sessions and all (a graceful stop takes 2 to
20 s and nothing reads it there; a test that checks one calls ``stop()``).

Reuse: override the ``deployment_dags`` fixture (``{file name: source}``) in a test module and
ask for ``airflow_deployment``; for Celery, override ``deployment_executor`` (it returns
``CeleryExecutor`` and asks for ``redis_server``) and, for settings of its own,
``deployment_celery_env`` (every component) or ``deployment_worker_env`` (one worker's: its
queue, its Task SDK settings). A DAG whose training is only waited for once the test has seen
what it watches runs ``paced_training`` (paced while a file of the test's exists).
Without PostgreSQL the tests are skipped, and they fail with ``AIRFLOW_SPOT_REQUIRE_DEPLOYMENT=1``
(``.ci/run`` sets it when it installed PostgreSQL); without Redis a Celery deployment is skipped,
and fails with ``AIRFLOW_SPOT_REQUIRE_CELERY=1`` (set when both are installed).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REQUIRE_ENV = "AIRFLOW_SPOT_REQUIRE_DEPLOYMENT"
REQUIRE_CELERY_ENV = "AIRFLOW_SPOT_REQUIRE_CELERY"
POSTGRES_BIN_ENV = "AIRFLOW_SPOT_POSTGRES_BIN"  # where initdb and pg_ctl are, if not Debian's
REDIS_SERVER_ENV = "AIRFLOW_SPOT_REDIS_SERVER"  # the redis-server binary, if not Debian's
COMPONENTS = ("scheduler", "dag_processor", "triggerer", "api_server")
CELERY_WORKERS = ("worker_1", "worker_2")  # the Celery workers of a CeleryExecutor deployment
STOP_TIMEOUT_S = 20.0
SQL_CONN_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
MIGRATE_SETTINGS = (  # prefixes: a _CMD or _SECRET variant counts too
    "AIRFLOW__DATABASE__",
    "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT",
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__LOGGING__LOG_FILENAME_TEMPLATE",
    "AIRFLOW__ELASTICSEARCH__LOG_ID_TEMPLATE",
)


def _fernet_key() -> str:
    """A fresh Fernet key (Airflow's own dependency makes it), in the components' environment
    only: never written to disk."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    """``check()``'s first truthy value, polled every ``every`` seconds; TimeoutError naming
    ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def require_or_skip(reason: str, require_env: str = REQUIRE_ENV) -> None:
    """Skip the test, or fail it when ``require_env=1`` (``AIRFLOW_SPOT_REQUIRE_DEPLOYMENT``
    unless told) asks for the deployment to run."""
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{require_env}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def postgres_bin_dir() -> Path | None:
    """``$AIRFLOW_SPOT_POSTGRES_BIN``, else Debian's newest ``/usr/lib/postgresql/<version>/bin``;
    None unless it holds ``initdb`` and ``pg_ctl``."""
    if os.environ.get(POSTGRES_BIN_ENV):
        where = Path(os.environ[POSTGRES_BIN_ENV])
        return where if (where / "initdb").exists() and (where / "pg_ctl").exists() else None
    found = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")
    dirs = [Path(p).parent for p in found if (Path(p).parent / "initdb").exists()]
    return max(
        dirs, key=lambda d: [int(x) for x in re.findall(r"\d+", d.parent.name)], default=None
    )


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file (for error messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<{path}: {e}>"


def redis_server_binary() -> Path | None:
    """``$AIRFLOW_SPOT_REDIS_SERVER``, else ``redis-server`` on the PATH (Debian's
    ``/usr/bin/redis-server``); None when there is none."""
    found = os.environ.get(REDIS_SERVER_ENV) or shutil.which("redis-server")
    return Path(found) if found and os.access(found, os.X_OK) else None


def group_members(pgid: int) -> list[int]:
    """The processes of the process group ``pgid`` still running (zombies left out: they
    have ended and wait only for their parent, or init, to reap them)."""
    import psutil

    left = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
    return left


def session_members(sid: int) -> list[int]:
    """The processes of the session ``sid`` still running, zombies left out: a component and
    everything it started that did not leave its session (a task runner in a process group of
    its own stays; the local backend's detached supervisors leave)."""
    import psutil

    left = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
    return left


class ProcessLedger:
    """Every process of a deployment seen so far: the components, their descendants, and
    anything whose command line names the deployment's folder (the local backend's detached
    supervisors and their training processes)."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.join(root, "")  # with the separator: not deployment01 for deployment0
        self.seen: dict[tuple[int, float], str] = {}
        self.listening: set[tuple[str, int, str]] = set()  # (address, port, command line)

    def _mine(self, pids: list[int]) -> list[Any]:
        import psutil

        procs = []
        for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
            with contextlib.suppress(psutil.Error):
                if p.pid in pids or self.root in " ".join(p.info["cmdline"] or ()):
                    procs += [p, *p.children(recursive=True)]
        return procs

    def snapshot(self, pids: list[int]) -> None:
        """Record the deployment's processes now alive, and the TCP ports they listen on."""
        import psutil

        for p in self._mine(pids):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(p.cmdline())[:200]
                self.seen[(p.pid, p.create_time())] = cmd
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        self.listening.add((c.laddr.ip, c.laddr.port, cmd))

    def kill_alive(self) -> None:
        """SIGKILL every process :meth:`alive` lists (a failed test's leftovers)."""
        import psutil

        for entry in self.alive():
            with contextlib.suppress(psutil.Error):
                psutil.Process(int(entry.split(":")[0])).kill()

    def alive(self) -> list[str]:
        """Processes seen (or naming the folder now) that still run, zombies excepted."""
        import psutil

        self.snapshot([])
        left = []
        for (pid, created), cmd in self.seen.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid}: {cmd}")
        return left


def migrate_settings(env: dict[str, str]) -> dict[str, str]:
    """The settings of ``env`` that ``airflow db migrate`` writes into the database or obeys
    (read from airflow/utils/db.py and db_manager.py): the [database] section (its connection
    left out), the default pool's size, the log templates and the auth manager (its own tables).
    Two environments that agree on them get the same migrated database."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(MIGRATE_SETTINGS) and not k.startswith(SQL_CONN_ENV)
    }


@dataclass(frozen=True)
class PostgresTemplate:
    """A stopped server's data directory whose ``airflow`` database ``airflow db migrate`` made
    with ``settings`` (:func:`migrate_settings`): each module's server starts from a copy."""

    bin_dir: Path
    data: Path
    settings: dict[str, str]


@dataclass
class PostgresServer:
    """A private PostgreSQL server on 127.0.0.1, its data and socket in a folder of its own,
    run by the ``postgres`` user (initdb refuses root)."""

    bin_dir: Path
    root: Path
    port: int = field(default_factory=free_port)
    user: str = "postgres"
    ledger: ProcessLedger = field(init=False)
    # the settings its ``airflow`` database was migrated with, when copied from a template
    migrated_with: dict[str, str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.ledger = ProcessLedger(self.root)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "airflow") -> str:
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = ["runuser", "-u", self.user, "--", str(self.bin_dir / argv[0]), *argv[1:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self, template: PostgresTemplate | None = None) -> None:
        """initdb (trust auth, superuser ``airflow``) and create the ``airflow`` database, or
        copy ``template``'s data directory (its ``airflow`` database already migrated); then
        start on 127.0.0.1 only. Durability is off: a test database need not survive a crash."""
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.root, self.user, self.user)
        if template is None:
            self._initdb()
        else:  # as the owner: the copy keeps the postgres user's files and modes
            cmd = ["runuser", "-u", self.user, "--", "cp", "-a", str(template.data), str(self.data)]
            copied = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
            if copied.returncode:
                raise RuntimeError(f"copying the template's data failed: {copied.stderr}")
            self.migrated_with = dict(template.settings)
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        started = self._as_owner("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts,
                                 "-w", "-t", "60", "start")  # fmt: skip
        if started.returncode:
            raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{tail(self.log)}")
        self.ledger.snapshot([self.pid() or -1])
        if template is None:
            self.execute("CREATE DATABASE airflow")

    def _initdb(self) -> None:
        init = self._as_owner("initdb", "-D", str(self.data), "-U", "airflow", "-A", "trust",
                              "-E", "UTF8", "--no-sync")  # fmt: skip
        if init.returncode:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr}")

    def execute(self, *statements: str) -> None:
        """Run statements in the ``postgres`` database, outside a transaction (CREATE
        DATABASE cannot run in one)."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="airflow", dbname="postgres")
        conn.autocommit = True
        try:
            for statement in statements:
                conn.cursor().execute(statement)
        finally:
            conn.close()

    def recreate_database(self) -> None:
        """An empty ``airflow`` database in place of the template's (then migrated anew)."""
        self.execute("DROP DATABASE airflow WITH (FORCE)", "CREATE DATABASE airflow")
        self.migrated_with = None

    def pid(self) -> int | None:
        """The postmaster's pid, from ``postmaster.pid`` (None when it is not running)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        return self._as_owner("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def stop(self) -> None:
        """A fast shutdown (SIGKILL of the postmaster if that does not end it)."""
        if not self.data.exists() or not self.running():
            return
        pid = self.pid()
        self.ledger.snapshot([pid or -1])  # the backends of every connection, too
        if self._as_owner("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop").returncode:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]


@dataclass
class RedisServer:
    """A private Redis on 127.0.0.1 (the Celery broker): no persistence (``--save ''
    --appendonly no``), in the foreground (not daemonized), its folder of its own."""

    binary: Path
    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    ledger: ProcessLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = ProcessLedger(self.root)

    @property
    def log(self) -> Path:
        return self.root / "redis.log"

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it answers PING (it fails at once should it exit)."""
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [str(self.binary), "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--protected-mode", "yes", "--dir", str(self.root), "--logfile", ""]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for("redis answers PING", self.ping, timeout, every=0.2)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{tail(self.log)}") from None
        self.ledger.snapshot([self.proc.pid])

    def ping(self) -> bool:
        """Whether it answers PING on its port (RuntimeError, naming its log, if it exited)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited {self.proc.returncode}:\n{tail(self.log)}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (nothing to save), SIGKILL if it has not exited after ``timeout`` s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.ledger.snapshot([self.proc.pid])
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Component:
    """One Airflow component, in a session (process group) of its own, logging to a file;
    ``extra_env`` is added to the deployment's environment (a worker's own hostname)."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self, env: dict[str, str]) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env={**env, **self.extra_env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the component's whole process group."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stopped(self) -> bool:
        """Whether the component and every process of its group have ended."""
        return self.proc is None or (
            self.proc.poll() is not None and not group_members(self.proc.pid)
        )

    def kill_session(self) -> list[int]:
        """SIGKILL every process of the component's session at once, as a lost machine would
        end them: a Celery worker's main process, its pool children and the task runners (each
        in a process group of its own). What left the session (the local backend's detached
        supervisors and their training) lives on. Returns the pids killed."""
        if self.proc is None:
            return []
        killed: list[int] = []
        end = time.monotonic() + 10.0
        while (left := session_members(self.proc.pid)) and time.monotonic() < end:
            for pid in left:  # again while any is left: one may have forked in between
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed += [pid for pid in left if pid not in killed]
            time.sleep(0.05)
        self.proc.wait(30)
        return killed

    def ended(self) -> bool:
        """Whether the component and every process of its session have ended."""
        return self.proc is None or (
            self.proc.poll() is not None and not session_members(self.proc.pid)
        )


class AirflowDeployment:
    """The four components against one metadata database, on 127.0.0.1, with a REST client;
    with ``executor="CeleryExecutor"`` and a ``broker_url``, two Celery workers as well
    (:data:`CELERY_WORKERS`, one task at a time each, each its own hostname)."""

    def __init__(
        self,
        root: Path,
        db_url: str,
        dags: dict[str, str],
        executor: str = "LocalExecutor",
        broker_url: str | None = None,
        celery_env: dict[str, str] | None = None,
        worker_env: dict[str, dict[str, str]] | None = None,
    ) -> None:
        if executor not in ("LocalExecutor", "CeleryExecutor"):
            raise ValueError(f"executor: LocalExecutor or CeleryExecutor, not {executor!r}")
        if executor == "CeleryExecutor" and not broker_url:
            raise ValueError("a CeleryExecutor deployment needs broker_url (a RedisServer's url)")
        self.executor = executor
        self.broker_url = broker_url
        self.celery_env = dict(celery_env or {})
        self.worker_env = dict(worker_env or {})  # worker name -> its own settings
        self.root = root
        self.home = root / "airflow_home"
        self.dags_folder = root / "dags"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.db_url = db_url
        self.ledger = ProcessLedger(root)
        for folder in (self.home, self.dags_folder, root / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        for name, source in dags.items():
            (self.dags_folder / name).write_text(source)
        self.env = self._env()
        names = COMPONENTS + (CELERY_WORKERS if executor == "CeleryExecutor" else ())
        self.components = [self._component(name) for name in names]
        self._client: Any = None
        self._snapshot_at = 0.0  # when healthy() last recorded the processes (monotonic)

    @property
    def workers(self) -> list[Component]:
        """The Celery workers (none under the LocalExecutor)."""
        return [c for c in self.components if c.name in CELERY_WORKERS]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="4",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.base_url}/execution/",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=self.db_url,
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__BASE_URL=f"{self.base_url}/",
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__API_AUTH__JWT_SECRET=os.urandom(32).hex(),
            # one key for every component: without it the first to start writes airflow.cfg
            # with a key of its own, and a component that read the config before that has
            # none; a trigger the api-server stored encrypted then killed the triggerer at
            # start (json.loads of a Fernet token: seen once in CI)
            AIRFLOW__CORE__FERNET_KEY=_fernet_key(),
            AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(self.root / "logs"),
            # the log servers stay off (--skip-serve-logs); should one start, not on 8793/8794
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK="False",
            AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES="1",
            # a worker notices a task process's exit only at its next wake-up when the task's
            # sockets closed first: up to this long late (default 5 s). A trigger firing before
            # that late report fails the task (apache/airflow#71580; see min_deferral)
            AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL="1",
            # the tests' plans, kept between runs (tests/conftest.py), else the deployment's
            AIRFLOW_SPOT_PLAN_CACHE=os.environ.get("AIRFLOW__SPOT_TRAINING__PLAN_CACHE")
            or str(self.root / "plans"),
            # the deployments' checkpoints (tests, chaos benchmarks) are in temporary folders
            AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS=str(
                Path(tempfile.gettempdir()).resolve()
            ),
            PYTHONUNBUFFERED="1",
        )
        if self.executor == "CeleryExecutor":
            env.update(self._celery_env())
        return env

    def _celery_env(self) -> dict[str, str]:
        """The CeleryExecutor's settings: Redis as the broker, the metadata database as the
        result backend (Airflow's default), then the test module's own (``celery_env``)."""
        assert self.broker_url is not None
        return {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            **self.celery_env,
        }

    def _component(self, name: str) -> Component:
        log = self.root / "logs" / f"{name}.log"
        if name in CELERY_WORKERS:
            return self._worker(name, log)
        args = {
            "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag_processor": ["dag-processor"],
            "triggerer": ["triggerer", "--skip-serve-logs"],
            "api_server": ["api-server", "--host", "127.0.0.1", "--port", str(self.port)],
        }[name]
        argv = [sys.executable, "-m", "airflow", *args]
        return Component(name, argv, log)

    def _worker(self, name: str, log: Path) -> Component:
        """A Celery worker: one task at a time, no log server, its own Celery node name
        (``celery@worker-1``) and its own task-instance hostname (``worker-1``, what
        ``[core] hostname_callable`` reports for its tries: both run on this one machine)."""
        hostname = name.replace("_", "-")
        module = self.root / "pythonpath" / "spot_deployment_hostname.py"
        module.parent.mkdir(exist_ok=True)
        module.write_text(  # the same for every worker: each reads its own variable
            "import os\n\n\ndef hostname():\n"
            "    return os.environ['AIRFLOW_SPOT_DEPLOYMENT_HOSTNAME']\n"
        )
        own = self.worker_env.get(name, {})
        # a worker's own PYTHONPATH goes first, before the hostname module's and the deployment's
        parts = (own.get("PYTHONPATH"), str(module.parent), self.env.get("PYTHONPATH"))
        path = os.pathsep.join(p for p in parts if p)
        argv = [sys.executable, "-m", "airflow", "celery", "worker", "--concurrency", "1",
                "--skip-serve-logs", "--celery-hostname", hostname, "--without-mingle",
                "--without-gossip"]  # fmt: skip
        extra = {
            "AIRFLOW_SPOT_DEPLOYMENT_HOSTNAME": hostname,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "spot_deployment_hostname.hostname",
            **own,
            "PYTHONPATH": path,
        }
        return Component(name, argv, log, extra_env=extra)

    def worker_ready(self, worker: Component) -> bool:
        """Whether the Celery worker says it is ready (its ``celery@<name> ready.`` line)."""
        return f"celery@{worker.name.replace('_', '-')} ready." in tail(worker.log, 200)

    # -- life cycle -------------------------------------------------------------------------
    def migrate(self) -> None:
        """``airflow db migrate`` against the deployment's database."""
        out = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if out.returncode:
            raise RuntimeError(
                f"airflow db migrate failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
            )

    def start(self, timeout: float = 180.0) -> None:
        """Start the components and wait until the api-server reports all of them healthy."""
        for c in self.components:
            c.start(self.env)
        try:  # polled often (cheap); the processes are recorded at most once a second
            wait_for("all components healthy", self.healthy, timeout, every=0.25)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.diagnosis()}") from None

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.components if c.proc is not None]

    def healthy(self) -> bool:
        """Whether ``/api/v2/monitor/health`` reports the database and every component
        healthy (a component that died fails at once, naming its log)."""
        for c in self.components:
            if c.proc is not None and c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited {c.proc.returncode}:\n{tail(c.log)}")
        if time.monotonic() - self._snapshot_at >= 1.0:  # a snapshot costs ~40 ms of CPU
            self._snapshot()
        try:
            health = self.get("/api/v2/monitor/health")
        except Exception:  # noqa: BLE001 - not up yet
            return False
        keys = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        if not all((health.get(k) or {}).get("status") == "healthy" for k in keys):
            return False
        if not all(self.worker_ready(w) for w in self.workers):
            return False
        self._snapshot()  # every process and port of the deployment as it is ready
        return True

    def _snapshot(self) -> None:
        self.ledger.snapshot(self.pids())
        self._snapshot_at = time.monotonic()

    def task_errors(self, limit: int = 20) -> str:
        """The error lines of the task and trigger logs (for a failing test's message)."""
        lines = []
        for log in sorted((self.root / "logs").glob("dag_id=*/**/*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if '"level":"error"' in line.replace(" ", "") and "RuntimeWarning" not in line:
                    lines.append(f"{log.relative_to(self.root / 'logs')}: {line[:1500]}")
        return "\n".join(lines[-limit:])

    def diagnosis(self) -> str:
        return "\n".join(f"--- {c.name} ({c.log}):\n{tail(c.log, 20)}" for c in self.components)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every component: SIGTERM to each one's process group, SIGKILL to what is left
        of them after ``timeout`` seconds (all at once: some take seconds to exit)."""
        self.ledger.snapshot(self.pids())
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            for c in self.components:
                if not c.stopped():
                    c.signal(sig)
            with contextlib.suppress(TimeoutError):
                wait_for("components stopped", self.stopped, wait, every=0.2)
                break
        if self._client is not None:
            self._client.close()
            self._client = None

    def kill(self) -> None:
        """SIGKILL every component's whole session at once (a module's teardown: nothing reads
        the deployment after its tests, and a graceful stop took 3 to 11 s here, once the full
        20 s). What left the sessions, the ledger kills (:meth:`ProcessLedger.kill_alive`). A
        test that checks a graceful stop calls :meth:`stop` itself."""
        self.ledger.snapshot(self.pids())  # the task runners too, each in a group of its own
        # only the running ones: an unreaped process keeps its pid (and session id) from reuse
        running = [c for c in self.components if c.proc is not None and c.proc.poll() is None]
        for c in running:
            c.signal(signal.SIGKILL)
        for c in running:
            c.kill_session()  # what the first signal missed: the task runners' groups
        if self._client is not None:
            self._client.close()
            self._client = None

    def stopped(self) -> bool:
        """Whether every component and every process of their groups have ended."""
        return all(c.stopped() for c in self.components)

    # -- REST -------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        import httpx

        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=30.0)
        return self._client

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call; its response (any status)."""
        return self.client.request(method, path, **kwargs)

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path``: its JSON body (HTTPStatusError on a status >= 400)."""
        r = self.request("GET", path, params=params)
        r.raise_for_status()
        return r.json()

    def wait_for_dag(self, dag_id: str, timeout: float = 90.0) -> dict[str, Any]:
        """The DAG once the dag-processor has parsed it (an import error fails at once)."""

        def parsed() -> dict[str, Any] | None:
            errors = self.get("/api/v2/importErrors").get("import_errors") or []
            if errors:
                raise RuntimeError(f"DAG import errors: {errors}")
            r = self.request("GET", f"/api/v2/dags/{dag_id}")
            return r.json() if r.status_code == 200 else None

        return wait_for(f"DAG {dag_id} parsed", parsed, timeout, every=1.0)

    def trigger(self, dag_id: str) -> str:
        """Unpause ``dag_id`` and start a run of it now; the run's id."""
        self.request(
            "PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}
        ).raise_for_status()
        r = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})
        r.raise_for_status()
        return r.json()["dag_run_id"]


def _postgres_or_skip() -> Path:
    """Debian's PostgreSQL (or ``$AIRFLOW_SPOT_POSTGRES_BIN``) and a user to run it as; the
    test is skipped without them (or fails, with ``AIRFLOW_SPOT_REQUIRE_DEPLOYMENT=1``)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        where = os.environ.get(POSTGRES_BIN_ENV) or "/usr/lib/postgresql/<version>/bin"
        require_or_skip(
            f"PostgreSQL is not installed (no initdb and pg_ctl in {where}): "
            "apt-get install -y postgresql"
        )
    if shutil.which("runuser") is None or not _has_user("postgres"):
        require_or_skip("no `runuser` or no `postgres` user to run PostgreSQL as")
    return bin_dir  # type: ignore[return-value]


class TemplateCache:
    """The session's migrated template (:class:`PostgresTemplate`), made on first use: initdb,
    ``airflow db migrate`` with a deployment's settings (as :meth:`AirflowDeployment.migrate`
    runs it), then a clean stop. Nothing of it runs afterwards; :meth:`remove` deletes it."""

    def __init__(self, home: Path) -> None:
        self.home = home  # where the template's throwaway deployment folder goes
        self.root = Path(tempfile.mkdtemp(prefix="airflow-spot-pg-template-"))
        self._made: PostgresTemplate | None = None

    def template(self, bin_dir: Path) -> PostgresTemplate:
        if self._made is None:
            server = PostgresServer(bin_dir, self.root)
            try:
                server.start()
                dep = AirflowDeployment(self.home, server.url(), {})
                dep.migrate()
            finally:
                server.stop()  # a fast shutdown is a clean one: the data directory is whole
            self._made = PostgresTemplate(bin_dir, server.data, migrate_settings(dep.env))
        return self._made

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemplateCache]:
    """The session's migrated database, made when the first module's server asks for it (a
    module skipped before then makes none): each module's server starts from a copy of its
    data directory in about a second, instead of an initdb and a migrate (3 to 10 s)."""
    cache = TemplateCache(tmp_path_factory.mktemp("template"))
    try:
        yield cache
    finally:
        cache.remove()


@pytest.fixture(scope="module")
def postgres_server(postgres_template: TemplateCache) -> Iterator[PostgresServer]:
    """A private PostgreSQL server for this module's deployment, its data directory a copy of
    the session's migrated template (its own port, processes and database), stopped and
    removed after."""
    bin_dir = _postgres_or_skip()
    template = postgres_template.template(bin_dir)
    root = Path(tempfile.mkdtemp(prefix="airflow-spot-pg-"))
    server = PostgresServer(bin_dir, root)
    try:
        server.start(template)
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def deployment_dags() -> dict[str, str]:
    """The DAG files (name -> source) written into the deployment's dags folder; a test
    module overrides it."""
    return {}


@pytest.fixture(scope="module")
def deployment_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the module's deployment keeps everything in (home, dags, logs, runs)."""
    return tmp_path_factory.mktemp("deployment")


PACED_TRAINING = '''"""Written by tests/deployment/conftest.py: the bundled example training, each step paced
to --step-seconds while the file named first exists, at full speed once the test removes it."""
import os
import sys
import time
from types import SimpleNamespace

from airflow_spot.examples import train_logreg

PACE = sys.argv.pop(1)


def sleep(seconds):
    if os.path.exists(PACE):
        time.sleep(seconds)


train_logreg.time = SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
sys.exit(train_logreg.main())
'''


@pytest.fixture(scope="module")
def paced_training(deployment_root: Path) -> Path:
    """A training script for a module's DAG: ``[python, script, pace_file, *options of
    train_command]``. It trains as ``train_command`` does, paced while ``pace_file`` exists;
    once the test has seen what it watches, removing the file finishes the training at once
    (the rest of a paced run is only waited for: 20 to 50 s of a module's set-up)."""
    script = deployment_root / "paced_train.py"
    script.write_text(PACED_TRAINING)
    return script


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A private Redis for this module's Celery deployment, stopped and removed after. Without
    ``redis-server`` or Airflow's Celery provider (the ``celery`` extra) the test is skipped,
    or fails with ``AIRFLOW_SPOT_REQUIRE_CELERY=1``."""
    import importlib.util

    binary = redis_server_binary()
    if binary is None:
        where = os.environ.get(REDIS_SERVER_ENV) or "redis-server on the PATH"
        require_or_skip(
            f"Redis is not installed (no {where}): apt-get install -y redis-server",
            REQUIRE_CELERY_ENV,
        )
    if importlib.util.find_spec("airflow.providers.celery") is None:
        require_or_skip(
            "Airflow's Celery provider is not installed: pip install -e '.[celery]'",
            REQUIRE_CELERY_ENV,
        )
    root = Path(tempfile.mkdtemp(prefix="airflow-spot-redis-"))
    server = RedisServer(binary, root)  # type: ignore[arg-type]
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def deployment_executor() -> str:
    """The deployment's executor: ``LocalExecutor``; a test module overrides it with
    ``CeleryExecutor``, asking for ``redis_server`` (its broker) too."""
    return "LocalExecutor"


@pytest.fixture(scope="module")
def deployment_celery_env() -> dict[str, str]:
    """Settings (``AIRFLOW__...`` variables) a Celery deployment's module adds; none here."""
    return {}


@pytest.fixture(scope="module")
def deployment_worker_env() -> dict[str, dict[str, str]]:
    """Settings of one Celery worker only (worker name -> ``AIRFLOW__...`` variables), on top
    of the deployment's: ``AIRFLOW__OPERATORS__DEFAULT_QUEUE`` makes it serve that queue (the
    default of ``airflow celery worker --queues``); none here."""
    return {}


@pytest.fixture(scope="module")
def airflow_deployment(
    request: pytest.FixtureRequest,
    deployment_executor: str,  # first: a Celery module's skips before PostgreSQL starts
    postgres_server: PostgresServer,
    deployment_root: Path,
    deployment_dags: dict[str, str],
    deployment_celery_env: dict[str, str],
    deployment_worker_env: dict[str, dict[str, str]],
) -> Iterator[AirflowDeployment]:
    """A migrated database and the four components (and the Celery workers), all healthy;
    killed after the module (a test may stop it earlier, gracefully: both are harmless after
    a stop)."""
    broker = None
    if deployment_executor == "CeleryExecutor":
        broker = request.getfixturevalue("redis_server").url()
    dep = AirflowDeployment(
        deployment_root,
        postgres_server.url(),
        deployment_dags,
        executor=deployment_executor,
        broker_url=broker,
        celery_env=deployment_celery_env,
        worker_env=deployment_worker_env,
    )
    if postgres_server.migrated_with != migrate_settings(dep.env):
        # settings of the module's own that the migration reads: a database migrated with them
        if postgres_server.migrated_with is not None:
            postgres_server.recreate_database()
        dep.migrate()
    try:
        dep.start()
        yield dep
    finally:
        dep.kill()
        dep.ledger.kill_alive()  # what a failed test left (detached supervisors, training)
