"""A spot training DAG on a CeleryExecutor deployment: PostgreSQL, Redis (the broker), the
scheduler, dag-processor, triggerer, api-server and two Celery workers, each its own process, on
127.0.0.1. Mid-run, the worker running the task is SIGKILLed whole (its session: the Celery main
process, its pool child and the task runner); the local backend's detached supervisor, and the
attempt it trains, live on.

What the kill does to the try (read from Airflow 3.3.2 and provider 3.26.0, and seen here):

    a worker (say worker-1) runs try 1 (its Celery message unacked: task_acks_late)
    -> SIGKILL of worker-1's session: the try's heartbeats (every second) stop; the attempt
       trains on
    -> [scheduler] task_instance_heartbeat_timeout (10 s here, 300 s by default) later the
       scheduler fails try 1 ("Detected a task instance without a heartbeat"), its executor
       reports it failed, and the scheduler marks it up_for_retry (the operator's retries
       default to 3; its retry policy judges exceptions, and a heartbeat timeout raises none)
    -> after retry_delay (1 s here), try 2 goes through Redis to worker-2, the one left
    -> try 2 reads the job's state from the task state store and re-attaches to the live
       attempt ("Resuming job state from try 2: 1 attempts so far."): no attempt is launched
    -> the attempt finishes, try 2 succeeds with the whole job's summary

It is the heartbeat timeout and the next try, never a redelivery of try 1. Redis redelivers an
unacked message only once ``[celery_broker_transport_options] visibility_timeout`` has passed
(Airflow sets 86400 s when it is not set), and kombu looks for such messages only every 100 s
or so (every tenth of its 10 s restore ticks); a redelivered try 1 would not run anyway: the
execution API refuses to start a try already ``running`` under another hostname (409, the
provider's ``TaskAlreadyRunningError``, the message dropped) or no longer queued. A short
visibility timeout would only redeliver healthy long tries into that refusal, so it is set
longer than any run here (3600 s), and the heartbeat timeout is what notices the kill.

Each worker runs one task at a time (``--concurrency 1``), without a log server
(``--skip-serve-logs``), under its own Celery node name (``--celery-hostname``) and its own
task-instance hostname (``[core] hostname_callable``: both run on one machine), so a try's
record says which worker ran it. The market keeps spot up throughout: the job needs one attempt,
and a second one (a duplicate launched by the next try) is a failure.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from airflow_spot.testing import scripted_trace

DAG_ID = "spot_deployment_celery"
TASK_ID = "train"
STEPS = 400
STEP_S = 0.125  # 50 s of training: the next try arrives ~20-30 s after the kill (then unpaced)
KILL_AT_STEP = 40  # the attempt has trained (and checkpointed) a while when its worker dies
HEARTBEAT_TIMEOUT_S = 10
START_TIMEOUT_S = 150.0  # trigger -> try 1 training on a worker (a loaded machine is slow)
RUN_TIMEOUT_S = 240.0  # the kill -> the run's end
SUPERVISOR = "airflow_spot.backends.local.supervisor"

MARKET = [(True, 2000)]  # ticks of 600 s at 360x: spot up for 55 min of wall time

DAG_SOURCE = '''
"""Written by tests/deployment/test_deployment_celery.py."""
import sys
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

ROOT = {root!r}
STEPS = {steps}
STEP_S = {step_s}

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False) as dag:
    SpotTrainingOperator(
        task_id={task_id!r},
        # paced while ROOT/pace exists: the test unpaces it once try 2 has re-attached
        command=[sys.executable, {paced!r}, ROOT + "/pace",
                 *train_command(STEPS, step_seconds=STEP_S, save_every=5, seed=7)[3:]],
        checkpoint_uri=ROOT + "/ckpt",
        expected_compute=timedelta(seconds=STEPS * STEP_S),
        total_steps=STEPS,
        deadline=timedelta(seconds={deadline_s}),
        changeover=timedelta(seconds=1),
        policy="uniform_progress",
        max_failures=0,
        backend=LocalBackend(
            trace={trace!r}, polarity="available", time_scale=360.0, work_dir=ROOT + "/runs",
            notice_s=0.2, grace_s=2.0,
        ),
        decision_interval=timedelta(seconds=5),
        poll_interval=0.5,
        deferrable=False,  # the try waits in its worker: the kill hits it, not a trigger
        retry_delay=timedelta(seconds=1),  # the retries stay the operator's default (3)
    )
'''


@pytest.fixture(scope="module")
def deployment_executor(redis_server: Any) -> str:
    """Celery, with the module's Redis as the broker (skipped without Redis)."""
    return "CeleryExecutor"


