"""An api-server restart and a Redis restart on a real CeleryExecutor deployment, while two
spot training jobs wait in the triggerer (issue 34, findings 1 and 2).

Two DAGs, the same job (``retries=0``, spot up throughout, a look every 10 s), each on a Celery
queue of its own, each queue served by one worker:

    plain  worker-1, Airflow's default [workers] settings (5 tries of each execution API call,
           giving up after 4 to 15 s)
    tuned  worker-2, airflow_spot.production.EXECUTION_API_SETTINGS (31 tries, 10 to 20 s
           apart: at least 300 s)

and the scheduler with airflow_spot.production.BROKER_SETTINGS (the Celery app of
``CELERY_CONFIG``: a publish to a broker that is down is timed out and sent again, for at
least 302 s). What happens, and what the tests check:

    both tries deferred -> api-server SIGTERMed -> each trigger fires (a look is due) -> the
      scheduler queues both -> each worker calls PATCH task-instances/{id}/run: refused
      plain: gives up (httpx ConnectError) -> the executor reports the try failed while it
        is queued -> the scheduler fails the task instance (retries=0): finding 1 reproduced
        -> the plugin's listener (in the scheduler) stops its attempt and records it in the
        job's state: finding 2 (the live attempt stopped within max(decision interval, 60 s),
        its end and outcome in the task state store and the UI, no process of it left)
      tuned: keeps calling -> api-server back (after >= 40 s, once plain has failed) -> the
        try resumes: try 1 still
    tuned deferred again -> Redis stopped -> its trigger fires -> the scheduler's publish
      times out and is sent again, loop after loop -> Redis back (after >= 30 s) -> the try
      resumes on worker-2, try 1 still -> the job finishes (its training unpaced once Redis
      is back: the rest of its 140 s is not waited out): the run succeeds, no try lost

The api-server's outage ends once the plain try has failed and the tuned try has waited longer
than Airflow's defaults would have (15 s): it proves both sides, whatever the machine's speed.
Meanwhile the test reads the metadata database directly (its REST API is down).
tests/test_production.py shows a publish to a broker that is down failing in 0.7 s with
Airflow's defaults (the scheduler shares one configuration, so this deployment cannot).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_spot import production
from airflow_spot.testing import scripted_trace

PLAIN, TUNED = "plain", "tuned"  # the queues
DAG_IDS = {PLAIN: "spot_outage_plain", TUNED: "spot_outage_tuned"}
WORKERS = {PLAIN: "worker_1", TUNED: "worker_2"}
TASK_ID = "train"
STEPS = 280
STEP_S = 0.5  # 140 s of training: through both outages (they end by ~100 s), then unpaced
DECISION_S = 10  # a look every 10 s: a trigger fires in every outage
STOP_WITHIN_S = max(DECISION_S, 60)  # finding 2: an attempt left unwatched stops this soon
DEFAULT_GIVE_UP_S = 15.0  # Airflow's default client gives up a call after at most this long
API_OUTAGE_MIN_S = 40.0
REDIS_OUTAGE_MIN_S = 30.0
OUTAGE_MAX_S = 120.0  # well under what the shipped settings survive (300 s)
START_TIMEOUT_S = 150.0
RUN_TIMEOUT_S = 240.0
MARKET = [(True, 5000)]  # spot up throughout: one attempt per job

DAG_SOURCE = '''
"""Written by tests/deployment/test_deployment_outages.py."""
import sys
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

ROOT = {root!r}
STEPS = {steps}
STEP_S = {step_s}

for queue, dag_id in {dag_ids!r}.items():
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
             catchup=False):
        SpotTrainingOperator(
            task_id={task_id!r},
            queue=queue,
            retries=0,  # one try: a try lost to an outage fails the run
            # paced while ROOT/pace-<queue> exists: the tuned one's ends with the outages
            command=[sys.executable, {paced!r}, ROOT + "/pace-" + queue,
                     *train_command(STEPS, step_seconds=STEP_S, save_every=5, seed=7)[3:]],
            checkpoint_uri=ROOT + "/ckpt/" + queue,
            expected_compute=timedelta(seconds=STEPS * STEP_S),
            total_steps=STEPS,
            deadline=timedelta(seconds=900),
            changeover=timedelta(seconds=1),
            policy="uniform_progress",
            max_failures=0,
            backend=LocalBackend(
                trace={trace!r}, polarity="available", time_scale=360.0,
                work_dir=ROOT + "/runs", notice_s=0.2, grace_s=2.0,
            ),
            decision_interval=timedelta(seconds={decision_s}),
            poll_interval=0.5,
            min_deferral=timedelta(seconds=7.5),  # the 10 s waits defer to the triggerer
        )
'''


@pytest.fixture(scope="module")
def deployment_executor(redis_server: Any) -> str:
    """Celery, with the module's Redis as the broker (skipped without Redis)."""
    return "CeleryExecutor"


