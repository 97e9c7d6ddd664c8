"""The operator's whole loop on a Kubernetes API over HTTP (an in-memory API server, the only
stand-in: no real cluster can run here) with a kubelet/cloud simulator that runs each pod's
command as a real process and injects each preemption signal."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from airflow_spot.testing_kube import FakeCloud, FakeKube

pytestmark = pytest.mark.usefixtures("airflow_db")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch):
    kube = FakeKube().start()
    kube.emulator.log_root = tmp_path / "nodes"  # pods/log serves FakeCloud's container logs
    cfg = kube.kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("SPOT_K8S_DIR", str(tmp_path))
    monkeypatch.setenv("SPOT_K8S_KUBECONFIG", cfg)
    clouds: list[FakeCloud] = []

    def make(**kw) -> FakeCloud:
        cloud = FakeCloud(cfg, tmp_path / "nodes", **kw).start()
        clouds.append(cloud)
        return cloud

    yield make
    for c in clouds:
        c.stop()
    kube.stop()


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
    sys.path.insert(0, str(Path(__file__).parents[2] / "dags"))
    try:
        mod = importlib.reload(importlib.import_module("spot_k8s_dags"))
    finally:
        sys.path.pop(0)
    return mod.k8s_dag.test()


@pytest.mark.parametrize(
    "signals", [("karpenter", "graceful_shutdown", "vanish"), ("nth", "pod_gc", "taint_manager")]
)
def test_preempted_by_each_signal_resumes_and_falls_back(cluster, monkeypatch, signals) -> None:
    """Three spot pods are reclaimed, each by a different signal; each attempt resumes from the
    checkpoint; spot then stays unavailable and the job finishes on an on-demand pod on time."""
    cloud = cluster(
        plan={i + 1: (sig, 1.5) for i, sig in enumerate(signals)}, spot_gone_after_plan=True
    )
    monkeypatch.setenv("SPOT_K8S_DEADLINE_S", "24")
    dr = _run_dag()
    st = _state(dr.run_id)
    assert dr.state == "success", st.get("failed")
    assert [s for _, s in cloud.injected] == list(signals)
    summary = st["finished"]
    assert summary["preemptions"] == 3 and summary["deadline_met"] is True, [
        (a["capacity"], a["outcome"], a["reason"]) for a in summary["attempts"]
    ]
    # spot returns asked make-before-break while spot stayed down never got a node (they
    # ended spot_unavailable, or were called off, while on-demand trained on): none trained
    returns = [
        a
        for a in summary["attempts"]
        if a["outcome"] in ("spot_unavailable", "cancelled") and a["start_h"] is None
    ]
    assert all(a["capacity"] == "spot" for a in returns)
    attempts = [a for a in summary["attempts"] if a not in returns]
    assert [a["outcome"] for a in attempts[:3]] == ["preempted"] * 3
    assert attempts[-1]["capacity"] == "on_demand" and attempts[-1]["outcome"] == "succeeded"
    for before, after in zip(attempts, attempts[1:], strict=False):
        assert (
            after["step_start"] == before["checkpoint_step_end"] > 0
        )  # resumed from the checkpoint
    if "karpenter" in signals or "nth" in signals:  # the notice was relayed: nothing lost
        assert attempts[0]["step_end"] == attempts[0]["checkpoint_step_end"]


def test_application_failure_on_a_pod_spends_the_failure_budget(
    cluster, monkeypatch, capfd, caplog
) -> None:
    """A container that exits 3 on a healthy node is an application failure, never a preemption
    (though the scheduler's FailedScheduling event on the pod speaks of preemption); its log
    tail is read before the pod is deleted."""
    cluster()
    monkeypatch.setenv(
        "SPOT_K8S_COMMAND",
        f"{sys.executable}|-c|import sys; print('loss is NaN at step 7', flush=True); sys.exit(3)",
    )
    monkeypatch.setenv("SPOT_K8S_MAX_FAILURES", "1")
    dr = _run_dag()
    st = _state(dr.run_id)
    assert dr.state == "failed"
    assert st["failed"]["error"] == "FailureBudgetExhausted"
    assert st["failures"] == 2 and st["preemptions"] == 0
    assert all(a["outcome"] == "app_failure" and a["exit_code"] == 3 for a in st["attempts"])
    out = capfd.readouterr()
    assert "Log tail:\nloss is NaN at step 7" in caplog.text + out.out + out.err
