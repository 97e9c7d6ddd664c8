"""Our pods on the real kube-scheduler and kube-apiserver (issue 20): each preset's spot and
on-demand pods land on nodes of the right capacity type and never on the wrong one; a pod
that fits nowhere stays Pending Unschedulable with the scheduler's own event; every pod shape
we build is admitted, server-side dry-run included."""

from __future__ import annotations

import time

import pytest

from airflow_spot.backends.base import State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.pods import attempt_pod

POOLS = {  # preset -> (spot node labels, spot taints, on-demand node labels)
    "eks": (
        {"eks.amazonaws.com/capacityType": "SPOT"},
        [],
        {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
    ),
    "karpenter": (
        {"karpenter.sh/capacity-type": "spot"},
        [],
        {"karpenter.sh/capacity-type": "on-demand"},
    ),
    "gke": (
        {"cloud.google.com/gke-spot": "true"},
        [{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}],
        {"cloud.google.com/gke-nodepool": "default-pool"},
    ),
    "aks": (
        {"kubernetes.azure.com/scalesetpriority": "spot"},
        [{"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}],
        {"kubernetes.azure.com/agentpool": "system"},
    ),
}


def ident(task: str = "train", map_index: int = -1) -> TaskIdentity:
    return TaskIdentity("nightly_train", task, "manual__2026-01-01T00:00:00+00:00", map_index)


def backend(cluster, preset: str = "karpenter", **kw) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1",
        config_file=cluster.kubeconfig,
        namespace=cluster.namespace,
        preset=preset,
        gpus=1,
        pending_timeout_s=kw.pop("pending_timeout_s", 60.0),
        **kw,
    )


def wait_bound(api, ns: str, name: str, timeout: float = 30.0):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        pod = api.read_namespaced_pod(name, ns)
        if pod.spec.node_name:
            return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {name} was not scheduled in {timeout} s")


@pytest.mark.parametrize("preset", sorted(POOLS))
def test_each_presets_pods_land_on_their_capacity_type(kube_cluster, preset) -> None:
    """With one spot and one on-demand node of the preset's shape, the real scheduler puts
    the spot attempt on the spot node and the on-demand attempt on the other, three times
    over (never the wrong one)."""
    k = kube_cluster.kubelet
    k.autoscale = False
    spot_labels, taints, od_labels = POOLS[preset]
    spot = k.add_node(f"{preset}-spot", spot_labels, taints, gpus=4)
    od = k.add_node(f"{preset}-od", od_labels, gpus=4)
    k.wait_ready(spot), k.wait_ready(od)
    b = backend(kube_cluster, preset)
    cmd = ["sleep", "30"]
    placed = []
    for attempt in range(1, 7):
        cap = "spot" if attempt % 2 else "on_demand"
        h = b.launch(ident(f"t{attempt}"), attempt, cap, cmd, checkpoint_uri="file:///tmp/x")
        placed.append((cap, wait_bound(k.api, kube_cluster.namespace, h.pod).spec.node_name))
    assert placed == [("spot", spot), ("on_demand", od)] * 3


def test_a_pod_with_no_matching_node_stays_unschedulable(kube_cluster) -> None:
    """Only on-demand nodes: the spot pod stays Pending with PodScheduled=False/Unschedulable
    and the scheduler's own FailedScheduling event, which the backend reads as spot not yet
    available (pending), never as a preemption."""
    k = kube_cluster.kubelet
    k.autoscale = False
    k.wait_ready(k.add_node("only-od", {"karpenter.sh/capacity-type": "on-demand"}))
    b = backend(kube_cluster)
    h = b.launch(ident(), 1, "spot", ["sleep", "30"], checkpoint_uri="file:///tmp/x")
    ns = kube_cluster.namespace
    until = time.monotonic() + 30
    events = []
    while time.monotonic() < until:
        events = [
            e
            for e in k.api.list_namespaced_event(ns).items
            if e.involved_object.name == h.pod and e.reason == "FailedScheduling"
        ]
        if events:
            break
        time.sleep(0.2)
    assert events, "no FailedScheduling event from the scheduler"
    ev = events[0]
    assert ev.type == "Warning" and "didn't match Pod's node affinity/selector" in ev.message
    assert (ev.reporting_component or ev.source.component) == "default-scheduler"
    # the scheduler writes its event and the pod's condition apart: the condition may lag
    until, conditions = time.monotonic() + 10, None
    while time.monotonic() < until and not conditions:
        pod = k.api.read_namespaced_pod(h.pod, ns)
        conditions = pod.status.conditions
        time.sleep(0.1)
    sched = next(c for c in conditions or () if c.type == "PodScheduled")
    assert (pod.status.phase, sched.status, sched.reason) == ("Pending", "False", "Unschedulable")
    st = b.status(h)
    assert st.state is State.WAITING and st.outcome is None, st  # spot not had yet


TEMPLATE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "labels": {"team": "ml", "cost-center": "r-and-d"},
        "annotations": {"example.com/owner": "ml-team"},
    },
    "spec": {
        "priorityClassName": "",
        "containers": [
            {
                "name": "base",
                "image": "ignored:1",
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            },
            {"name": "log-shipper", "image": "fluent/fluent-bit:3", "args": ["-q"]},
        ],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}}],
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
        ],
    },
}


@pytest.mark.parametrize(
    ("preset", "capacity", "task", "map_index", "template", "hold"),
    [
        ("karpenter", "spot", "train", -1, None, False),
        ("karpenter", "on_demand", "train", 3, None, False),
        ("eks", "spot", "a" * 200, 1023, None, False),
        ("gke", "spot", "sweep.lr_0.001", 7, TEMPLATE, False),
        ("aks", "on_demand", "Train_Big-Model", -1, TEMPLATE, False),
        ("karpenter", "spot", "train", 2, TEMPLATE, True),
    ],
)
def test_every_pod_shape_is_admitted(
    kube_cluster, preset, capacity, task, map_index, template, hold
) -> None:
    """The attempt pods we build (mapped-task names and labels, long task ids, pod templates
    merged with ours, make-before-break holds) pass the real API server's validation and
    admission: server-side dry-run, then a real create."""
    b = backend(kube_cluster, preset, pod_template=template)
    pod = attempt_pod(
        b,
        name=f"dry-{preset}-{map_index + 1}",
        labels={"airflow-spot/task-id": "x"},
        attempt=1,
        capacity=capacity,
        command=["python", "-m", "train"],
        checkpoint_uri="s3://bucket/ckpt",
        hold=hold,
    )
    api = kube_cluster.api
    dry = api.create_namespaced_pod(kube_cluster.namespace, pod, dry_run="All")
    assert dry.metadata.uid  # defaulted and validated by the server, not stored
    h = b.launch(
        ident(task, map_index),
        1,
        capacity,
        ["python", "-m", "train"],
        checkpoint_uri="s3://bucket/ckpt",
        hold=hold,
    )
    got = api.read_namespaced_pod(h.pod, kube_cluster.namespace)
    assert got.metadata.labels["airflow-spot/attempt"] == "1"
    if template:
        assert got.metadata.labels["team"] == "ml"
        assert [c.name for c in got.spec.containers][1:] == ["log-shipper"]