@pytest.fixture(scope="module")
def deployment_celery_env() -> dict[str, str]:
    """The shipped broker settings, read by the scheduler (the workers ignore them); an unacked
    message is never redelivered during the run (as in test_deployment_celery.py)."""
    return {
        **production.BROKER_SETTINGS,
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "3600",
    }


@pytest.fixture(scope="module")
def deployment_worker_env() -> dict[str, dict[str, str]]:
    """worker-1 serves ``plain`` with Airflow's [workers] defaults, worker-2 ``tuned`` with
    the shipped execution API settings."""
    return {
        WORKERS[PLAIN]: {"AIRFLOW__OPERATORS__DEFAULT_QUEUE": PLAIN},
        WORKERS[TUNED]: {
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": TUNED,
            **production.EXECUTION_API_SETTINGS,
        },
    }


@pytest.fixture(scope="module")
def deployment_dags(deployment_root: Path, paced_training: Path) -> dict[str, str]:
    """The two DAGs, their market a scripted trace in the deployment's folder, each training
    paced while its pace file exists."""
    trace = scripted_trace(deployment_root / "market.json", MARKET)
    for queue in DAG_IDS:
        _pace_file(deployment_root, queue).touch()
    source = DAG_SOURCE.format(
        paced=str(paced_training),
        root=str(deployment_root),
        trace=str(trace),
        steps=STEPS,
        step_s=STEP_S,
        dag_ids=DAG_IDS,
        task_id=TASK_ID,
        decision_s=DECISION_S,
    )
    return {"spot_outage_dags.py": source}


def _pace_file(root: Path, queue: str) -> Path:
    return root / f"pace-{queue}"


# -- what the test saw ----------------------------------------------------------------------
@dataclass
class Observed:
    """The run of each queue's DAG, the outages' times (``time.time()``) and what was seen."""

    run_ids: dict[str, str]
    t0: float = field(default_factory=time.time)
    events: list[tuple[float, str]] = field(default_factory=list)
    states: dict[str, list[tuple[float, str, int]]] = field(default_factory=dict)
    plain_attempt: Path | None = None
    plain_procs: list[tuple[int, float]] = field(default_factory=list)  # (pid, create time)
    api_down: tuple[float, float] = (0.0, 0.0)  # SIGTERM sent, started again
    api_up_at: float = 0.0  # answering again
    redis_down: tuple[float, float] = (0.0, 0.0)
    waiting_in_redis_outage_s: float = 0.0  # tuned try queued or scheduled, Redis down
    ends: dict[str, str] = field(default_factory=dict)  # queue -> the run's final state

    def note(self, what: str) -> None:
        self.events.append((time.time(), what))

    def saw(self, queue: str, state: str | None, try_number: int) -> None:
        seen = self.states.setdefault(queue, [])
        if state and (not seen or seen[-1][1:] != (state, try_number)):
            seen.append((time.time(), state, try_number))

    def since(self, queue: str, states: tuple[str, ...]) -> float:
        """How long the task instance has been in one of ``states`` (0: it is not)."""
        seen = self.states.get(queue) or []
        if not seen or seen[-1][1] not in states:
            return 0.0
        start = seen[-1][0]
        for t, state, _ in reversed(seen):
            if state not in states:
                break
            start = t
        return time.time() - start

    def timeline(self) -> str:
        lines = [f"{t - self.t0:7.1f} s  {what}" for t, what in sorted(self.events)]
        for queue, seen in self.states.items():
            lines.append(
                f"{queue}: " + ", ".join(f"{t - self.t0:.0f}s {s}/{n}" for t, s, n in seen)
            )
        return "\n".join(lines)


