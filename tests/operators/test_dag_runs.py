"""Whole DAG runs under dag.test(): preemptions, resume, fallback, failures, budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_spot.testing import scripted_trace

pytestmark = pytest.mark.usefixtures("airflow_db")


def _state(dag_id: str, run_id: str) -> dict:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        row = s.scalars(  # task "train": test_plugin_api adds a gang's state to a run
            select(TaskStateStoreModel).where(
                TaskStateStoreModel.dag_id == dag_id,
                TaskStateStoreModel.run_id == run_id,
                TaskStateStoreModel.task_id == "train",
            )
        ).first()
        return json.loads(row.value)


def _run(monkeypatch, tmp_path: Path, dag_name: str, **env: str):
    monkeypatch.setenv("SPOT_TEST_DIR", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import importlib

    sys.path.insert(0, str(Path(__file__).parents[1] / "dags"))
    try:
        mod = importlib.import_module("spot_test_dags")
        mod = importlib.reload(mod)
    finally:
        sys.path.pop(0)
    dag = getattr(mod, dag_name)
    return dag, dag.test()


def test_preemptions_resume_and_fallback_meet_the_deadline(preemptions_run: dict) -> None:
    """>= 3 preemptions and a deadline tight enough to force on-demand: done on time, and the
    final model is bit-identical to an uninterrupted run with the same seed. (The run, greedy on
    THREE_PREEMPTIONS_THEN_OUTAGE at half speed, is conftest's ``preemptions_run``, which
    test_plugin_api shows too.)"""
    run, tmp_path = preemptions_run, preemptions_run["dir"]
    assert run["state"] == "success"
    st = _state(run["dag_id"], run["run_id"])
    summary = st["finished"]
    assert summary["deadline_met"] is True
    assert summary["preemptions"] >= 3
    caps = [a["capacity"] for a in summary["attempts"]]
    assert "on_demand" in caps and caps[0] == "spot"
    assert summary["attempts"][-1]["outcome"] == "succeeded"
    assert summary["failures"] == 0
    assert 0 < summary["cost"] < summary["on_demand_cost"]
    # the same model as an uninterrupted run
    ref = tmp_path / "reference-ckpt"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_spot.examples.train_logreg",
            "--steps",
            "200",
            "--save-every",
            "5",
            "--seed",
            "7",
            "--checkpoint-uri",
            str(ref),
        ],
        check=True,
        capture_output=True,
    )
    final = Path(summary["final_checkpoint"]["uri"]) / "weights.npy"
    assert final.read_bytes() == (ref / "ckpt-000000000200" / "weights.npy").read_bytes()
    # nothing left running
    out = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "runs")], capture_output=True, text=True
    ).stdout
    assert out.strip() == ""


def test_application_failures_spend_only_the_failure_budget(monkeypatch, tmp_path: Path) -> None:
    """A command that exits 3 on healthy capacity fails twice (max_failures=1): the task fails
    naming the failure budget; no preemption is counted."""
    trace = scripted_trace(tmp_path / "market.json", [(True, 1000)])
    dag, dr = _run(monkeypatch, tmp_path, "failures_dag", SPOT_TEST_TRACE=str(trace))
    assert dr.state == "failed"
    st = _state(dag.dag_id, dr.run_id)
    assert st["failures"] == 2
    assert st["preemptions"] == 0
    assert st["failed"]["error"] == "FailureBudgetExhausted"
    assert "exceed max_failures=1" in st["failed"]["message"]
    assert all(a["outcome"] == "app_failure" for a in st["attempts"])
    assert "exited 3" in st["attempts"][0]["reason"]
    assert os.path.exists(st["attempts"][0]["handle"]["run_dir"])


def test_a_live_job_of_another_run_keeps_its_location(monkeypatch, tmp_path: Path, capfd) -> None:
    """The failures DAG trains into one untemplated location. With its first run's task
    instance live again (up for retry: a real row of Airflow's database, read back through
    Airflow's execution API), a second run of the task is refused before it starts anything;
    once that task instance has ended, the next run takes the location over."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    trace = scripted_trace(tmp_path / "market.json", [(True, 1000)])
    dag, first = _run(monkeypatch, tmp_path, "failures_dag", SPOT_TEST_TRACE=str(trace))
    assert first.state == "failed"

    def set_first(state: str) -> None:
        with create_session() as s:
            ti = s.scalars(
                select(TaskInstance).where(
                    TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == first.run_id
                )
            ).one()
            ti.state = state

    set_first("up_for_retry")
    capfd.readouterr()
    _, second = _run(monkeypatch, tmp_path, "failures_dag", SPOT_TEST_TRACE=str(trace))
    assert second.state == "failed"
    out = "".join(capfd.readouterr())
    assert (
        f"is in use by task spot_test_failures.train of run {first.run_id}, which is up_for_retry"
        in out
    )
    assert _mapped_states(dag.dag_id, second.run_id) == {}  # it never started a job
    set_first("failed")
    _, third = _run(monkeypatch, tmp_path, "failures_dag", SPOT_TEST_TRACE=str(trace))
    assert _state(dag.dag_id, third.run_id)["failed"]["error"] == "FailureBudgetExhausted"


def _mapped_states(dag_id: str, run_id: str) -> dict[int, dict]:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        rows = s.scalars(
            select(TaskStateStoreModel).where(
                TaskStateStoreModel.dag_id == dag_id, TaskStateStoreModel.run_id == run_id
            )
        ).all()
        return {r.map_index: json.loads(r.value) for r in rows if r.key == "airflow_spot_job"}


@pytest.mark.parametrize("shared", [False, True])
def test_mapped_instances_each_train_into_their_own_location(
    monkeypatch, tmp_path: Path, shared: bool
) -> None:
    """partial().expand() with checkpoint_uri templated on ti.map_index: both instances train
    their own model to the end. With one untemplated location, the instance that comes second
    fails at once naming checkpoint_uri instead of resuming from the first one's checkpoints."""
    trace = scripted_trace(tmp_path / "market.json", [(True, 1000)])
    env = {"SPOT_TEST_TRACE": str(trace)}
    if shared:
        env["SPOT_TEST_MAPPED_URI"] = "/mapped-shared"
    dag, dr = _run(monkeypatch, tmp_path, "mapped_dag", **env)
    states = _mapped_states(dag.dag_id, dr.run_id)
    if not shared:
        assert dr.state == "success"
        uris = {i: st["finished"]["final_checkpoint"]["uri"] for i, st in states.items()}
        assert sorted(uris) == [0, 1] and uris[0] != uris[1]
        assert all(st["finished"]["final_checkpoint"]["step"] == 20 for st in states.values())
        assert all(st["attempts"][0]["step_start"] == 0 for st in states.values())
    else:
        assert dr.state == "failed"
        # whichever instance ran first owns the location and finishes; the other never
        # started a job (dag.test() does not promise an order)
        assert len(states) == 1
        first, st = next(iter(states.items()))
        assert st["finished"]
        owner = json.loads((tmp_path / "mapped-shared" / "job-owner.json").read_text())
        assert owner["map_index"] == first


def test_a_return_to_spot_is_make_before_break(monkeypatch, tmp_path: Path) -> None:
    """Spot down at the start (uniform_progress falls behind its line and trains on on-demand),
    then up for good. As a cluster shows spot, the return is make-before-break: the spot
    attempt is launched while on-demand trains, and once it is ready the on-demand attempt
    checkpoints and stops and the spot attempt resumes from that very checkpoint: no idle gap,
    no lost step, both billed while they overlap; the model equals an uninterrupted run's."""
    trace = scripted_trace(tmp_path / "market.json", [(False, 12), (True, 1000)])
    dag, dr = _run(
        monkeypatch,
        tmp_path,
        "preemptions_dag",
        SPOT_TEST_TRACE=str(trace),
        SPOT_TEST_SCALE="900",  # half speed, as above: load costs half as many market hours
        SPOT_TEST_STEP_S="0.1",
        SPOT_TEST_DEADLINE_S="34",
        SPOT_TEST_POLICY="uniform_progress",
        SPOT_TEST_OBSERVE="cluster",
    )
    assert dr.state == "success"
    st = _state(dag.dag_id, dr.run_id)
    handed = [a for a in st["attempts"] if a.get("handed_to")]
    assert len(handed) == 1, [(a["capacity"], a["outcome"]) for a in st["attempts"]]
    od = handed[0]
    spot = next(a for a in st["attempts"] if a["attempt"] == od["handed_to"])
    assert od["capacity"] == "on_demand" and spot["capacity"] == "spot"
    assert spot["launched_at"] < od["ended_at"]  # launched while on-demand trained
    assert spot["ready_at"] <= od["ended_at"] <= spot["started_at"]  # no idle gap
    assert spot["step_start"] == od["ckpt_step_end"] >= od["step_end"] - 0  # no lost step
    assert od["step_end"] == od["ckpt_step_end"]
    summary = st["finished"]
    assert summary["deadline_met"] is True
    assert summary["overlap_hours"] > 0
    assert summary["attempts"][-1]["capacity"] == "spot"
    assert summary["work_lost_hours"] == 0
    decisions = st["decisions"]
    assert all("spot" in d for d in decisions)
    assert any(d["spot"].startswith("down") for d in decisions)
