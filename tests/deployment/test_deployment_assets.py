"""Issue 37 on a real deployment (PostgreSQL, LocalExecutor scheduler, dag-processor,
triggerer and api-server, each its own process): the shipped example DAGs, as they are.

* ``spot_training_taskflow`` (``@task.spot_training``) trains, returns its result into the
  XCom and, on success, records one event of the model Asset, its extra naming the checkpoint;
* the scheduler runs ``spot_training_evaluate``, scheduled on that Asset, which loads the
  announced checkpoint (its manifest hash checked) and evaluates it;
* the training task cleared and run again reports the finished job again and records no second
  event for the same step, so the evaluation does not run twice;
* an Asset watcher (:mod:`airflow_spot.triggers.milestones`) on the run's checkpoint location
  emits milestone events from the triggerer while the job runs, never twice for one step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.demo import DAGS

TRAIN, EVALUATE, MILESTONES = "spot_training_taskflow", "spot_training_evaluate", "spot_milestones"
RUN_ID = "assets-1"  # chosen here: the watcher's location is the run's, known in advance
RUN_TIMEOUT_S = 120.0

MILESTONE_DAG = '''
"""Written by tests/deployment/test_deployment_assets.py: scheduled on the milestones of one
run's checkpoint location (a watcher's location is a literal)."""
from datetime import datetime, timezone

from airflow.sdk import DAG, task

from airflow_spot.triggers.milestones import milestone_asset

CHECKPOINTS = milestone_asset(
    "spot_logreg_checkpoints", checkpoint_uri={uri!r}, every_steps=40, poll_interval=0.5
)

with DAG({dag_id!r}, schedule=[CHECKPOINTS], start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False, is_paused_upon_creation=False):

    @task
    def seen(triggering_asset_events=None) -> list:
        return [e.extra["payload"]["checkpoint_step"] for e in triggering_asset_events[CHECKPOINTS]]

    seen()
'''


@pytest.fixture(scope="module")
def deployment_dags(deployment_root: Path) -> dict[str, str]:
    """The two example DAGs shipped in the package, and the milestones' DAG."""
    home = deployment_root / "airflow_home"  # the deployment's AIRFLOW_HOME
    uri = str(home / "spot_checkpoints" / "spot_demo" / "taskflow" / RUN_ID)
    return {f"{name}.py": (DAGS / f"{name}.py").read_text() for name in (TRAIN, EVALUATE)} | {
        "spot_milestones_dag.py": MILESTONE_DAG.format(uri=uri, dag_id=MILESTONES)
    }


def _runs(dep: Any, dag_id: str) -> list[dict[str, Any]]:
    return dep.get(f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]


def _ended(dep: Any, dag_id: str, run_id: str | None = None, n: int = 1) -> list[dict[str, Any]]:
    """The DAG's runs once ``n`` of them (or ``run_id``) ended."""
    end = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < end:
        runs = [r for r in _runs(dep, dag_id) if run_id in (None, r["dag_run_id"])]
        if len([r for r in runs if r["state"] in ("success", "failed")]) >= n:
            return runs
        time.sleep(0.5)
    pytest.fail(f"{dag_id} did not end within {RUN_TIMEOUT_S:.0f} s:\n{dep.task_errors()}")


def _xcom(dep: Any, dag_id: str, run_id: str, task_id: str) -> Any:
    path = (
        f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    )
    return dep.get(path)["value"]


def _events(dep: Any, asset: str) -> list[dict[str, Any]]:
    (found,) = [
        a for a in dep.get("/api/v2/assets", name_pattern=asset)["assets"] if a["name"] == asset
    ]
    return dep.get("/api/v2/assets/events", asset_id=found["id"])["asset_events"]


