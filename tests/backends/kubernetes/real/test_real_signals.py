"""The cluster's own signals of spot capacity, as objects the real API server stores (issue
20): a Karpenter ``InsufficientCapacityError`` event on a NodeClaim and cluster-autoscaler's
``kube-system/cluster-autoscaler-status`` ConfigMap in Backoff are accepted as shaped and
read as "spot down"; a quiet cluster says nothing; a probe on the real scheduler binds to a
Ready spot node ("up") and, once dropped, its node goes back."""

from __future__ import annotations

import contextlib
import time
import uuid

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.testing.cluster.autoscaler import autoscaler_status

IDENT = TaskIdentity("nightly_train", "train", "manual__2026-01-01T00:00:00+00:00")


def backend(cluster) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1",
        config_file=cluster.kubeconfig,
        namespace=cluster.namespace,
        preset="karpenter",
        gpus=1,
    )


def ice_event(zone: str = "eu-west-3b") -> dict:
    claim = f"default-{uuid.uuid4().hex[:5]}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "metadata": {"name": f"{claim}.{uuid.uuid4().hex[:16]}"},
        "reason": "InsufficientCapacityError",
        "type": "Warning",
        "message": f"NodeClaim {claim} event: insufficient capacity, with fleet error(s), "
        "InsufficientInstanceCapacity: We currently do not have sufficient g4dn.xlarge "
        f"capacity in the Availability Zone you requested ({zone}).",
        "involvedObject": {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "name": claim,
            "uid": str(uuid.uuid4()),
        },
        "source": {"component": "karpenter"},
        "reportingComponent": "karpenter",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
    }


def test_a_quiet_cluster_says_nothing_then_an_ice_and_a_backoff_say_down(kube_cluster) -> None:
    """No node, no event: no signal (unknown, not up). A Karpenter ICE event and the
    autoscaler's Backoff, created on the real API server as those components write them,
    are each read as spot down."""
    kube_cluster.kubelet.autoscale = False
    b = backend(kube_cluster)
    assert b.spot_signals(time.time()) == []
    api = kube_cluster.api
    event = api.create_namespaced_event("default", ice_event())
    body = autoscaler_status("eks-gpu-spot", backoff=True)
    try:
        sources = {s.source: s.up for s in b.spot_signals(time.time())}
        assert sources.get("karpenter") is False, sources
        api.create_namespaced_config_map("kube-system", body)
        sources = {s.source: s.up for s in b.spot_signals(time.time())}
        assert sources.get("autoscaler") is False, sources
    finally:  # neither may speak for spot in a later test
        api.delete_namespaced_event(event.metadata.name, "default")
        with contextlib.suppress(Exception):
            api.delete_namespaced_config_map("cluster-autoscaler-status", "kube-system")


def test_a_probe_binds_on_the_real_scheduler_and_its_node_goes_back(kube_cluster) -> None:
    """The probe pod (priority -10, the training pod's placement and GPU) is admitted and
    scheduled by the real components onto the spot node made for it: spot up; dropped, its
    node is given back."""
    from kubernetes import client

    from airflow_spot.backends.kubernetes.probe import build_priority_class

    sched = client.SchedulingV1Api(kube_cluster.api.api_client)
    try:
        sched.create_priority_class(build_priority_class())
    except client.ApiException as e:
        assert e.status == 409
    b = backend(kube_cluster)
    probe = b.probe(IDENT)
    until = time.monotonic() + 30
    while (sig := b.probe_signal(probe, time.time())) is None:
        assert time.monotonic() < until, "the probe never answered"
        time.sleep(0.2)
    assert sig.up is True and sig.source == "probe", sig
    pod = kube_cluster.api.read_namespaced_pod(probe["name"], kube_cluster.namespace)
    assert pod.spec.priority == -10 and pod.spec.node_name
    node = pod.spec.node_name
    b.drop_probe(probe)
    until = time.monotonic() + 30
    while node not in kube_cluster.kubelet.released:
        assert time.monotonic() < until, "the probe's node was not given back"
        time.sleep(0.2)