@pytest.fixture(scope="module")
def deployment_celery_env() -> dict[str, str]:
    """A dead try noticed in seconds (heartbeats every second), never a redelivery (see the
    module's docstring)."""
    return {
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "1",
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "3600",
    }


@pytest.fixture(scope="module")
def deployment_dags(deployment_root: Path, paced_training: Path) -> dict[str, str]:
    """The DAG under test, its market a scripted trace in the deployment's folder, its
    training paced while the pace file is there."""
    trace = scripted_trace(deployment_root / "market.json", MARKET)
    (deployment_root / "pace").touch()
    source = DAG_SOURCE.format(
        paced=str(paced_training),
        root=str(deployment_root),
        trace=str(trace),
        steps=STEPS,
        step_s=STEP_S,
        deadline_s=180,
        dag_id=DAG_ID,
        task_id=TASK_ID,
    )
    return {"spot_deployment_celery_dag.py": source}


def test_the_celery_extra_is_pinned_by_the_lock() -> None:
    """``pip install airflow-provider-spot[celery]`` brings the provider, Celery and the Redis
    client, and the lock (what ``make`` installs) pins versions the extra accepts."""
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    extra = {r.name: r for r in map(Requirement, project["optional-dependencies"]["celery"])}
    assert {"apache-airflow-providers-celery", "celery", "redis"} <= set(extra)
    pins = dict(
        line.partition("==")[::2]
        for line in (repo / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    pins = {k.strip().lower().replace("_", "-"): v.strip() for k, v in pins.items()}
    for name, req in extra.items():
        assert name in pins, f"requirements.lock does not pin {name}"
        assert req.specifier.contains(pins[name]), (name, pins[name], str(req.specifier))
    assert "kombu" in pins  # Celery's transport, Redis's among them


# -- what the attempts left on disk ---------------------------------------------------------
def attempt_dirs(root: Path) -> list[Path]:
    """Every attempt folder the local backend made for the task, set-aside leftovers too."""
    return sorted(
        p for p in (root / "runs").glob(f"{DAG_ID}/*/{TASK_ID}/*/attempt-*") if p.is_dir()
    )


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def supervisors(run_dir: Path) -> list[tuple[int, float]]:
    """(pid, start time) of the supervisors of ``run_dir`` now running."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        cmd = p.info["cmdline"] or []
        if SUPERVISOR in cmd and cmd[-1] == str(run_dir) and "--detach" not in cmd:
            found.append((p.pid, p.info["create_time"]))
    return found


def trained_at_once(statuses: list[dict[str, Any]], handed: set[tuple[int, int]]) -> list[tuple]:
    """The pairs of attempts whose training (``started_at`` to ``ended_at``, or still going)
    overlapped, a make-before-break handover (``(from, to)`` in ``handed``) excepted."""
    spans = sorted(
        (s["started_at"], s.get("ended_at") or float("inf"), s["attempt"])
        for s in statuses
        if s.get("started_at") is not None
    )
    return [
        (a, b)
        for i, (_, end_a, a) in enumerate(spans)
        for start_b, _, b in spans[i + 1 :]
        if start_b < end_a and (a, b) not in handed
    ]


@pytest.mark.parametrize(
    ("statuses", "handed", "expected"),
    [
        ([{"attempt": 1, "started_at": 0.0, "ended_at": 5.0}], set(), []),
        (
            [
                {"attempt": 1, "started_at": 0.0, "ended_at": 5.0},
                {"attempt": 2, "started_at": 5.5, "ended_at": 9.0},
            ],
            set(),
            [],
        ),
        (  # a duplicate: the second started while the first trained on
            [
                {"attempt": 1, "started_at": 0.0, "ended_at": 50.0},
                {"attempt": 2, "started_at": 20.0, "ended_at": 40.0},
            ],
            set(),
            [(1, 2)],
        ),
        (  # still running (no end) when another started
            [
                {"attempt": 1, "started_at": 0.0, "ended_at": None},
                {"attempt": 2, "started_at": 20.0, "ended_at": None},
            ],
            set(),
            [(1, 2)],
        ),
        (  # a make-before-break return: the on-demand attempt hands over to spot
            [
                {"attempt": 1, "started_at": 0.0, "ended_at": 30.0},
                {"attempt": 2, "started_at": 29.0, "ended_at": 60.0},
            ],
            {(1, 2)},
            [],
        ),
    ],
)
def test_trained_at_once_finds_overlapping_attempts(
    statuses: list[dict[str, Any]], handed: set[tuple[int, int]], expected: list[tuple]
) -> None:
    """The overlap check flags two attempts training at once, but not a handover."""
    assert trained_at_once(statuses, handed) == expected


# -- the run --------------------------------------------------------------------------------
@dataclass
class Observed:
    """What the test saw of the run: before the kill, at it, and up to the run's end."""

    run_id: str
    killed: str = ""  # the worker killed (its component name)
    killed_pids: list[int] = field(default_factory=list)
    killed_at: float = 0.0
    try1: dict[str, Any] = field(default_factory=dict)  # the task instance at the kill
    live_dir: Path | None = None  # the attempt training at the kill
    live_supervisor: list[tuple[int, float]] = field(default_factory=list)
    step_at_kill: int = 0
    try2_running_at: float | None = None
    try2_session: int | None = None  # the session of try 2's task runner
    supervisor_at_try2: list[tuple[int, float]] = field(default_factory=list)
    step_at_try2: int | None = None
    tis: list[dict[str, Any]] = field(default_factory=list)  # every distinct look at the TI
    state: str = ""

    def saw(self, ti: dict[str, Any]) -> None:
        look = {k: ti.get(k) for k in ("try_number", "state", "hostname")}
        if not self.tis or self.tis[-1] != look:
            self.tis.append(look)


def _ti(dep: Any, obs: Observed) -> dict[str, Any]:
    ti = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}/taskInstances/{TASK_ID}")
    obs.saw(ti)
    return ti


def _step(run_dir: Path) -> int:
    return int(read_json(run_dir / "progress.json").get("step") or 0)


def _training_on_a_worker(dep: Any, obs: Observed) -> dict[str, Any] | None:
    """Try 1 running on a worker while its attempt has trained KILL_AT_STEP steps."""
    dep.ledger.snapshot(dep.pids())
    ti = _ti(dep, obs)
    dirs = attempt_dirs(dep.root)
    if ti["state"] != "running" or ti["try_number"] != 1 or len(dirs) != 1:
        return None
    if read_json(dirs[0] / "status.json").get("state") != "running":
        return None
    return ti if _step(dirs[0]) >= KILL_AT_STEP else None


def _session_of(pid: int | None) -> int | None:
    try:
        return os.getsid(pid) if pid else None
    except ProcessLookupError:
        return None


@pytest.fixture(scope="module")
def killed_run(airflow_deployment: Any) -> Observed:
    """The DAG triggered through the REST API; once try 1 trains, the session of the worker
    running it is SIGKILLed; then the run is watched to its end."""
    dep = airflow_deployment
    dep.wait_for_dag(DAG_ID)
    obs = Observed(dep.trigger(DAG_ID))
    end = time.monotonic() + START_TIMEOUT_S
    while (ti := _training_on_a_worker(dep, obs)) is None:
        assert time.monotonic() < end, (
            f"try 1 not training within {START_TIMEOUT_S:.0f} s: {obs.tis}"
        )
        time.sleep(0.3)
    worker = next(w for w in dep.workers if w.name.replace("_", "-") == ti["hostname"])
    assert _session_of(ti["pid"]) == worker.proc.pid, (ti, worker.name)
    obs.try1, obs.killed, obs.live_dir = ti, worker.name, attempt_dirs(dep.root)[0]
    obs.live_supervisor = supervisors(obs.live_dir)
    dep.ledger.snapshot(dep.pids())
    obs.killed_pids = worker.kill_session()
    obs.killed_at = time.time()
    obs.step_at_kill = _step(obs.live_dir)

    end = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < end:
        dep.ledger.snapshot(dep.pids())
        ti = _ti(dep, obs)
        if obs.try2_running_at is None and ti["try_number"] == 2 and ti["state"] == "running":
            obs.try2_running_at = time.time()
            obs.try2_session = _session_of(ti["pid"])
            obs.supervisor_at_try2 = supervisors(obs.live_dir)
            obs.step_at_try2 = _step(obs.live_dir)
            # the attempt outlived try 1 into try 2: the rest of its 50 s is only waited out
            (dep.root / "pace").unlink()
        run = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}")
        if run["state"] in ("success", "failed"):
            obs.state = run["state"]
            break
        time.sleep(0.5)
    _ti(dep, obs)
    assert obs.state, f"the run did not end within {RUN_TIMEOUT_S:.0f} s: {obs.tis}"
    return obs


