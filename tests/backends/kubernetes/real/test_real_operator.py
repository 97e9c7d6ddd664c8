"""The operator's whole loop on the real control plane (issue 20): real API server, scheduler
and controllers, our kubelet running each pod as a process, the DAG reaching the cluster
through an Airflow Kubernetes connection that holds docker/rbac.yaml's ServiceAccount token.

Preemptions by the real controllers resume from the checkpoint with no lost step when the
notice is relayed, fall back to on-demand on time, an application failure spends the failure
budget, and a return to spot is make-before-break (issue 19)."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("airflow_db")
NS = "ml-training"


@pytest.fixture
def dag_env(kube_cluster, sa_kubeconfig, tmp_path: Path, monkeypatch):
    cfg, _ = sa_kubeconfig
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": cfg, "namespace": NS}}
    monkeypatch.setenv("AIRFLOW_CONN_SPOT_K8S_SA", json.dumps(conn))
    monkeypatch.setenv("SPOT_K8S_CONN_ID", "spot_k8s_sa")
    monkeypatch.setenv("SPOT_K8S_NAMESPACE", NS)
    monkeypatch.setenv("SPOT_K8S_DIR", str(tmp_path))
    monkeypatch.setenv("SPOT_K8S_PENDING_S", "8")
    monkeypatch.setenv("SPOT_K8S_DEADLINE_S", "60")
    return kube_cluster.kubelet


def _state(run_id: str) -> dict:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        row = s.scalars(
            select(TaskStateStoreModel).where(
                TaskStateStoreModel.dag_id == "spot_k8s", TaskStateStoreModel.run_id == run_id
            )
        ).first()
        return json.loads(row.value)


def _run_dag():
    sys.path.insert(0, str(Path(__file__).parents[3] / "dags"))
    try:
        mod = importlib.reload(importlib.import_module("spot_k8s_dags"))
    finally:
        sys.path.pop(0)
    return mod.k8s_dag.test()


def _trained(summary: dict) -> list[dict]:
    """The attempts that trained (a spot return that never got a node trained nothing)."""
    return [
        a
        for a in summary["attempts"]
        if not (a["outcome"] in ("spot_unavailable", "cancelled") and a["start_h"] is None)
    ]


def test_reclaims_by_the_real_controllers_resume_and_fall_back(dag_env) -> None:
    """Three spot nodes are taken away (a spot-interruption drain through the Eviction API, a
    graceful shutdown, lost heartbeats); each attempt resumes from the checkpoint, the relayed
    notice loses nothing, spot then stays unavailable and the job finishes on an on-demand pod
    on time. The drain's verdict comes while the container still saves on the notice: the
    next launch credits that save to it, so every record meets the next one's start."""
    k = dag_env
    k.plan = {1: ("drain", 1.5), 2: ("shutdown", 1.5), 3: ("unreachable", 1.5)}
    k.spot_gone_after_plan = True
    dr = _run_dag()
    st = _state(dr.run_id)
    assert dr.state == "success", st.get("failed")
    assert [how for _, _, how in k.reclaimed] == ["drain", "shutdown", "unreachable"]
    summary = st["finished"]
    assert summary["preemptions"] == 3 and summary["deadline_met"] is True, [
        (a["capacity"], a["outcome"], a["reason"]) for a in summary["attempts"]
    ]
    attempts = _trained(summary)
    assert [a["outcome"] for a in attempts[:3]] == ["preempted"] * 3
    assert attempts[-1]["capacity"] == "on_demand" and attempts[-1]["outcome"] == "succeeded"
    for before, after in zip(attempts, attempts[1:], strict=False):
        assert after["step_start"] == before["checkpoint_step_end"] > 0  # resumed
    assert attempts[0]["step_end"] == attempts[0]["checkpoint_step_end"]  # notice: nothing lost


def test_an_application_failure_spends_the_failure_budget(
    dag_env, monkeypatch, capfd, caplog
) -> None:
    """A container that exits 3 on a healthy node is an application failure; its log tail,
    read through the real API server's pods/log, is in the task's log."""
    monkeypatch.setenv(
        "SPOT_K8S_COMMAND",
        f"{sys.executable}|-c|import sys; print('loss is NaN at step 7', flush=True); sys.exit(3)",
    )
    dr = _run_dag()
    st = _state(dr.run_id)
    assert dr.state == "failed"
    assert st["failed"]["error"] == "FailureBudgetExhausted"
    assert st["failures"] == 2 and st["preemptions"] == 0
    assert all(a["outcome"] == "app_failure" and a["exit_code"] == 3 for a in st["attempts"])
    out = capfd.readouterr()
    assert "Log tail:\nloss is NaN at step 7" in caplog.text + out.out + out.err


