"""Preemptions produced by the real controllers (issue 20), each classified by the real
``classify()`` from what the real API server returns: pod GC after a node is deleted, the
node lifecycle controller and taint manager after heartbeats stop, a drain through the
Eviction API (a spot interruption, told apart from consolidation), a graceful node shutdown
written by our kubelet, and priority preemption by the real scheduler."""

from __future__ import annotations

import time

from airflow_spot.backends.base import Outcome, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.testing.cluster.looks import wait_ended, wait_running

IDENT = TaskIdentity("nightly_train", "train", "manual__2026-01-01T00:00:00+00:00")
SLEEP = ["sleep", "600"]


def backend(cluster) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1",
        config_file=cluster.kubeconfig,
        namespace=cluster.namespace,
        preset="karpenter",
        gpus=1,
        pending_timeout_s=120.0,
    )


def running(b: KubernetesBackend, capacity: str = "spot", attempt: int = 1):
    h = b.launch(IDENT, attempt, capacity, SLEEP, checkpoint_uri="file:///tmp/x")
    return h, wait_running(b, h)


def ended(b: KubernetesBackend, h, timeout: float = 90.0):
    return wait_ended(b, h, timeout)


def disruption(api, ns: str, name: str, timeout: float = 90.0) -> str | None:
    """The pod's DisruptionTarget reason as the real controllers wrote it (None: pod gone)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        try:
            pod = api.read_namespaced_pod(name, ns)
        except Exception:  # noqa: BLE001 - 404: gone
            return None
        for c in pod.status.conditions or []:
            if c.type == "DisruptionTarget" and c.status == "True":
                return c.reason
        time.sleep(0.25)
    raise AssertionError(f"no DisruptionTarget on {name} in {timeout} s")


def test_a_deleted_spot_node_is_a_preemption_via_pod_gc(kube_cluster) -> None:
    """The spot node object is deleted: the real pod GC marks the orphaned pod
    ``DeletionByPodGC`` and force-deletes it (after its 40 s quarantine); the backend calls it
    a preemption, whether it reads the condition or the 404."""
    b = backend(kube_cluster)
    h, node = running(b)
    kube_cluster.kubelet.reclaim(node, "delete")
    st = ended(b, h, timeout=120)
    assert st.outcome is Outcome.PREEMPTED, st
    assert any("DeletionByPodGC" in e or "node" in e for e in map(str, st.evidence.values())), st


def test_stopped_heartbeats_are_a_preemption_via_the_taint_manager(kube_cluster) -> None:
    """The node stops renewing its lease: the real node lifecycle controller marks it
    NotReady and taints it ``unreachable:NoExecute``, the taint manager evicts the pod
    (``DeletionByTaintManager``) after the default toleration, and the backend calls it a
    preemption on spot."""
    b = backend(kube_cluster)
    h, node = running(b)
    kube_cluster.kubelet.reclaim(node, "unreachable")
    assert disruption(b.api.core, b.namespace, h.pod) == "DeletionByTaintManager"
    # The controller adds unreachable twice, NoSchedule and NoExecute: keep both pairs.
    taints = {(t.key, t.effect) for t in b.api.core.read_node(node).spec.taints or []}
    assert ("node.kubernetes.io/unreachable", "NoExecute") in taints, taints
    st = ended(b, h)
    assert st.outcome is Outcome.PREEMPTED, st
    assert "DeletionByTaintManager" in str(st.evidence) or "unreachable" in st.reason, st


def test_a_spot_interruption_drain_is_a_preemption(kube_cluster) -> None:
    """Karpenter's interruption: the node's SpotInterrupted event and disrupted taint, then
    an eviction through the real Eviction API (``EvictionByEvictionAPI``); the notice is
    relayed to the pod and the attempt is a preemption."""
    b = backend(kube_cluster)
    h, node = running(b)
    kube_cluster.kubelet.reclaim(node, "drain")
    st = ended(b, h)
    assert st.outcome is Outcome.PREEMPTED, st
    assert "EvictionByEvictionAPI" in str(st.evidence) or "drain" in st.reason, st
    assert h.notice_sent, "the interruption notice was not relayed to the pod"


def test_a_consolidation_eviction_is_not_a_preemption(kube_cluster) -> None:
    """The same eviction with only Karpenter's disrupted taint (consolidation: no interruption
    event) is an infrastructure disruption, not a spot reclaim."""
    b = backend(kube_cluster)
    h, node = running(b)
    b.api.core.patch_node(
        node, {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}
    )
    kube_cluster.kubelet.evict(h.pod, b.namespace)
    assert disruption(b.api.core, b.namespace, h.pod, timeout=30) in ("EvictionByEvictionAPI", None)
    st = ended(b, h)
    assert st.outcome is Outcome.INFRA_DISRUPTION, st


def test_a_graceful_node_shutdown_is_a_preemption(kube_cluster) -> None:
    """Our kubelet's graceful node shutdown status (``TerminationByKubelet``, reason
    ``Terminated``, the kubelet's message), accepted by the real API server, is a preemption."""
    b = backend(kube_cluster)
    h, node = running(b)
    kube_cluster.kubelet.reclaim(node, "shutdown")
    st = ended(b, h)
    assert st.outcome is Outcome.PREEMPTED, st
    assert "shutdown" in st.reason, st