def _ti_path(queue: str, obs: Observed) -> str:
    return f"/api/v2/dags/{DAG_IDS[queue]}/dagRuns/{obs.run_ids[queue]}/taskInstances/{TASK_ID}"


def _rest_states(dep: Any, obs: Observed) -> dict[str, str | None]:
    out = {}
    for queue in DAG_IDS:
        ti = dep.get(_ti_path(queue, obs))
        obs.saw(queue, ti["state"], ti["try_number"])
        out[queue] = ti["state"]
    return out


def _db_states(pg: Any, obs: Observed) -> dict[str, str | None]:
    """The task instances' states from the metadata database (the REST API is down)."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user="airflow", dbname="airflow")
    try:
        cur = conn.cursor()
        cur.execute(
            "SELECT dag_id, state, try_number FROM task_instance WHERE dag_id = ANY(%s)",
            (list(DAG_IDS.values()),),
        )
        rows = {dag_id: (state, n) for dag_id, state, n in cur.fetchall()}
    finally:
        conn.close()
    out = {}
    for queue, dag_id in DAG_IDS.items():
        state, n = rows.get(dag_id, (None, 0))
        obs.saw(queue, state, n)
        out[queue] = state
    return out


def attempt_dirs(root: Path, queue: str) -> list[Path]:
    """Every attempt folder the local backend made for the queue's DAG."""
    runs = root / "runs" / DAG_IDS[queue]
    return sorted(p for p in runs.glob(f"*/{TASK_ID}/*/attempt-*") if p.is_dir())


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def attempt_processes(run_dir: Path) -> list[tuple[int, float]]:
    """(pid, create time) of the attempt's supervisor and everything under it (the training)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if (p.info["cmdline"] or [""])[-1] == str(run_dir):
                found += [p, *p.children(recursive=True)]
    out = []
    for p in found:
        with contextlib.suppress(psutil.Error):
            out.append((p.pid, p.create_time()))
    return out


def still_running(procs: list[tuple[int, float]]) -> list[int]:
    import psutil

    alive = []
    for pid, created in procs:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


# -- the run --------------------------------------------------------------------------------
def wait_for(what: str, check: Any, timeout: float, every: float = 0.5) -> Any:
    """``check()``'s first truthy value (conftest's own, which a test module cannot import:
    every folder's conftest is a module named ``conftest``)."""
    end = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return value


def _both_deferred(dep: Any, obs: Observed) -> bool:
    """Both tries wait in the triggerer, each with its attempt training (the plain one's
    processes recorded while they run)."""
    states = _rest_states(dep, obs)
    if set(states.values()) != {"deferred"}:
        return False
    for queue in DAG_IDS:
        dirs = attempt_dirs(dep.root, queue)
        if len(dirs) != 1 or read_json(dirs[0] / "status.json").get("state") != "running":
            return False
    obs.plain_attempt = attempt_dirs(dep.root, PLAIN)[0]
    obs.plain_procs = attempt_processes(obs.plain_attempt)
    return len(obs.plain_procs) >= 2  # the supervisor and its training process


def _ran_after(obs: Observed, when: float) -> bool:
    """Whether the tuned try has run since ``when``: it was seen deferred again, or done (a
    resumed try runs for a second or so, often between two looks)."""
    return any(
        t > when and s in ("running", "deferred", "success") for t, s, _ in obs.states[TUNED]
    )


def _component(dep: Any, name: str) -> Any:
    return next(c for c in dep.components if c.name == name)


