"""A killed worker: the next try re-attaches to the live attempt and never adopts a dead one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import read_status
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

OPERATOR = """
from datetime import timedelta
import sys
from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
def build(root, trace, deferrable):
    return SpotTrainingOperator(
        task_id="train",
        command=[sys.executable, "-m", "airflow_spot.examples.train_logreg", "--steps", "400", "--step-seconds", "0.05"],
        checkpoint_uri=root + "/ckpt", expected_compute=timedelta(seconds=20), total_steps=400,
        deadline=timedelta(seconds=120), changeover=timedelta(seconds=0.1), policy="greedy",
        backend=LocalBackend(trace=trace, polarity="available", time_scale=60.0, work_dir=root + "/runs"),
        decision_interval=timedelta(seconds=5), poll_interval=0.1, deferrable=deferrable,
        min_deferral=timedelta(0))
"""


def _supervisors(root: Path) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", f"airflow_spot.backends.local.supervisor {root}"],
        capture_output=True,
        text=True,
    )
    return [int(p) for p in out.stdout.split()]


@pytest.fixture
def build(tmp_path: Path):
    (tmp_path / "op_factory.py").write_text(OPERATOR)
    sys.path.insert(0, str(tmp_path))
    import importlib

    mod = importlib.import_module("op_factory")
    yield mod.build
    sys.path.remove(str(tmp_path))
    sys.modules.pop("op_factory", None)


def test_killed_worker_reattaches_then_never_adopts_a_dead_attempt(tmp_path: Path, build) -> None:
    """Try 1's worker is SIGKILLed mid-run; try 2 re-attaches to the same live attempt; once the
    attempt's supervisor is lost, try 3 records it as an infrastructure disruption and launches
    a new attempt. At no time do two attempts run."""
    root = str(tmp_path)
    trace = str(scripted_trace(tmp_path / "market.json", [(True, 5000)]))
    store_path = tmp_path / "state.json"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys; sys.path.insert(0, {root!r})
        from op_factory import build
        from airflow_spot.testing import FileTaskStateStore, make_context
        build({root!r}, {trace!r}, False).execute(make_context(FileTaskStateStore({str(store_path)!r})))
    """),
        ]
    )
    store = FileTaskStateStore(store_path)
    deadline = time.time() + 30
    while time.time() < deadline:
        st = store.get(STATE_KEY)
        if st and st["attempts"] and st["attempts"][0].get("handle"):
            handle = st["attempts"][0]["handle"]
            if (Path(handle["run_dir"]) / "progress.json").exists():
                break
        time.sleep(0.1)
    else:
        pytest.fail("try 1 never started training")
    os.kill(worker.pid, signal.SIGKILL)  # the worker dies; the detached attempt must not
    worker.wait()
    assert not read_status(AttemptHandle.from_dict(handle)).terminal
    assert len(_supervisors(tmp_path)) == 1

    with pytest.raises(TaskDeferred) as deferred:  # try 2
        build(root, trace, True).execute(make_context(store, try_number=2))
    st = store.get(STATE_KEY)
    assert len(st["attempts"]) == 1 and st["current"] == 0
    assert deferred.value.trigger.serialize()[1]["handle"]["run_dir"] == handle["run_dir"]
    assert len(_supervisors(tmp_path)) == 1

    # the machine running the attempt is lost (after a checkpoint): supervisor and training process gone
    until = time.time() + 20
    while not list((tmp_path / "ckpt").glob("ckpt-*/MANIFEST.json")) and time.time() < until:
        time.sleep(0.1)
    raw = json.loads((Path(handle["run_dir"]) / "status.json").read_text())
    os.kill(raw["supervisor_pid"], signal.SIGKILL)
    os.killpg(raw["pgid"], signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(TaskDeferred):  # try 3
        build(root, trace, True).execute(make_context(store, try_number=3))
    st = store.get(STATE_KEY)
    assert st["attempts"][0]["outcome"] == "infra_disruption"
    assert "never adopted" in st["attempts"][0]["reason"]
    assert len(st["attempts"]) == 2 and st["current"] == 1
    assert st["attempts"][1]["step_start"] > 0  # resumed from a checkpoint, not from scratch
    assert len(_supervisors(tmp_path)) == 1
    LocalBackend().cancel(AttemptHandle.from_dict(st["attempts"][1]["handle"]))
    assert _supervisors(tmp_path) == []


def test_on_kill_leaves_no_process(tmp_path: Path, build) -> None:
    """on_kill cancels the live attempt: supervisor and the whole training process group are gone."""
    trace = str(scripted_trace(tmp_path / "market.json", [(True, 5000)]))
    store = FileTaskStateStore(tmp_path / "state.json")
    op = build(str(tmp_path), trace, True)
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store))
    handle = store.get(STATE_KEY)["attempts"][0]["handle"]
    time.sleep(1.0)
    pgid = json.loads((Path(handle["run_dir"]) / "status.json").read_text()).get("pgid")
    op.on_kill()
    assert read_status(AttemptHandle.from_dict(handle)).outcome.value == "cancelled"
    assert _supervisors(tmp_path) == []
    if pgid:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def test_an_attempt_launched_before_the_first_state_save_is_adopted(tmp_path: Path, build) -> None:
    """Issue 34, finding 5: try 1's task runner is SIGKILLed right after its first launch
    returned (spec.json written, the turn's state save not reached). Try 2 adopts that attempt
    as attempt 1: not cancelled and set aside as a leftover, its number not reused, and the
    job's clock (and so its deadline) counts from try 1."""
    root = str(tmp_path)
    trace = str(scripted_trace(tmp_path / "market.json", [(True, 5000)]))
    store_path = tmp_path / "state.json"
    before = time.time()
    worker = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import os, signal, sys; sys.path.insert(0, {root!r})
        from airflow_spot.backends.local.backend import LocalBackend
        launch = LocalBackend.launch
        def launch_then_die(self, *args, **kwargs):
            launch(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)  # the task runner dies before saving a record
        LocalBackend.launch = launch_then_die
        from op_factory import build
        from airflow_spot.testing import FileTaskStateStore, make_context
        build({root!r}, {trace!r}, False).execute(make_context(FileTaskStateStore({str(store_path)!r})))
    """),
        ],
        timeout=60,
    )
    assert worker.returncode == -signal.SIGKILL
    first = tmp_path / "runs"
    (spec,) = first.glob("**/attempt-001/spec.json")
    time.sleep(0.5)
    try2_at = time.time()
    with pytest.raises(TaskDeferred):  # try 2
        build(root, trace, True).execute(make_context(FileTaskStateStore(store_path), try_number=2))
    st = FileTaskStateStore(store_path).get(STATE_KEY)
    assert [a["attempt"] for a in st["attempts"]] == [1], st["attempts"]
    assert st["attempts"][0]["handle"]["run_dir"] == str(spec.parent)
    assert st["current"] == 0
    assert not list(first.glob("**/*.leftover-*")), "the attempt was set aside, not adopted"
    assert before <= st["started_at"] < try2_at  # the job's clock started with try 1
    assert not read_status(AttemptHandle.from_dict(st["attempts"][0]["handle"])).terminal
    assert len(_supervisors(tmp_path)) == 1
    LocalBackend().cancel(AttemptHandle.from_dict(st["attempts"][0]["handle"]))
    assert _supervisors(tmp_path) == []