def _xcom(dep: Any, obs: Observed) -> dict[str, Any]:
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}/taskInstances/{TASK_ID}"
    return dep.get(f"{path}/xcomEntries/return_value")["value"]


def _tries(dep: Any, obs: Observed) -> dict[int, dict[str, Any]]:
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}/taskInstances/{TASK_ID}/tries"
    return {t["try_number"]: t for t in dep.get(path)["task_instances"]}


def _task_log(dep: Any, try_number: int) -> str:
    pattern = f"dag_id={DAG_ID}/run_id=*/task_id={TASK_ID}/attempt={try_number}.log"
    return "".join(p.read_text(errors="replace") for p in (dep.root / "logs").glob(pattern))


def _other(dep: Any, obs: Observed) -> Any:
    return next(w for w in dep.workers if w.name != obs.killed)


def test_the_run_succeeds_and_meets_its_deadline(
    airflow_deployment: Any, killed_run: Observed
) -> None:
    """Despite the killed worker, the DAG run succeeds and the XCom summary reports the
    deadline met, with no failure spent."""
    why = f"{killed_run.tis}\n{airflow_deployment.task_errors()}"
    assert killed_run.state == "success", why
    summary = _xcom(airflow_deployment, killed_run)
    assert summary["deadline_met"] is True, summary
    assert summary["failures"] == 0, summary