def _api_outage(dep: Any, pg: Any, obs: Observed) -> None:
    """SIGTERM the api-server; start it again once the plain try has failed and the tuned
    one has waited longer than Airflow's defaults would (and API_OUTAGE_MIN_S has passed)."""
    api = _component(dep, "api_server")
    start = time.time()
    api.signal(signal.SIGTERM)
    obs.note("api-server: SIGTERM")
    wait_for("the api-server stopped", api.stopped, 30.0, every=0.2)
    obs.note("api-server: stopped")
    while time.time() - start < OUTAGE_MAX_S:
        states = _db_states(pg, obs)
        waited = obs.since(TUNED, ("queued", "scheduled"))
        if (
            time.time() - start >= API_OUTAGE_MIN_S
            and states[PLAIN] == "failed"
            and waited > DEFAULT_GIVE_UP_S
        ):
            break
        time.sleep(0.5)
    dep.client.close()  # its connections were to the server that stopped
    dep._client = None
    api.start(dep.env)
    obs.api_down = (start, time.time())
    obs.note("api-server: started again")

    def answers() -> bool:
        with contextlib.suppress(Exception):
            return dep.request("GET", "/api/v2/monitor/health").status_code == 200
        return False

    wait_for("the api-server answers again", answers, 90.0, every=0.5)
    obs.api_up_at = time.time()
    obs.note("api-server: answering")


def _redis_outage(dep: Any, redis: Any, obs: Observed) -> None:
    """Once the tuned try waits in the triggerer again, stop Redis; start it again once its
    trigger has fired and its try has waited to be sent for 10 s (and REDIS_OUTAGE_MIN_S)."""

    def resumed_and_deferred() -> bool:  # deferred again: it ran since (seconds, unseen)
        state = _rest_states(dep, obs)[TUNED]
        assert state != "success", (
            f"the tuned job ended before Redis stopped: raise STEPS\n{obs.timeline()}"
        )
        return state == "deferred" and _ran_after(obs, obs.api_up_at)

    wait_for("the tuned try resumed and deferred again", resumed_and_deferred, 120.0)
    start = time.time()
    redis.stop()
    obs.note("redis: stopped")
    while time.time() - start < OUTAGE_MAX_S:
        _rest_states(dep, obs)
        waited = obs.since(TUNED, ("queued", "scheduled"))
        obs.waiting_in_redis_outage_s = max(obs.waiting_in_redis_outage_s, waited)
        if time.time() - start >= REDIS_OUTAGE_MIN_S and waited >= 10.0:
            break
        time.sleep(0.5)
    redis.start()
    obs.redis_down = (start, time.time())
    obs.note("redis: started again")


@pytest.fixture(scope="module")
def outages(airflow_deployment: Any, postgres_server: Any, redis_server: Any) -> Observed:
    """Both DAGs triggered; the api-server outage while both are deferred, then the Redis
    outage while the tuned one is; then both runs watched to their end."""
    dep = airflow_deployment
    for dag_id in DAG_IDS.values():
        dep.wait_for_dag(dag_id)
    obs = Observed({queue: dep.trigger(dag_id) for queue, dag_id in DAG_IDS.items()})
    obs.note("both runs triggered")
    try:
        wait_for("both tries deferred", lambda: _both_deferred(dep, obs), START_TIMEOUT_S)
        obs.note("both deferred, attempts training")
        _api_outage(dep, postgres_server, obs)
        _redis_outage(dep, redis_server, obs)
        # both outages are over: the tuned training need not run out its pace (~50 s); the
        # plain attempt stays paced (it must be stopped by the listener, short of its end)
        _pace_file(dep.root, TUNED).unlink()
        obs.note("tuned training: unpaced")
        end = time.monotonic() + RUN_TIMEOUT_S
        while len(obs.ends) < len(DAG_IDS) and time.monotonic() < end:
            _rest_states(dep, obs)
            for queue, dag_id in DAG_IDS.items():
                run = dep.get(f"/api/v2/dags/{dag_id}/dagRuns/{obs.run_ids[queue]}")
                if run["state"] in ("success", "failed") and queue not in obs.ends:
                    obs.ends[queue] = run["state"]
                    obs.note(f"{queue} run: {run['state']}")
            time.sleep(1.0)
    finally:
        print(f"\n{obs.timeline()}")  # shown with -s, and in the report of a failure
    assert len(obs.ends) == len(DAG_IDS), f"runs not ended:\n{obs.timeline()}"
    return obs


