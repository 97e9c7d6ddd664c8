"""``@task.spot_training`` on the real control plane: the decorated function runs in the
attempt's pod (our kubelet runs the container's command as a process), from the payload in
its command, with a session bound through the pod's environment; its return value comes back
through the checkpoint location into the task's XCom."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

NS = "ml-training"


def fit(session, seed: int):
    """Trains in the pod; says where it ran."""
    import os

    start, _ = session.resume()
    for step in range(start, session.total_steps):
        session.step_done(step + 1, lambda: {"w.txt": f"{seed}".encode()})
    return {"seed": seed, "capacity": os.environ.get("AIRFLOW_SPOT_CAPACITY")}


def test_the_decorated_function_runs_in_the_pod(
    kube_cluster, sa_kubeconfig, tmp_path: Path
) -> None:
    from airflow.sdk import DAG, task

    from airflow_spot.backends.kubernetes.backend import KubernetesBackend
    from airflow_spot.testing import FileTaskStateStore, make_context

    cfg, _ = sa_kubeconfig
    with DAG("spot_k8s_taskflow", schedule=None) as dag:
        task.spot_training(
            checkpoint_uri=str(tmp_path / "ckpt"),
            expected_compute=timedelta(seconds=2),
            total_steps=10,
            deadline="2m",
            changeover=timedelta(seconds=0.5),
            backend=KubernetesBackend(
                image="ghcr.io/airflow-spot/train:test",
                config_file=cfg,
                namespace=NS,
                preset="karpenter",
                gpus=1,
                pending_timeout_s=8.0,
            ),
            python=sys.executable,  # the image's interpreter: here, the kubelet's machine's
            decision_interval=timedelta(seconds=1),
            poll_interval=0.2,
            deferrable=False,
        )(fit)(seed=3)
    op = dag.get_task("fit")
    summary = op.execute(make_context(FileTaskStateStore(tmp_path / "state.json")))
    assert summary["result"] == {"seed": 3, "capacity": "spot"}, summary
    assert summary["final_checkpoint"]["step"] == 10
    assert op.command[:3] == [sys.executable, "-m", "airflow_spot.decorators.entry"]
    assert [a["capacity"] for a in summary["attempts"]] == ["spot"]