def test_the_kill_took_the_whole_worker_and_spared_the_attempt(
    airflow_deployment: Any, killed_run: Observed
) -> None:
    """The SIGKILL ended the worker's main process, its pool child and try 1's task runner
    (a process group of its own), not the attempt's detached supervisor."""
    worker = next(w for w in airflow_deployment.workers if w.name == killed_run.killed)
    assert worker.ended(), worker.name
    assert worker.proc.pid in killed_run.killed_pids
    assert killed_run.try1["pid"] in killed_run.killed_pids, killed_run.try1
    assert len(killed_run.killed_pids) >= 3, killed_run.killed_pids  # main, pool child, task
    assert len(killed_run.live_supervisor) == 1, killed_run.live_supervisor
    assert killed_run.live_supervisor[0][0] not in killed_run.killed_pids


def test_the_kill_is_noticed_by_the_heartbeat_timeout(
    airflow_deployment: Any, killed_run: Observed
) -> None:
    """The scheduler fails try 1 for its missing heartbeats and the next try runs: one try
    spent on the kill, never a redelivery of try 1 (it never ran on the other worker)."""
    scheduler = next(c for c in airflow_deployment.components if c.name == "scheduler")
    log = scheduler.log.read_text()
    assert "Detected a task instance without a heartbeat" in log
    assert "Marking task as UP_FOR_RETRY" in log
    tries = _tries(airflow_deployment, killed_run)
    assert sorted(tries) == [1, 2], tries
    assert tries[1]["state"] in ("failed", "up_for_retry"), tries[1]
    hosts = [t["hostname"] for t in killed_run.tis if t["try_number"] == 1 and t["hostname"]]
    assert set(hosts) == {killed_run.killed.replace("_", "-")}, killed_run.tis


