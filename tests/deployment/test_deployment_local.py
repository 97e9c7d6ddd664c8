"""A spot training DAG on a real deployment: PostgreSQL, the scheduler (LocalExecutor), the
dag-processor, the triggerer and the api-server, each its own process, on 127.0.0.1.

The job defers to the triggerer between looks (every wait is longer than ``min_deferral``),
is preempted, falls back to on-demand through a long outage, returns to spot when it ends,
and meets its deadline; one task is not mapped, one is mapped over two instances.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.testing import scripted_trace

DAG_ID = "spot_deployment_local"
SINGLE = "train"
MAPPED = "train_sweep"
INSTANCES = [(SINGLE, -1), (MAPPED, 0), (MAPPED, 1)]  # (task_id, map_index)
RUN_TIMEOUT_S = 150.0

# market ticks of 600 s replayed at 360x (one tick = 1.67 wall s): spot up 8 s, then down
# 27 s (a preemption, and an outage Uniform Progress does not wait out), then up for good
MARKET = [(True, 5), (False, 16), (True, 400)]
# 10 h of market time for 4 h of work. The return to spot needs a look (one every ~1.45 h:
# 12 s decision interval, plus the deferral's round trip) after on-demand is two changeovers
# ahead of the uniform line (~3.7 h) and before the safety net's look-sized margin takes over
# (~5.8 h). With 9 h that window was ~1.5 h wide, and one CI run in three missed it
DEADLINE_S = 100

DAG_SOURCE = '''
"""Written by tests/deployment/test_deployment_local.py."""
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

ROOT = {root!r}
STEPS = {steps}
STEP_S = {step_s}
COMMON = dict(
    expected_compute=timedelta(seconds=STEPS * STEP_S),
    total_steps=STEPS,
    deadline=timedelta(seconds={deadline_s}),
    changeover=timedelta(seconds=1),
    policy="uniform_progress",
    max_failures=0,
    backend=LocalBackend(
        trace={trace!r}, polarity="available", time_scale={scale}, work_dir=ROOT + "/runs",
        notice_s=0.2, grace_s=2.0,
    ),
    decision_interval=timedelta(seconds={decision_s}),
    poll_interval=0.5,
    min_deferral=timedelta(seconds={min_deferral_s}),
)

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False) as dag:
    SpotTrainingOperator(
        task_id={single!r},
        command=train_command(STEPS, step_seconds=STEP_S, save_every=5, seed=7),
        checkpoint_uri=ROOT + "/ckpt/single",
        **COMMON,
    )
    SpotTrainingOperator.partial(
        task_id={mapped!r}, checkpoint_uri=ROOT + "/ckpt/sweep-{{{{ ti.map_index }}}}", **COMMON
    ).expand(
        command=[train_command(STEPS, step_seconds=STEP_S, save_every=5, seed=s) for s in (1, 2)]
    )
'''


@pytest.fixture(scope="module")
def deployment_dags(deployment_root: Path) -> dict[str, str]:
    """The DAG under test, its market a scripted trace in the deployment's folder."""
    trace = scripted_trace(deployment_root / "market.json", MARKET)
    source = DAG_SOURCE.format(
        root=str(deployment_root),
        trace=str(trace),
        steps=400,
        step_s=0.1,
        deadline_s=DEADLINE_S,
        scale=360.0,
        decision_s=12,
        min_deferral_s=10.5,
        dag_id=DAG_ID,
        single=SINGLE,
        mapped=MAPPED,
    )
    return {"spot_deployment_local_dag.py": source}


@dataclass
class Observed:
    """What the test saw of one DAG run while it ran, and at its end."""

    run_id: str
    state: str = ""
    ti_states: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    tries: dict[tuple[str, int], int] = field(default_factory=dict)
    live_rows: list[dict[str, Any]] = field(default_factory=list)
    live_page: str = ""
    live_timeline: str = ""

    def saw(self, task_id: str, map_index: int, state: str | None) -> None:
        seen = self.ti_states.setdefault((task_id, map_index), [])
        if state and (not seen or seen[-1] != state):
            seen.append(state)


