"""A gang DAG on the real control plane (issue 36): ``SpotTrainingOperator`` with
``KubernetesBackend(nodes=2)``, deferring between its turns to its trigger (serialised, rebuilt
from JSON and run to its event, as the triggerer does), reaching the cluster through an Airflow
Kubernetes connection that holds docker/rbac.yaml's ServiceAccount token (Jobs and Services
included), two real JAX ranks per attempt. The test cloud has as many spot nodes as a count
trace says: two, then one (a rank's node reclaimed: the gang is preempted, and a spot gang
launched then finds one node of two, a partial gang deleted at its timeout), then two again
while the job trains on demand: the return to spot is make-before-break for the whole gang.
The deadline is met."""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import jax  # noqa: F401 - the gang extra: never skipped

from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context

NS = "ml-training"
STEPS = 600  # 30 s of work at 0.05 s a step
GANG_TIMEOUT_S = 8.0
# (seconds after the first Job, spot nodes): one node goes once the gang has trained a few
# seconds; spot stays short of two long enough that uniform progress falls behind its line
# (the gang's work is a quarter of the deadline) and falls back, and comes back while the
# on-demand gang still has a third of the work to do
TRACE = [(0.0, 2), (8.0, 1), (34.0, 2)]


def _operator(tmp_path: Path, conn_id: str):
    from airflow_spot.backends.kubernetes.backend import KubernetesBackend
    from airflow_spot.operators import SpotTrainingOperator

    return SpotTrainingOperator(
        task_id="train",
        command=[
            sys.executable,
            "-m",
            "airflow_spot.examples.train_ddp",
            "--steps",
            str(STEPS),
            "--step-seconds",
            "0.05",
            "--save-every",
            "10",
            "--seed",
            "7",
        ],  # fmt: skip
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=STEPS * 0.05),
        total_steps=STEPS,
        deadline=timedelta(seconds=120),
        changeover=timedelta(seconds=4),
        policy="uniform_progress",
        nodes=2,
        backend=KubernetesBackend(
            image="ghcr.io/airflow-spot/train:test",
            kubernetes_conn_id=conn_id,
            namespace=NS,
            preset="karpenter",
            gpus=1,
            nodes=2,
            spot_cooldown_s=1,
            pending_timeout_s=GANG_TIMEOUT_S,
            gang_timeout_s=GANG_TIMEOUT_S,
            gang_settle_s=10,
            grace_period_s=10,
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.2,
        min_deferral=timedelta(0),
    )


def run_deferring(op, context) -> dict:
    """Run the operator as Airflow would with a triggerer: each deferral's trigger is
    serialised, rebuilt from its JSON and run until its event, which resumes the operator."""
    from airflow.sdk.exceptions import TaskDeferred

    async def first_event(trigger):
        async for ev in trigger.run():
            return ev.payload
        raise AssertionError("the trigger ended without an event")

    call = functools.partial(op.execute, context)
    while True:
        try:
            return call()
        except TaskDeferred as d:
            path, kwargs = d.trigger.serialize()
            module, name = path.rsplit(".", 1)
            rebuilt = getattr(importlib.import_module(module), name)(
                **json.loads(json.dumps(kwargs))
            )
            payload = asyncio.run(first_event(rebuilt))
            call = functools.partial(getattr(op, d.method_name), context, payload)


def _follow_from_first_job(k, stop: threading.Event) -> None:
    """The count trace starts when the first gang is made."""
    from kubernetes import client

    batch = client.BatchV1Api(k.api.api_client)
    while not stop.is_set() and not batch.list_namespaced_job(NS).items:
        time.sleep(0.1)
    if not stop.is_set():
        k.follow(TRACE, how="delete", seed=3)


def test_a_gang_dag_meets_its_deadline_through_reclaims_fallback_and_return(
    kube_cluster, sa_kubeconfig, tmp_path: Path, monkeypatch
) -> None:
    """At least one gang preemption, one fallback to on-demand and one make-before-break
    return of the whole gang (both spot ranks ready before the on-demand gang stopped, no
    step lost), no partial gang billed past its timeout, the deadline met."""
    cfg, _ = sa_kubeconfig
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": cfg, "namespace": NS}}
    monkeypatch.setenv("AIRFLOW_CONN_SPOT_K8S_GANG", json.dumps(conn))
    k, stop = kube_cluster.kubelet, threading.Event()
    market = threading.Thread(target=_follow_from_first_job, args=(k, stop), daemon=True)
    market.start()
    store = FileTaskStateStore(tmp_path / "state.json")
    try:
        run_deferring(_operator(tmp_path, "spot_k8s_gang"), make_context(store))
    finally:
        stop.set()
        market.join(5)
        k.stop_trace()
    st = store.get(STATE_KEY)
    rows = [
        (a["attempt"], a["capacity"], a["outcome"], a["reason"][:90], a.get("handed_to"))
        for a in st["attempts"]
    ]
    assert st.get("failed") is None and st.get("finished"), (st.get("failed"), rows, k.errors)
    summary = st["finished"]
    assert summary["deadline_met"] is True and summary["nodes"] == 2, rows
    outcomes = [a["outcome"] for a in st["attempts"]]
    assert st["preemptions"] >= 1 and "preempted" in outcomes, rows
    assert summary["fallbacks_to_on_demand"] >= 1, rows
    handed = [a for a in st["attempts"] if a.get("handed_to")]
    assert len(handed) == 1, rows
    od = handed[0]
    spot = next(a for a in st["attempts"] if a["attempt"] == od["handed_to"])
    assert od["capacity"] == "on_demand" and spot["capacity"] == "spot", rows
    assert spot["ready_at"] <= od["ended_at"] <= spot["started_at"]  # N ready, then the switch
    assert spot["step_start"] == od["ckpt_step_end"] > 0  # no step lost
    assert st["attempts"][-1]["outcome"] == "succeeded"
    assert all(len(a["ranks"]) == 2 for a in st["attempts"] if a.get("ranks") is not None)
    for a in st["attempts"]:  # no partial gang holds nodes past its timeout
        if a["outcome"] in ("spot_unavailable", "cancelled") and a["capacity"] == "spot":
            assert (
                a["granted_at"] is None and a["ended_at"] - a["launched_at"] <= GANG_TIMEOUT_S + 3
            ), rows