@pytest.fixture(scope="module")
def trained(airflow_deployment: Any) -> dict[str, Any]:
    """The training run ended, and the evaluation it started."""
    dep = airflow_deployment
    for dag_id in (TRAIN, EVALUATE, MILESTONES):
        dep.wait_for_dag(dag_id)
    dep.request("PATCH", f"/api/v2/dags/{EVALUATE}", json={"is_paused": False}).raise_for_status()
    dep.request("PATCH", f"/api/v2/dags/{TRAIN}", json={"is_paused": False}).raise_for_status()
    body = {"logical_date": None, "dag_run_id": RUN_ID}
    dep.request("POST", f"/api/v2/dags/{TRAIN}/dagRuns", json=body).raise_for_status()
    (run,) = _ended(dep, TRAIN, RUN_ID)
    assert run["state"] == "success", dep.task_errors()
    (evaluation,) = _ended(dep, EVALUATE)
    return {"evaluation": evaluation}


def test_the_model_event_starts_the_evaluation(airflow_deployment: Any, trained: dict) -> None:
    dep = airflow_deployment
    summary = _xcom(dep, TRAIN, RUN_ID, "train_logreg")
    final = summary["final_checkpoint"]
    assert final["step"] == 120 and summary["result"]["seed"] == 0
    (event,) = _events(dep, "spot_logreg_model")
    extra = event["extra"]
    assert extra["checkpoint_step"] == 120 and extra["uri"] == final["uri"]
    assert extra["cost"] == summary["cost"] and extra["deadline_met"] == summary["deadline_met"]
    evaluation = trained["evaluation"]
    assert evaluation["state"] == "success", dep.task_errors()
    got = _xcom(dep, EVALUATE, evaluation["dag_run_id"], "evaluate")
    assert got["checkpoint_step"] == 120
    assert got["accuracy"] == pytest.approx(summary["result"]["accuracy"])


def test_a_cleared_training_task_records_no_second_event(
    airflow_deployment: Any, trained: dict
) -> None:
    dep = airflow_deployment
    body = {"dag_run_id": RUN_ID, "task_ids": ["train_logreg"], "only_failed": False,
            "dry_run": False, "reset_dag_runs": True}  # fmt: skip
    dep.request("POST", f"/api/v2/dags/{TRAIN}/clearTaskInstances", json=body).raise_for_status()
    end = time.monotonic() + RUN_TIMEOUT_S
    ti_path = f"/api/v2/dags/{TRAIN}/dagRuns/{RUN_ID}/taskInstances/train_logreg"
    while (ti := dep.get(ti_path))["try_number"] < 2 or ti["state"] != "success":
        assert ti["state"] != "failed" and time.monotonic() < end, dep.task_errors()
        time.sleep(0.5)
    assert len(_events(dep, "spot_logreg_model")) == 1  # the event is recorded at success
    assert len(_runs(dep, EVALUATE)) == 1
    logs = "".join(
        p.read_text(errors="replace")
        for p in (dep.root / "logs").glob(f"dag_id={TRAIN}/run_id={RUN_ID}/**/attempt=2*.log")
    )
    assert "is recorded already" in logs, logs[-2000:]


def test_milestones_come_from_the_watcher_once_each(airflow_deployment: Any, trained: dict) -> None:
    dep = airflow_deployment
    events = _events(dep, "spot_logreg_checkpoints")
    steps = [e["extra"]["payload"]["checkpoint_step"] for e in events]
    # each names the newest whole checkpoint past a multiple of 40 (checkpoints every 10 steps)
    crossed = [s // 40 for s in sorted(steps)]
    assert steps and crossed == sorted(set(crossed)) and crossed[0] >= 1, steps
    assert len(steps) == len(set(steps)) and max(steps) <= 120, steps
    # several events may start several runs: wait until none is queued or running any more
    end = time.monotonic() + RUN_TIMEOUT_S
    while not (runs := _ended(dep, MILESTONES)) or any(
        r["state"] not in ("success", "failed") for r in runs
    ):
        assert time.monotonic() < end, runs
        time.sleep(0.5)
    assert all(r["state"] == "success" for r in runs), (runs, dep.task_errors())
