"""Issue 34, finding 2: a task instance that Airflow ends without its operator (a try that never
ran operator code, a heartbeat timeout, a user's mark) stops its live attempt, records what
it ran in the job's ledger, and the UI says so. The deployment test
(tests/deployment/test_deployment_outages.py) shows it on a real scheduler; these tests show
the stop and the listener's choices on a real local attempt."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import read_status
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.job import TaskIdentity
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.operators.unwatched import ERROR, stop_unwatched
from airflow_spot.plugins import listener
from airflow_spot.plugins.data import row
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command


def _deferred_job(tmp_path: Path) -> tuple[FileTaskStateStore, dict[str, Any]]:
    """A job deferred with attempt 1 training (its state as the task state store holds it)."""
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    op = SpotTrainingOperator(
        task_id="train",
        command=train_command(400, step_seconds=0.05),
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=20),
        total_steps=400,
        deadline=timedelta(seconds=120),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=60.0, work_dir=str(tmp_path / "r")
        ),
        decision_interval=timedelta(seconds=20),
        poll_interval=0.1,
        min_deferral=timedelta(0),
    )
    store = FileTaskStateStore(tmp_path / "s.json")
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store))
    raw = store.get(STATE_KEY)
    run_dir = Path(raw["attempts"][0]["handle"]["run_dir"])
    until = time.time() + 30
    while not (run_dir / "progress.json").exists() and time.time() < until:
        time.sleep(0.05)
    return store, raw


def _supervisors(root: Path) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", f"airflow_spot.backends.local.supervisor {root}"],
        capture_output=True,
        text=True,
    )
    return [int(p) for p in out.stdout.split()]


IDENT = TaskIdentity("dag", "train", "run", -1, 1)


def test_the_live_attempt_is_stopped_billed_and_shown(tmp_path: Path) -> None:
    store, raw = _deferred_job(tmp_path)
    handle = AttemptHandle.from_dict(raw["attempts"][0]["handle"])
    assert raw["backend"]["kind"] == "local" and raw["args"]["policy"] == "greedy"
    time.sleep(1.0)  # it trains a while, billed
    try:
        state = stop_unwatched(raw, IDENT, "Airflow failed try 1: executor reported failed")
        assert state is not None
        assert read_status(handle).terminal
        assert _supervisors(tmp_path) == []
        (a,) = state["attempts"]
        assert a["ended_at"] is not None and a["outcome"] == "cancelled"
        assert "without its operator" in a["reason"] and a["step_end"] > 0
        assert state["current"] is None
        assert state["failed"]["error"] == ERROR
        assert "attempt 1 on spot" in state["failed"]["message"]
        # the ledger bills the attempt to its stop, and the UI row says it failed
        snap = state["snapshot"]
        assert snap["deadline_met"] is False and snap["cost"] > 0
        shown = row("dag", "run", "train", -1, "failed", state, None)
        assert shown["now"] == "failed" and "may still run" not in json.dumps(shown)
        # idempotent: a second call (a second hook of the same failure) leaves it alone
        assert stop_unwatched(state, IDENT, "again") is None
    finally:
        LocalBackend().cancel(handle)


class _Store:
    """The task state store a server process holds, as a dict (JSON strings, as Airflow's)."""

    def __init__(self, values: dict[Any, str]) -> None:
        self.values = values

    def get(self, scope: Any, key: str) -> str | None:
        return self.values.get((scope.dag_id, scope.run_id, scope.task_id, scope.map_index, key))

    def set(self, scope: Any, key: str, value: str) -> None:
        self.values[(scope.dag_id, scope.run_id, scope.task_id, scope.map_index, key)] = value


def _server_ti(state: str) -> Any:
    """A task instance as the scheduler and the api-server hold it (its module is what tells a
    server's from a worker's)."""
    cls = type("TaskInstance", (SimpleNamespace,), {"__module__": listener.SERVER_TI})
    return cls(dag_id="dag", run_id="run", task_id="train", map_index=-1, try_number=3, state=state)


def test_the_listener_stops_a_task_failed_for_good_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow.state

    store, raw = _deferred_job(tmp_path)
    handle = AttemptHandle.from_dict(raw["attempts"][0]["handle"])
    key = ("dag", "run", "train", -1, STATE_KEY)
    server = _Store({key: json.dumps(raw)})
    monkeypatch.setattr(airflow.state, "get_state_backend", lambda: server)
    try:
        # a try with tries left: the next one re-attaches
        listener.on_task_instance_failed(None, _server_ti("up_for_retry"), "boom")
        # a worker's task instance: the operator handled its own end
        worker_ti = SimpleNamespace(**vars(_server_ti("failed")))
        assert listener.ended(worker_ti, "x", wait=True) is None
        time.sleep(0.3)
        assert not read_status(handle).terminal
        assert json.loads(server.values[key]) == raw
        t = listener.ended(_server_ti("failed"), "Airflow failed try 3: executor failed", wait=True)
        assert t is not None
        assert read_status(handle).terminal and _supervisors(tmp_path) == []
        saved = json.loads(server.values[key])
        assert saved["failed"]["error"] == ERROR and "try 3" in saved["failed"]["message"]
        assert saved["attempts"][0]["ended_at"] is not None
    finally:
        LocalBackend().cancel(handle)


def test_a_task_with_no_spot_state_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.state

    server = _Store({})
    monkeypatch.setattr(airflow.state, "get_state_backend", lambda: server)
    assert listener.ended(_server_ti("failed"), "x", wait=True) is not None
    assert server.values == {}


def test_the_plugin_registers_the_listener() -> None:
    from airflow_spot.plugins import SpotTrainingPlugin

    assert listener in SpotTrainingPlugin.listeners
    assert sys.modules["airflow_spot.plugins.listener"] is listener


def test_the_settings_kept_for_the_listener_are_json_values(tmp_path: Path) -> None:
    """The task state store takes JSON values only (Airflow's SetTaskStateStore refuses a
    tuple): a Kubernetes backend's settings (tuples) are kept as lists, and load back."""
    from pydantic import JsonValue, TypeAdapter

    from airflow_spot.backends.kubernetes.backend import KubernetesBackend
    from airflow_spot.backends.registry import load_backend
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.local import LocalStore
    from airflow_spot.jobstate import JobState
    from airflow_spot.operators.job import JobArgs
    from airflow_spot.operators.turn import Turn

    backend = KubernetesBackend(image="img", namespace="ns", env_from_secrets=("creds",))
    args = JobArgs(
        ("python", "train.py"),
        "s3://b/p",
        timedelta(hours=1),
        100,
        timedelta(minutes=1),
        "greedy",
        0.9,
        3.0,
        None,
        "fallback",
        3,
        timedelta(minutes=1),
        5.0,
    )
    state = JobState(started_at=0.0, deadline_at=7200.0)
    Turn(args, IDENT, backend, state, Checkpoints.watching(LocalStore(str(tmp_path))))
    TypeAdapter(JsonValue).validate_python(state.to_dict())
    assert load_backend(state.backend).to_dict() == backend.to_dict()
    assert JobArgs.from_dict(state.args) == JobArgs(**{**args.__dict__, "command": ()})