def test_a_return_to_spot_is_make_before_break(dag_env, monkeypatch) -> None:
    """Spot is down at the start, so the job trains on demand; when spot comes back the spot
    pod is created while on-demand trains, held until bound and ready; only then does the
    on-demand attempt checkpoint and stop, and the spot attempt resumes from that checkpoint:
    no idle gap, no lost step, the deadline met."""
    k = dag_env
    k.spot_available = False
    monkeypatch.setenv("SPOT_K8S_POLICY", "uniform_progress")
    monkeypatch.setenv("SPOT_K8S_DEADLINE_S", "22")  # 10 s of work: it cannot wait for spot
    stop = threading.Event()

    def spot_returns() -> None:  # 5 s after the first pod is made (dag.test() starts slowly)
        while not stop.is_set() and not k.api.list_namespaced_pod(NS).items:
            time.sleep(0.1)
        if not stop.wait(5.0):
            k.spot_available = True

    market = threading.Thread(target=spot_returns, daemon=True)
    market.start()
    try:
        dr = _run_dag()
    finally:
        stop.set()
        market.join(5)
    st = _state(dr.run_id)
    assert dr.state == "success", st.get("failed")
    summary = st["finished"]
    assert summary["deadline_met"] is True
    rows = [(a["capacity"], a["outcome"], a.get("handed_to")) for a in st["attempts"]]
    handed = [a for a in st["attempts"] if a.get("handed_to")]
    assert len(handed) == 1, rows
    od = handed[0]
    spot = next(a for a in st["attempts"] if a["attempt"] == od["handed_to"])
    assert od["capacity"] == "on_demand" and spot["capacity"] == "spot", rows
    assert spot["launched_at"] < od["ended_at"]  # the spot pod was made while on-demand trained
    assert spot["ready_at"] <= od["ended_at"] <= spot["started_at"]  # no idle gap
    assert spot["step_start"] == od["ckpt_step_end"] == od["step_end"] > 0  # no lost step
    assert summary["overlap_hours"] > 0 and summary["work_lost_hours"] == 0
    assert summary["attempts"][-1]["capacity"] == "spot"


def test_a_new_try_reattaches_to_the_running_pod_and_never_adopts_a_dead_one(
    kube_cluster, sa_kubeconfig, tmp_path: Path
) -> None:
    """The worker dies: try 2 re-attaches to the pod still running (nothing new launched);
    after its spot node is deleted, try 3 records the verdict (preempted) and never adopts
    the dead pod: what runs of the task then is its new attempt or its probe only."""
    from datetime import timedelta

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_spot.backends.kubernetes.backend import KubernetesBackend
    from airflow_spot.operators import SpotTrainingOperator
    from airflow_spot.operators.spot_training import STATE_KEY
    from airflow_spot.testing import FileTaskStateStore, make_context, train_command

    cfg, _ = sa_kubeconfig
    k = kube_cluster.kubelet

    def operator() -> SpotTrainingOperator:
        return SpotTrainingOperator(
            task_id="train",
            command=train_command(2000, step_seconds=0.02),
            checkpoint_uri=str(tmp_path / "ckpt"),
            expected_compute=timedelta(seconds=40),
            total_steps=2000,
            deadline=timedelta(seconds=300),
            changeover=timedelta(seconds=1),
            policy="greedy",
            backend=KubernetesBackend(
                image="img", config_file=cfg, namespace=NS, preset="karpenter", spot_cooldown_s=0.5
            ),
            decision_interval=timedelta(seconds=5),
            poll_interval=0.1,
            min_deferral=timedelta(0),
        )

    store = FileTaskStateStore(tmp_path / "state.json")
    with pytest.raises(TaskDeferred):
        operator().execute(make_context(store))
    pod1 = store.get(STATE_KEY)["attempts"][0]["handle"]["pod"]
    until = time.time() + 30
    while time.time() < until and f"{NS}/{pod1}" not in k.procs:
        time.sleep(0.1)
    assert f"{NS}/{pod1}" in k.procs, "the first pod never ran"
    with pytest.raises(TaskDeferred):  # the worker died; a new try starts
        operator().execute(make_context(store, try_number=2))
    st = store.get(STATE_KEY)
    assert len(st["attempts"]) == 1 and st["current"] == 0  # re-attached, nothing new launched
    node = k.api.read_namespaced_pod(pod1, NS).spec.node_name
    k.reclaim(node, "delete")  # the spot node is gone (a real pod GC follows)
    time.sleep(2.5)  # the loss is older than one look: spot is unknown again, greedy asks
    with pytest.raises(TaskDeferred):
        operator().execute(make_context(store, try_number=3))
    st = store.get(STATE_KEY)
    assert st["attempts"][0]["outcome"] == "preempted", st["attempts"][0]  # its verdict
    api = kube_cluster.api
    live = [
        p.metadata.name
        for p in api.list_namespaced_pod(NS, label_selector="airflow-spot/task-id=train").items
        if p.metadata.deletion_timestamp is None
    ]
    assert pod1 not in live  # the dead pod is not adopted
    # after the loss spot is seen down: greedy waits with a probe, or asks for spot again
    new = [a["handle"]["pod"] for a in st["attempts"][1:]]
    assert all(p in new or "-probe-" in p for p in live), (live, new)
    assert len(new) <= 1 and (st["current"] in (None, 1))