# -- helpers for the checks -----------------------------------------------------------------
def _tries(dep: Any, queue: str, obs: Observed) -> dict[int, dict[str, Any]]:
    return {t["try_number"]: t for t in dep.get(f"{_ti_path(queue, obs)}/tries")["task_instances"]}


def _log(dep: Any, name: str) -> str:
    return _component(dep, name).log.read_text(errors="replace")


RETRY = "Starting call to 'airflow.sdk.api.client.Client.request', this is the "


def retry_spans(log: str) -> list[float]:
    """How long each run of the Task SDK client's retries lasted, from a worker's log: the
    seconds from its first retry warning ("... this is the 1st time calling it", logged before
    the first wait) to the last one of the run."""
    spans: list[list[float]] = []
    for line in log.splitlines():
        if RETRY in line:
            at = _when(line.split()[0])
            if "the 1st time" in line or not spans:
                spans.append([at, at])
            spans[-1][1] = at
    return [end - start for start, end in spans]


def _when(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _job_state(dep: Any, queue: str, obs: Observed) -> dict[str, Any]:
    """The job's state as the operator and the listener stored it (the task state store)."""
    return dep.get(f"{_ti_path(queue, obs)}/state-store/airflow_spot_job")["value"]


# -- finding 1, reproduced on the plain queue -----------------------------------------------
def test_the_plain_try_is_lost_to_the_api_server_outage(
    airflow_deployment: Any, outages: Observed
) -> None:
    """With Airflow's default [workers] settings the try resumed by the trigger never started:
    worker-1 gave up (ConnectError), the scheduler failed the try it reported failed while
    queued, during the outage, and the run failed (finding 1 reproduced)."""
    dep, obs = airflow_deployment, outages
    assert obs.ends[PLAIN] == "failed", obs.timeline()
    tries = _tries(dep, PLAIN, obs)
    assert sorted(tries) == [1], tries
    assert tries[1]["state"] == "failed" and tries[1]["hostname"] == "worker-1", tries[1]
    assert obs.api_down[0] < _when(tries[1]["end_date"]) < obs.api_down[1], obs.timeline()
    assert "raised unexpected: ConnectError" in _log(dep, WORKERS[PLAIN])
    assert max(retry_spans(_log(dep, WORKERS[PLAIN]))) <= DEFAULT_GIVE_UP_S
    lost = [
        line
        for line in _log(dep, "scheduler").splitlines()
        if DAG_IDS[PLAIN] in line and "state attribute is queued" in line
    ]
    assert lost and "finished with state failed" in lost[0], lost


# -- finding 1, fixed by the shipped settings -----------------------------------------------
def test_the_tuned_run_succeeds_on_its_first_try(
    airflow_deployment: Any, outages: Observed
) -> None:
    """With the shipped settings the same outages cost no try: the run succeeds with try 1,
    every execution of it on worker-2, one attempt, the deadline met, no failure spent."""
    dep, obs = airflow_deployment, outages
    assert obs.ends[TUNED] == "success", f"{obs.timeline()}\n{dep.task_errors()}"
    tries = _tries(dep, TUNED, obs)
    assert sorted(tries) == [1], tries
    assert tries[1]["state"] == "success" and tries[1]["hostname"] == "worker-2", tries[1]
    assert {n for _, _, n in obs.states[TUNED]} == {1}, obs.timeline()
    summary = dep.get(f"{_ti_path(TUNED, obs)}/xcomEntries/return_value")["value"]
    assert summary["deadline_met"] is True and summary["failures"] == 0, summary
    assert [(a["attempt"], a["outcome"]) for a in summary["attempts"]] == [(1, "succeeded")]


def test_the_tuned_worker_waited_out_the_api_server(
    airflow_deployment: Any, outages: Observed
) -> None:
    """The tuned try's trigger fired while the api-server was down, and worker-2 kept calling
    for longer than Airflow's defaults allow (15 s), until the api-server was back."""
    dep, obs = airflow_deployment, outages
    down, up = obs.api_down
    waiting = [t for t, s, _ in obs.states[TUNED] if down < t < up and s in ("queued", "scheduled")]
    assert waiting, obs.timeline()
    assert up - waiting[0] > DEFAULT_GIVE_UP_S, obs.timeline()
    spans = retry_spans(_log(dep, WORKERS[TUNED]))
    assert spans and max(spans) > DEFAULT_GIVE_UP_S, spans
    assert "ConnectError" not in _log(dep, WORKERS[TUNED])  # it never gave up
    assert _ran_after(obs, up), obs.timeline()


def test_the_tuned_publish_waited_out_the_redis_restart(
    airflow_deployment: Any, outages: Observed
) -> None:
    """While Redis was down the tuned trigger fired, the scheduler's publish timed out and was
    sent again loop after loop (never failed), and the try ran once Redis was back."""
    dep, obs = airflow_deployment, outages
    assert obs.waiting_in_redis_outage_s >= 10.0, obs.timeline()
    tuned = [line for line in _log(dep, "scheduler").splitlines() if DAG_IDS[TUNED] in line]
    timeouts = [line for line in tuned if "Celery Task Timeout Error for Workload" in line]
    assert len(timeouts) >= 2, tuned[-20:]  # sent again, and again
    assert not [line for line in tuned if "state attribute is" in line]
    down, up = obs.redis_down
    assert up - down >= REDIS_OUTAGE_MIN_S and _ran_after(obs, up), obs.timeline()


# -- finding 2: the plain job's attempt, left unwatched by the failed try -------------------
def test_the_plain_attempt_is_stopped_within_a_minute_of_the_failure(
    airflow_deployment: Any, outages: Observed
) -> None:
    """The task failed without operator code; its attempt (which would have trained ~2 more
    minutes) was stopped within max(decision interval, 60 s), short of the job's end, and
    neither its supervisor nor its training process is left."""
    dep, obs = airflow_deployment, outages
    failed_at = _when(_tries(dep, PLAIN, obs)[1]["end_date"])
    assert obs.plain_attempt is not None
    status = read_json(obs.plain_attempt / "status.json")
    assert status.get("outcome") == "cancelled", status
    assert failed_at <= status["ended_at"] <= failed_at + STOP_WITHIN_S, (failed_at, status)
    progress = read_json(obs.plain_attempt / "progress.json")
    assert int(progress.get("step") or 0) < STEPS, progress
    assert still_running(obs.plain_procs) == [], obs.plain_procs


def test_the_plain_job_state_records_what_ran(airflow_deployment: Any, outages: Observed) -> None:
    """The job's state (the task state store) says it failed without its operator and closes
    its attempt with an end and an outcome; the UI's row says failed, not 'may still run'."""
    dep, obs = airflow_deployment, outages
    state = _job_state(dep, PLAIN, obs)
    assert (state.get("failed") or {}).get("error") == "TaskEndedWithoutOperator", state.get(
        "failed"
    )
    attempts = state["attempts"]
    assert len(attempts) == 1, attempts
    failed_at = _when(_tries(dep, PLAIN, obs)[1]["end_date"])
    assert attempts[0]["outcome"] == "cancelled", attempts[0]
    assert failed_at <= attempts[0]["ended_at"] <= failed_at + STOP_WITHIN_S, attempts[0]
    assert 0 < attempts[0]["step_end"] < STEPS, attempts[0]
    rows = dep.get("/spot-training/api/runs", dag_id=DAG_IDS[PLAIN])
    row = next(r for r in rows if r["run_id"] == obs.run_ids[PLAIN])
    assert row["now"] == "failed" and row["failed"]["error"] == "TaskEndedWithoutOperator", row


def test_nothing_is_left_running(
    airflow_deployment: Any, postgres_server: Any, redis_server: Any, outages: Observed
) -> None:
    """Once everything is stopped, no process of the deployment is left."""
    airflow_deployment.stop()
    redis_server.stop()
    postgres_server.stop()
    assert airflow_deployment.ledger.alive() == []
    for queue in DAG_IDS:
        for run_dir in attempt_dirs(airflow_deployment.root, queue):
            assert attempt_processes(run_dir) == [], run_dir
