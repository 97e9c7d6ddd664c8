"""Issue 34, findings 5 and 6, on a real deployment (PostgreSQL, LocalExecutor scheduler,
dag-processor, triggerer and api-server, each its own process):

* finding 5: try 1's task runner is SIGKILLed right after it launched attempt 1 (the DAG's
  backend kills its own process once ``launch`` returns, before the turn saves anything);
  try 2 adopts that attempt as attempt 1, its number and the job's clock kept, nothing set
  aside as a leftover, and the run succeeds;
* finding 6: a ``checkpoint_uri`` templated from ``dag_run.conf`` that climbs out with ``..``,
  or names a folder outside the allowed local roots, fails the task at once with a
  ConfigError naming ``checkpoint_uri``, and nothing is written there.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.testing import scripted_trace

KILLED = "spot_runner_killed"
CONFINED = "spot_confined"
RUN_TIMEOUT_S = 150.0

DAG_SOURCE = '''
"""Written by tests/deployment/test_deployment_runner.py."""
import os
import signal
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

ROOT = {root!r}
STEPS, STEP_S = 150, 0.1


class KilledAfterLaunch(LocalBackend):
    """Try 1's task runner dies (SIGKILL) as soon as its first launch returned."""

    def launch(self, ident, attempt, *args, **kwargs):
        handle = super().launch(ident, attempt, *args, **kwargs)
        if ident.try_number == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return handle


COMMON = dict(
    expected_compute=timedelta(seconds=STEPS * STEP_S),
    total_steps=STEPS,
    deadline=timedelta(seconds=100),
    changeover=timedelta(seconds=1),
    policy="uniform_progress",
    decision_interval=timedelta(seconds=12),
    poll_interval=0.5,
    min_deferral=timedelta(seconds=10.5),
)
START = dict(schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False)

with DAG({killed!r}, **START):
    SpotTrainingOperator(
        task_id="train",
        command=train_command(STEPS, step_seconds=STEP_S, save_every=5, seed=7),
        checkpoint_uri=ROOT + "/ckpt/killed",
        backend=KilledAfterLaunch(
            trace={trace!r}, polarity="available", time_scale=360.0, work_dir=ROOT + "/runs"
        ),
        retries=1,
        retry_delay=timedelta(seconds=1),
        **COMMON,
    )

with DAG({confined!r}, **START):
    backend = LocalBackend(
        trace={trace!r}, polarity="available", time_scale=360.0, work_dir=ROOT + "/runs"
    )
    SpotTrainingOperator(
        task_id="climbs",
        command=train_command(STEPS, step_seconds=STEP_S),
        checkpoint_uri=ROOT + "/ckpt/{{{{ dag_run.conf['name'] }}}}",
        backend=backend,
        **COMMON,
    )
    SpotTrainingOperator(
        task_id="elsewhere",
        command=train_command(STEPS, step_seconds=STEP_S),
        checkpoint_uri="{{{{ dag_run.conf['uri'] }}}}",
        backend=backend,
        **COMMON,
    )
'''


@pytest.fixture(scope="module")
def deployment_dags(deployment_root: Path) -> dict[str, str]:
    trace = scripted_trace(deployment_root / "market.json", [(True, 400)])
    source = DAG_SOURCE.format(
        root=str(deployment_root), trace=str(trace), killed=KILLED, confined=CONFINED
    )
    return {"spot_deployment_runner_dag.py": source}


def _trigger(dep: Any, dag_id: str, conf: dict[str, Any] | None = None) -> str:
    dep.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
    body: dict[str, Any] = {"logical_date": None, **({"conf": conf} if conf else {})}
    r = dep.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json=body)
    r.raise_for_status()
    return r.json()["dag_run_id"]


def _finish(dep: Any, dag_id: str, run_id: str) -> str:
    end = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < end:
        state = dep.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
        if state in ("success", "failed"):
            return state
        time.sleep(0.5)
    pytest.fail(f"{dag_id} did not end within {RUN_TIMEOUT_S:.0f} s:\n{dep.diagnosis()}")


def _ti(dep: Any, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
    return dep.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")


@pytest.fixture(scope="module")
def runs(airflow_deployment: Any, deployment_root: Path) -> dict[str, Any]:
    """Both DAGs run at once: the killed runner's and the confined one's (with its conf)."""
    dep = airflow_deployment
    dep.wait_for_dag(KILLED)
    dep.wait_for_dag(CONFINED)
    outside = Path("/var/tmp") / f"airflow-spot-escape-{uuid.uuid4().hex[:8]}"
    climbed = deployment_root.parent / f"escape-{uuid.uuid4().hex[:8]}"
    conf = {"name": f"../../{climbed.name}", "uri": str(outside)}
    killed = _trigger(dep, KILLED)
    confined = _trigger(dep, CONFINED, conf)
    return {
        "killed": (killed, _finish(dep, KILLED, killed)),
        "confined": (confined, _finish(dep, CONFINED, confined)),
        "outside": outside,
        "climbed": climbed,
    }


def test_a_runner_killed_right_after_a_launch_loses_no_attempt(
    airflow_deployment: Any, runs: dict[str, Any], deployment_root: Path
) -> None:
    dep = airflow_deployment
    run_id, state = runs["killed"]
    assert state == "success", dep.task_errors()
    ti = _ti(dep, KILLED, run_id, "train")
    assert ti["try_number"] == 2  # try 1 died with its runner, after the launch
    summary = dep.get(
        f"/api/v2/dags/{KILLED}/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value"
    )["value"]
    attempts = summary["attempts"]
    assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1)), attempts
    first = attempts[0]
    # adopted, not set aside and launched again: it trained from step 0 and (spot up
    # throughout) to the end; its launch is the job's start (the job's clock began at try 1)
    assert first["step_start"] == 0 and first["outcome"] == "succeeded", attempts
    assert first["launched_h"] is not None and 0 <= first["launched_h"] < 0.1, first
    runs_dir = deployment_root / "runs"
    assert not list(runs_dir.glob(f"{KILLED}/**/*.leftover-*")), "an attempt was set aside"
    assert len(list(runs_dir.glob(f"{KILLED}/**/attempt-*/spec.json"))) == len(attempts)


def test_a_checkpoint_uri_from_the_run_conf_cannot_leave_its_root(
    airflow_deployment: Any, runs: dict[str, Any]
) -> None:
    dep = airflow_deployment
    run_id, state = runs["confined"]
    assert state == "failed"
    said = {
        "climbs": "a local path must not contain '..'",
        "elsewhere": "outside the allowed local checkpoint roots",
    }
    for task_id, why in said.items():
        ti = _ti(dep, CONFINED, run_id, task_id)
        assert ti["state"] == "failed" and ti["try_number"] == 1, ti  # no retry
        logs = "".join(
            p.read_text(errors="replace")
            for p in (dep.root / "logs").glob(
                f"dag_id={CONFINED}/run_id={run_id}/task_id={task_id}/**/*.log"
            )
        )
        assert "ConfigError" in logs and "checkpoint_uri" in logs and why in logs, logs[-3000:]
    assert not runs["outside"].exists(), "a checkpoint was written outside the allowed roots"
    assert not runs["climbed"].exists(), "a checkpoint was written where '..' led"
