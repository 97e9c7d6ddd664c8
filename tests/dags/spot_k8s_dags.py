"""A DAG the Kubernetes tests run with dag.test(), against the fake API server and cloud or
the real control plane (``SPOT_K8S_*`` settings from the test's environment)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

ROOT = os.environ.get("SPOT_K8S_DIR", "/tmp/airflow-spot-k8s")
KUBECONFIG = os.environ.get("SPOT_K8S_KUBECONFIG", ROOT + "/kubeconfig")
STEPS = int(os.environ.get("SPOT_K8S_STEPS", "200"))

with DAG(
    "spot_k8s", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False
) as k8s_dag:
    SpotTrainingOperator(
        task_id="train",
        command=os.environ.get("SPOT_K8S_COMMAND", "").split("|")
        if os.environ.get("SPOT_K8S_COMMAND")
        else train_command(STEPS, step_seconds=0.05, save_every=5, seed=7),
        checkpoint_uri=ROOT + "/ckpt/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        expected_compute=timedelta(seconds=STEPS * 0.05),
        total_steps=STEPS,
        deadline=timedelta(seconds=float(os.environ.get("SPOT_K8S_DEADLINE_S", "30"))),
        changeover=timedelta(seconds=0.5),
        policy=os.environ.get("SPOT_K8S_POLICY", "deadline_aware"),
        max_failures=int(os.environ.get("SPOT_K8S_MAX_FAILURES", "1")),
        backend=KubernetesBackend(
            image="ghcr.io/airflow-spot/train:test",
            # a Kubernetes connection (the real-control-plane tests: a ServiceAccount token)
            kubernetes_conn_id=os.environ.get("SPOT_K8S_CONN_ID") or None,
            config_file=None if os.environ.get("SPOT_K8S_CONN_ID") else KUBECONFIG,
            namespace=os.environ.get("SPOT_K8S_NAMESPACE", "default"),
            preset="karpenter",
            gpus=1,
            spot_cooldown_s=float(os.environ.get("SPOT_K8S_COOLDOWN_S", "1")),
            pending_timeout_s=float(os.environ.get("SPOT_K8S_PENDING_S", "2")),
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.1,
        min_deferral=timedelta(0),  # the tests exercise the trigger path
    )
