"""Issue 35, the operator's side of a gang: ``nodes=N`` agrees with the backend, every node is
billed (node-hours per capacity), the gang's preemption is one preemption of the job, and each
rank's end is in the ledger. The ranks are real processes (JAX, gloo) on the local backend."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.local import LocalBackend
from airflow_spot.exceptions import ConfigError
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import FileTaskStateStore, make_context

TRAIN = [sys.executable, "-m", "airflow_spot.examples.train_ddp", "--save-every", "10"]


def _counts(tmp_path: Path, counts: list[int]) -> str:
    p = tmp_path / "counts.json"
    p.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": counts}))
    return str(p)


def _op(tmp_path: Path, backend, **kw) -> SpotTrainingOperator:
    return SpotTrainingOperator(
        task_id="train",
        command=[*TRAIN, "--steps", "160", "--step-seconds", "0.05"],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=8),
        total_steps=160,
        deadline=timedelta(seconds=150),
        changeover=timedelta(seconds=3),
        policy="greedy",
        backend=backend,
        decision_interval=timedelta(seconds=2),
        poll_interval=0.1,
        deferrable=False,
        **kw,
    )


@pytest.mark.parametrize(
    ("nodes", "backend", "said"),
    [
        (3, LocalBackend(nodes=2), "the backend runs 2 ranks per attempt"),
        (2, "local", "LocalBackend(nodes=2)"),
        (2, KubernetesBackend(image="img"), "KubernetesBackend(nodes=2)"),
        (0, LocalBackend(), "must be an integer >= 1"),
    ],
)
def test_a_gang_size_that_disagrees_is_refused_naming_the_field(
    tmp_path: Path, nodes, backend, said
) -> None:
    with pytest.raises(ConfigError) as e:
        _op(tmp_path, backend, nodes=nodes)
    assert e.value.field == "nodes" and said in str(e.value)


def test_a_negative_acquisition_time_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _op(tmp_path, LocalBackend(nodes=2), on_demand_acquire=timedelta(seconds=-1))
    assert e.value.field == "on_demand_acquire"


def test_a_gang_is_preempted_as_one_resumed_and_billed_per_node(tmp_path: Path) -> None:
    """Two ranks on a count trace that drops to 1 (a node taken) after 12 s: the whole attempt is
    preempted (one preemption, no failure), the gang relaunches from its last checkpoint, and
    the ledger bills both nodes."""
    counts = [2] * 12 + [1, 0] + [2] * 300
    backend = LocalBackend(
        trace=_counts(tmp_path, counts),
        polarity="available",
        time_scale=3600.0,
        work_dir=str(tmp_path / "runs"),
        nodes=2,
        notice_s=0.2,
        grace_s=1.0,
    )
    op = _op(tmp_path, backend)
    summary = op.execute(make_context(FileTaskStateStore(tmp_path / "s.json")))
    assert summary["nodes"] == 2, summary
    attempts = summary["attempts"]
    assert attempts[0]["outcome"] == "preempted" and attempts[-1]["outcome"] == "succeeded"
    assert summary["preemptions"] >= 1 and summary["failures"] == 0
    ranks = attempts[0]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert {r["outcome"] for r in ranks} <= {"preempted", "stopped", "succeeded"}
    assert "preempted" in {r["outcome"] for r in ranks}
    # resumed from the gang's last whole checkpoint
    assert attempts[1]["step_start"] == attempts[0]["checkpoint_step_end"]
    hours = summary["node_hours"]
    assert hours["spot"] == pytest.approx(2 * summary["spot_hours"], abs=1e-5)
    assert summary["cost"] > 0
    state = FileTaskStateStore(tmp_path / "s.json").get("airflow_spot_job")
    assert state["args"]["nodes"] == 2


def test_a_partial_gang_is_billed_and_a_slow_on_demand_gang_widens_the_margin() -> None:
    """What a gang's backend reports at an attempt's end reaches the job's state: the
    node-seconds a partial gang held before its timeout are billed (spot price per node), and
    the time its on-demand nodes took is kept for the safety net's margin (the longest)."""
    from types import SimpleNamespace

    from airflow_spot.backends.base import AttemptStatus, State
    from airflow_spot.jobstate import AttemptHandle, AttemptRecord, JobState
    from airflow_spot.operators.attempt import LiveAttempt

    st = JobState(started_at=1000.0, deadline_at=1000.0 + 3600.0, time_scale=60.0)
    held = AttemptRecord(1, "spot", AttemptHandle(attempt=1), launched_at=1010.0, price=0.9)
    gave_up = AttemptStatus(
        State.ENDED, "spot", 1, 1010.0, evidence={"held_node_s": 30.0, "held_since": 1012.0}
    )
    LiveAttempt._gang_costs(SimpleNamespace(state=st), held, gave_up)  # type: ignore[arg-type]
    assert st.probe_found == [[1012.0, 1800.0, 0.9]]  # 30 node-seconds at 60x: 0.5 node-hours
    led = st.ledger(2000.0, 1.0, 3.06, 3600.0)
    probe = [s for s in led.segments if s.phase.value == "probe"]
    assert sum(s.cost for s in probe) == pytest.approx(0.5 * 0.9)
    for took in (40.0, 25.0):
        od = AttemptRecord(2, "on_demand", AttemptHandle(attempt=2), launched_at=1100.0)
        came = AttemptStatus(State.ENDED, "on_demand", 2, 1100.0, evidence={"acquired_s": took})
        LiveAttempt._gang_costs(SimpleNamespace(state=st), od, came)  # type: ignore[arg-type]
    assert st.acquired_s == 40.0 and len(st.probe_found) == 1  # granted gangs hold nothing