def _poll_states(dep: Any, obs: Observed) -> None:
    tis = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}/taskInstances")
    for ti in tis["task_instances"]:
        obs.saw(ti["task_id"], ti["map_index"], ti["state"])
        obs.tries[(ti["task_id"], ti["map_index"])] = ti["try_number"]


def _look_at_the_ui_live(dep: Any, obs: Observed) -> None:
    """Once every instance has a row and the one not mapped waits in the triggerer, fetch the
    runs page, its rows (what the page's script shows) and that instance's timeline."""
    rows = dep.get("/spot-training/api/runs", dag_id=DAG_ID)
    mine = {(r["task_id"], r["map_index"]): r for r in rows if r["run_id"] == obs.run_id}
    single = mine.get((SINGLE, -1)) or {}
    if set(mine) != set(INSTANCES) or single.get("state") != "deferred":
        return
    page = dep.request("GET", "/spot-training/page", params={"dag_id": DAG_ID})
    timeline = dep.request("GET", "/spot-training/timeline", params=_ti_params(obs, SINGLE))
    if page.status_code == 200 and timeline.status_code == 200:
        obs.live_rows, obs.live_page, obs.live_timeline = rows, page.text, timeline.text


def _ti_params(obs: Observed, task_id: str, map_index: str = "{MAP_INDEX}") -> dict[str, str]:
    return {"dag_id": DAG_ID, "run_id": obs.run_id, "task_id": task_id, "map_index": map_index}


@pytest.fixture(scope="module")
def finished_run(airflow_deployment: Any) -> Observed:
    """The DAG triggered through the REST API and watched to its end."""
    dep = airflow_deployment
    dep.wait_for_dag(DAG_ID)
    obs = Observed(dep.trigger(DAG_ID))
    start = time.monotonic()
    while time.monotonic() - start < RUN_TIMEOUT_S:
        dep.ledger.snapshot(dep.pids())
        _poll_states(dep, obs)
        if not obs.live_rows:
            _look_at_the_ui_live(dep, obs)
        run = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}")
        if run["state"] in ("success", "failed"):
            obs.state = run["state"]
            break
        time.sleep(0.5)
    _poll_states(dep, obs)
    assert obs.state, f"the run did not end within {RUN_TIMEOUT_S:.0f} s: {obs.ti_states}"
    return obs


def _xcom(dep: Any, obs: Observed, task_id: str, map_index: int = -1) -> dict[str, Any]:
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{obs.run_id}/taskInstances/{task_id}"
    params = {"map_index": map_index} if map_index >= 0 else {}
    return dep.get(f"{path}/xcomEntries/return_value", **params)["value"]


def test_the_run_succeeds(airflow_deployment: Any, finished_run: Observed) -> None:
    """The DAG run, triggered through the REST API, ends in success with every instance, each
    in its first try."""
    why = f"{finished_run.ti_states}\n{airflow_deployment.task_errors()}"
    assert finished_run.state == "success", why
    assert set(finished_run.ti_states) == set(INSTANCES)
    assert all(s[-1] == "success" for s in finished_run.ti_states.values()), why
    assert set(finished_run.tries.values()) == {1}, finished_run.tries


def _trigger_log(dep: Any, task_id: str, map_index: int) -> str:
    """What the triggerer logged for one task instance's triggers."""
    mapped = f"/map_index={map_index}" if map_index >= 0 else ""
    pattern = f"dag_id={DAG_ID}/run_id=*/task_id={task_id}{mapped}/attempt=1.log.trigger.*.log"
    return "".join(p.read_text() for p in (dep.root / "logs").glob(pattern))


@pytest.mark.parametrize(("task_id", "map_index"), INSTANCES)
def test_every_instance_defers_to_the_triggerer(
    airflow_deployment: Any, finished_run: Observed, task_id: str, map_index: int
) -> None:
    """Each task instance is seen ``deferred`` while the run goes on, and the triggerer (not
    the worker) fired its trigger."""
    states = finished_run.ti_states[(task_id, map_index)]
    assert "deferred" in states, states
    assert "Trigger fired event" in _trigger_log(airflow_deployment, task_id, map_index)