def test_priority_preemption_by_the_scheduler_is_not_a_spot_reclaim(kube_cluster) -> None:
    """A higher-priority pod needs the only GPU: the real scheduler preempts ours
    (``PreemptionByScheduler``); that is an infrastructure disruption, never a spot reclaim."""
    from kubernetes import client

    k = kube_cluster.kubelet
    k.autoscale = False
    node = k.add_node("one-gpu-spot", {"karpenter.sh/capacity-type": "spot"}, gpus=1)
    k.wait_ready(node)
    b = backend(kube_cluster)
    h, on = running(b)
    assert on == node
    sched = client.SchedulingV1Api(k.api.api_client)
    try:
        sched.create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name="urgent-test"), value=100000)
        )
    except client.ApiException as e:
        assert e.status == 409
    urgent = {
        "metadata": {"name": "urgent"},
        "spec": {
            "priorityClassName": "urgent-test",
            "nodeSelector": {"karpenter.sh/capacity-type": "spot"},
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "command": ["sleep", "60"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    until = time.monotonic() + 10
    while True:  # the priority admission plugin sees a new PriorityClass through its informer
        try:
            b.api.core.create_namespaced_pod(b.namespace, urgent)
            break
        except client.ApiException as e:
            if e.status != 403 or time.monotonic() > until:
                raise
            time.sleep(0.2)
    assert disruption(b.api.core, b.namespace, h.pod, timeout=60) in ("PreemptionByScheduler", None)
    st = ended(b, h)
    assert st.outcome is Outcome.INFRA_DISRUPTION, st
    assert "scheduler" in st.reason or "PreemptionByScheduler" in str(st.evidence), st


def test_a_pod_nobody_renews_checkpoints_and_stops_by_itself(kube_cluster, tmp_path) -> None:
    """The pod's lease annotation, read in the container through the downward API, runs out
    with nobody renewing it: the training checkpoints and exits 143, and the attempt is an
    infrastructure disruption ("lease expired"), never an application failure; a renewal
    (``renew_lease``) moves the annotation on the real API server."""
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store
    from airflow_spot.testing import train_command

    b = backend(kube_cluster)
    ckpt = tmp_path / "ckpt"
    h = b.launch(
        IDENT,
        1,
        "on_demand",
        train_command(100_000, step_seconds=0.01, save_every=10_000),
        checkpoint_uri=str(ckpt),
        lease_until=time.time() + 4.0,
    )
    b.renew_lease(h, time.time() + 5.0)  # one renewal, then nobody looks
    ann = b.api.core.read_namespaced_pod(h.pod, b.namespace).metadata.annotations
    assert float(ann["airflow-spot/lease-until"]) > time.time() + 4.0
    st = ended(b, h, timeout=60)
    assert st.outcome is Outcome.INFRA_DISRUPTION and "lease expired" in st.reason, st
    assert st.exit_code == 143
    latest = Checkpoints(open_store(str(ckpt))).latest_valid()
    assert latest is not None and 0 < latest.step < 100_000
