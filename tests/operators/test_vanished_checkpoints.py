"""A checkpoint location deleted while the job runs is noticed: the attempt that ends next
finds less than the job had seen, the log and the UI's decision log say "saved checkpoints at
X vanished: step N to 0", and the task's claim on the location is written back (the guard
against another job training there holds for the rest of the run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

from airflow_spot.backends.local import LocalBackend
from airflow_spot.checkpoint.manifest import MANIFEST, checkpoint_name
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command


def _delete_then_kill(location: Path, run_dir: Path, step: int) -> threading.Thread:
    """Once checkpoint ``step`` is saved: stop the trainer (SIGSTOP: it saves nothing more),
    delete the whole location, then kill the trainer (its steps since step ``step`` are lost)."""

    def run() -> None:
        manifest = location / checkpoint_name(step) / MANIFEST
        until = time.time() + 60
        while not manifest.exists() and time.time() < until:
            time.sleep(0.01)
        pid = json.loads((run_dir / "status.json").read_text())["child_pid"]
        os.kill(pid, signal.SIGSTOP)
        shutil.rmtree(location)
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_deleted_location_is_said_and_its_claim_restored(tmp_path: Path) -> None:
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    location = tmp_path / "ckpt"
    op = SpotTrainingOperator(
        task_id="train",
        command=train_command(60, step_seconds=0.05, save_every=5),
        checkpoint_uri=str(location),
        expected_compute=timedelta(seconds=3),
        total_steps=60,
        deadline=timedelta(seconds=60),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        max_failures=1,  # the kill is one application failure
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=1.0, work_dir=str(tmp_path / "runs")
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.05,
        deferrable=False,
    )
    run_dir = tmp_path / "runs" / "dag" / "run" / "train" / "-1" / "attempt-001"
    killer = _delete_then_kill(location, run_dir, 15)
    store = FileTaskStateStore(tmp_path / "s.json")
    summary = op.execute(make_context(store))
    killer.join(timeout=10)
    state = store.get(STATE_KEY)
    assert [a["outcome"] for a in state["attempts"]] == ["app_failure", "succeeded"]
    assert state["attempts"][1]["step_start"] == 0  # nothing left to resume from
    warnings = [d["reason"] for d in state["decisions"] if d.get("event") == "warning"]
    vanished = [w for w in warnings if w.startswith(f"saved checkpoints at {location} vanished")]
    assert len(vanished) == 1, warnings
    assert " to 0 " in vanished[0] and "claim on the location was written back" in vanished[0]
    seen = int(vanished[0].split("vanished: step ")[1].split(" ")[0])
    assert seen >= 5  # a checkpoint the job saw (under load, perhaps one before step 15)
    # both records of the claim are back (the owner, and this run's claim), naming this task
    me = {"dag_id": "dag", "task_id": "train", "run_id": "run", "map_index": -1}
    claims = sorted(location.glob("job-owner*.json"))
    assert [p.name.startswith("job-owner-") for p in claims] == [True, False]
    assert [json.loads(p.read_text()) for p in claims] == [me, me]
    assert summary["deadline_met"] is True and state["checkpoint_seen"] == 60