@pytest.mark.parametrize(("task_id", "map_index"), INSTANCES)
def test_the_xcom_reports_the_deadline_met_through_preemptions(
    airflow_deployment: Any, finished_run: Observed, task_id: str, map_index: int
) -> None:
    """Each instance's XCom return_value: deadline met, at least one preemption, no failure."""
    summary = _xcom(airflow_deployment, finished_run, task_id, map_index)
    assert summary["deadline_met"] is True, summary
    assert summary["preemptions"] >= 1
    assert summary["failures"] == 0


@pytest.mark.parametrize(("task_id", "map_index"), INSTANCES)
def test_the_job_falls_back_to_on_demand_and_returns_to_spot(
    airflow_deployment: Any, finished_run: Observed, task_id: str, map_index: int
) -> None:
    """Each instance went from spot to on-demand through the outage, and back to spot."""
    summary = _xcom(airflow_deployment, finished_run, task_id, map_index)
    caps = [a["capacity"] for a in summary["attempts"]]
    assert summary["fallbacks_to_on_demand"] >= 1, caps
    assert summary["returns_to_spot"] >= 1, caps
    assert caps[0] == "spot" and "on_demand" in caps


def test_the_runs_page_shows_live_rows(finished_run: Observed) -> None:
    """Mid-run, the plugin's runs page answers, its rows hold every instance (the one not
    mapped deferred, its deadline still open), and the timeline refreshes itself."""
    assert finished_run.live_rows, "never saw the task's row while it ran"
    assert "<h2>Spot training</h2>" in finished_run.live_page
    rows = {
        (r["task_id"], r["map_index"]): r
        for r in finished_run.live_rows
        if r["run_id"] == finished_run.run_id
    }
    assert set(rows) == set(INSTANCES)
    single = rows[(SINGLE, -1)]
    assert single["state"] == "deferred" and single["deadline_met"] is None
    assert single["progress"] is not None
    assert '<meta http-equiv="refresh"' in finished_run.live_timeline


@pytest.mark.parametrize(
    ("task_id", "map_index", "heading"),
    [(SINGLE, "{MAP_INDEX}", f"/ {SINGLE}</h3>"), (MAPPED, "0", f"/ {MAPPED} [0]</h3>")],
)
def test_the_timeline_tab_answers(
    airflow_deployment: Any, finished_run: Observed, task_id: str, map_index: str, heading: str
) -> None:
    """The "Spot timeline" tab, as Airflow's UI asks for it (``{MAP_INDEX}`` left in for a
    task that is not mapped), draws the finished instance's timeline with its verdict."""
    r = airflow_deployment.request(
        "GET", "/spot-training/timeline", params=_ti_params(finished_run, task_id, map_index)
    )
    assert r.status_code == 200, r.text
    assert heading in r.text
    assert "<svg" in r.text and 'class="preemption"' in r.text
    assert "<b>met</b>" in r.text


def test_the_deployment_listens_on_127_0_0_1_only(
    airflow_deployment: Any, postgres_server: Any, finished_run: Observed
) -> None:
    """While the run went on, every port a process of the deployment listened on (the
    api-server's and PostgreSQL's among them) was bound to 127.0.0.1."""
    listening = airflow_deployment.ledger.listening | postgres_server.ledger.listening
    ports = {(ip, port) for ip, port, _ in listening}
    assert {("127.0.0.1", airflow_deployment.port), ("127.0.0.1", postgres_server.port)} <= ports
    assert {ip for ip, _, _ in listening} == {"127.0.0.1"}, listening


def test_stopping_leaves_nothing_running(
    airflow_deployment: Any, postgres_server: Any, finished_run: Observed
) -> None:
    """Once the components and PostgreSQL are stopped, no process of the deployment (no
    component, worker, task, supervisor or training process) is left."""
    airflow_deployment.stop()
    postgres_server.stop()
    assert airflow_deployment.ledger.alive() == []
    for c in airflow_deployment.components:
        assert c.stopped(), c.name  # the component and its whole process group
    supervisors = subprocess.run(
        ["pgrep", "-af", "local.supervisor"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    assert [s for s in supervisors if str(airflow_deployment.root) in s] == []
    assert not postgres_server.running()
    assert postgres_server.pid() is None
    assert postgres_server.ledger.seen, "never saw PostgreSQL's processes"
    assert postgres_server.ledger.alive() == []
