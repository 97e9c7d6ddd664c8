"""Nothing trains unwatched (issue 21): each attempt holds a lease that the operator and its
trigger renew while they look; when nobody does (a failed try, a dead triggerer) the attempt
checkpoints and stops by itself, and the next try resumes from that checkpoint."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import read_status
from airflow_spot.exceptions import ConfigError
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.arguments import default_lease
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command


def _op(tmp_path: Path, lease: timedelta | None) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "market.json", [(True, 5000)])  # spot all along
    return SpotTrainingOperator(
        task_id="train",
        command=train_command(2000, step_seconds=0.01, save_every=1000),
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=20),
        total_steps=2000,
        deadline=timedelta(seconds=40),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=60.0, work_dir=str(tmp_path / "runs")
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.1,
        min_deferral=timedelta(0),
        lease=lease,
    )


def test_a_try_nobody_resumes_leaves_no_attempt_training(tmp_path: Path) -> None:
    """Try 1 defers and its trigger never runs (a dead triggerer, a failed try): after the
    lease the attempt has checkpointed and stopped by itself; try 2 records it as an
    infrastructure disruption ("lease expired") and resumes from that checkpoint."""
    store = FileTaskStateStore(tmp_path / "state.json")
    with pytest.raises(TaskDeferred):
        _op(tmp_path, timedelta(seconds=2)).execute(make_context(store))
    first = store.get(STATE_KEY)["attempts"][0]
    assert first["handle"]["lease_s"] == 2.0
    handle = AttemptHandle.from_dict(first["handle"])
    until = time.time() + 20
    while not (st := read_status(handle)).terminal and time.time() < until:
        time.sleep(0.1)
    assert st.terminal and "lease expired" in st.reason, st
    with pytest.raises(TaskDeferred):
        _op(tmp_path, timedelta(seconds=2)).execute(make_context(store, try_number=2))
    state = store.get(STATE_KEY)
    a1, a2 = state["attempts"][0], state["attempts"][1]
    assert a1["outcome"] == "infra_disruption" and "lease expired" in a1["reason"]
    assert a1["ckpt_step_end"] > 0 and a2["step_start"] == a1["ckpt_step_end"], (a1, a2)  # resumed
    h2 = AttemptHandle.from_dict(a2["handle"])
    LocalBackend().cancel(h2)


def test_the_default_lease_and_a_bad_one() -> None:
    """The default is three decision intervals and at least 5 minutes; a lease shorter than
    three poll intervals is refused, naming the field."""
    assert default_lease(timedelta(seconds=60)) == timedelta(minutes=5)
    assert default_lease(timedelta(minutes=10)) == timedelta(minutes=30)
    with pytest.raises(ConfigError, match="lease"):
        SpotTrainingOperator(
            task_id="t",
            command=[sys.executable, "-c", "pass"],
            checkpoint_uri="/tmp/x",
            expected_compute=timedelta(hours=1),
            deadline=timedelta(hours=2),
            poll_interval=5.0,
            lease=timedelta(seconds=10),
        )


def test_an_attempt_launched_by_a_worker_that_died_before_recording_it_is_adopted(
    tmp_path: Path,
) -> None:
    """A worker launched attempt 2 and died before saving its record: the next try finds it
    (the backend's ``find_attempts``), closes the recorded attempt 1 that had ended, and
    re-attaches to attempt 2, now recorded; nothing is set aside and no third attempt starts
    while it trains, so its steps and end reach the ledger."""
    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, None)
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store))
    state = store.get(STATE_KEY)
    h1 = AttemptHandle.from_dict(state["attempts"][0]["handle"])
    backend = op._backend()
    backend.cancel(h1)  # attempt 1 ends ...
    h2 = backend.launch(  # ... and a worker starts attempt 2, then dies before recording it
        _ident(state),
        2,
        "spot",
        list(op.command),
        checkpoint_uri=str(tmp_path / "ckpt"),
        changeover_wall_s=0.1,
        market=backend.market_spec(time.time()),
    )
    with pytest.raises(TaskDeferred):
        _op(tmp_path, None).execute(make_context(store, try_number=2))
    state = store.get(STATE_KEY)
    assert [a["attempt"] for a in state["attempts"]] == [1, 2]
    assert state["attempts"][0]["outcome"] == "cancelled"
    assert state["current"] == 1 and state["attempts"][1]["handle"]["run_dir"] == h2.run_dir
    runs = Path(str(h2.run_dir)).parent
    assert sorted(p.name for p in runs.iterdir()) == ["attempt-001", "attempt-002"]  # none aside
    LocalBackend().cancel(h2)


def _ident(state: dict) -> TaskIdentity:
    """The task identity the first try launched under (from its run folder)."""
    run_dir = Path(state["attempts"][0]["handle"]["run_dir"])
    dag, run, task, mi = run_dir.parts[-5:-1]
    return TaskIdentity(dag, task, run, int(mi))