def test_the_next_try_runs_on_the_other_worker(
    airflow_deployment: Any, killed_run: Observed
) -> None:
    """Try 1's record names the killed worker, try 2's the other one, where its task runner
    was seen running, and it succeeded."""
    tries = _tries(airflow_deployment, killed_run)
    other = _other(airflow_deployment, killed_run)
    assert tries[1]["hostname"] == killed_run.killed.replace("_", "-"), tries[1]
    assert tries[2]["hostname"] == other.name.replace("_", "-"), tries[2]
    assert tries[2]["state"] == "success", tries[2]
    assert killed_run.try2_session == other.proc.pid, (killed_run.try2_session, other.name)
    assert (
        killed_run.try2_running_at is not None and killed_run.try2_running_at > killed_run.killed_at
    )


def test_the_live_attempt_is_reattached_and_not_duplicated(
    airflow_deployment: Any, killed_run: Observed
) -> None:
    """The attempt training at the kill trained on unwatched, try 2 re-attached to it (its
    supervisor the same process) and it finished the job: one attempt on disk and in the
    summary, launched before the kill, with no other attempt training beside it."""
    dep, obs = airflow_deployment, killed_run
    assert "Resuming job state from try 2: 1 attempts so far." in _task_log(dep, 2)
    assert obs.supervisor_at_try2 == obs.live_supervisor, (
        obs.supervisor_at_try2,
        obs.live_supervisor,
    )
    steps = (obs.step_at_kill, obs.step_at_try2)
    assert obs.step_at_try2 is not None and obs.step_at_kill < obs.step_at_try2 < STEPS, steps
    dirs = attempt_dirs(dep.root)
    assert dirs == [obs.live_dir], dirs  # no second attempt, no set-aside leftover
    status = read_json(obs.live_dir / "status.json")
    assert status["outcome"] == "succeeded", status
    assert status["launched_at"] < obs.killed_at < status["ended_at"], status
    summary = _xcom(dep, obs)
    attempts = summary["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "succeeded")], attempts
    assert attempts[0]["step_start"] == 0 and attempts[0]["step_end"] == STEPS, attempts
    statuses = [read_json(d / "status.json") for d in dirs]
    handed = {(a["attempt"], a["handed_to"]) for a in attempts if a.get("handed_to")}
    assert trained_at_once(statuses, handed) == []


def test_the_deployment_listens_on_127_0_0_1_only(
    airflow_deployment: Any, postgres_server: Any, redis_server: Any, killed_run: Observed
) -> None:
    """Every port a process of the deployment listened on (the api-server's, PostgreSQL's and
    Redis's among them; no worker's log server) was bound to 127.0.0.1."""
    listening = (
        airflow_deployment.ledger.listening
        | postgres_server.ledger.listening
        | redis_server.ledger.listening
    )
    ports = {(ip, port) for ip, port, _ in listening}
    expected = {airflow_deployment.port, postgres_server.port, redis_server.port}
    assert {("127.0.0.1", p) for p in expected} <= ports, listening
    assert {ip for ip, _, _ in listening} == {"127.0.0.1"}, listening


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_stopping_leaves_nothing_running(
    airflow_deployment: Any, postgres_server: Any, redis_server: Any, killed_run: Observed
) -> None:
    """Once the components, the workers, Redis and PostgreSQL are stopped, no process of the
    deployment (component, worker, task runner, supervisor, training, Redis, PostgreSQL) is
    left, and nothing listens on the ports they used."""
    ports = {p for _, p, _ in airflow_deployment.ledger.listening | redis_server.ledger.listening}
    ports |= {p for _, p, _ in postgres_server.ledger.listening}
    airflow_deployment.stop()
    redis_server.stop()
    postgres_server.stop()
    assert airflow_deployment.ledger.alive() == []
    for c in airflow_deployment.components:
        assert c.stopped(), c.name
        assert c.ended(), c.name  # its whole session: a worker's task runners too
    assert supervisors(killed_run.live_dir) == []
    assert not redis_server.running()
    assert redis_server.ledger.seen and redis_server.ledger.alive() == []
    assert not postgres_server.running()
    assert postgres_server.ledger.alive() == []
    assert [p for p in ports if _port_open(p)] == []
