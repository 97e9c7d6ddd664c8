"""The pure readers of what a cluster shows about spot: Karpenter ICE events, the autoscaler's
status ConfigMap and pod events, Ready spot nodes with a free GPU, and a probe pod. Shapes are
the API's own (raw camelCase JSON, and the python client's models for snake_case); messages
are real ones (``shared/research/capacity-signals.md``)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest
from kubernetes.client import models as k8s

from airflow_spot.backends.kubernetes.probe import (
    PRIORITY_CLASS,
    PROBE_IMAGE,
    SETTLE_S,
    build_priority_class,
    build_probe,
    read_probe,
)
from airflow_spot.backends.kubernetes.signals import (
    autoscaler_event_signals,
    autoscaler_status_signals,
    free_gpus,
    gpu_request,
    group_pool,
    karpenter_signals,
    node_signal,
    parse_ice,
    pod_pool,
)
from airflow_spot.backends.signals import SpotSignal
from airflow_spot.testing.cluster.autoscaler import autoscaler_status

T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC).timestamp()
ICE_MSG = (
    "NodeClaim default-x7k2p event: insufficient capacity, with fleet error(s), "
    "InsufficientInstanceCapacity: We currently do not have sufficient g4dn.xlarge capacity in "
    "the Availability Zone you requested (eu-west-3b). Our system will be working on "
    "provisioning additional capacity."
)
ICE_ALL = (
    "NodeClaim gpu-spot-q8w2n event: insufficient capacity, all requested instance types were "
    "unavailable during launch"
)
BACKOFF_MSG = (
    "pod didn't trigger scale-up: 1 in backoff after failed scale-up, 2 node(s) didn't match "
    "Pod's node affinity/selector"
)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ice_event(message: str = ICE_MSG, at: float = T0, claim: str = "default-x7k2p", **kw):
    """A Karpenter ICE event as the API server returns it (raw JSON)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{claim}.17f3a2b9c0d1e2f3", "namespace": "default"},
        "involvedObject": {
            "apiVersion": "karpenter.sh/v1",
            "kind": kw.get("kind", "NodeClaim"),
            "name": claim,
            "uid": "5b0d3c58-6a4e-4f0e-9d7e-2f3b1c8a9e10",
        },
        "reason": kw.get("reason", "InsufficientCapacityError"),
        "message": message,
        "source": {"component": "karpenter"},
        "firstTimestamp": iso(at - 30),
        "lastTimestamp": iso(at),
        "count": 2,
        "type": "Warning",
        "reportingComponent": "karpenter",
    }


def place(pool: str, selector: dict[str, str], gpus: int = 1, **spec) -> tuple[str, dict]:
    """(pool, the training pod a launch would create there) as API JSON."""
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return pool, {
        "spec": {
            "nodeSelector": selector,
            "containers": [{"name": "train", "resources": {"limits": limits}}],
            **spec,
        }
    }


SPOT = {"karpenter.sh/capacity-type": "spot"}
ZONE_A = place("zone-a", {**SPOT, "topology.kubernetes.io/zone": "eu-west-3a"})
ZONE_B = place("zone-b", {**SPOT, "topology.kubernetes.io/zone": "eu-west-3b"})


def test_an_ice_message_names_its_type_and_zone_when_it_has_them() -> None:
    assert parse_ice(ICE_MSG) == ("g4dn.xlarge", "eu-west-3b")
    assert parse_ice(ICE_ALL) == (None, None)


def test_a_karpenter_ice_is_spot_down_for_the_pool_of_its_zone_only() -> None:
    got = karpenter_signals([ice_event()], [ZONE_A, ZONE_B], T0 + 10)
    assert got == [
        SpotSignal(
            False,
            T0,
            "karpenter",
            "zone-b",
            "InsufficientCapacityError on NodeClaim default-x7k2p type=g4dn.xlarge zone=eu-west-3b",
        )
    ]


def test_an_ice_that_names_nothing_counts_for_every_spot_placement() -> None:
    got = karpenter_signals([ice_event(ICE_ALL, claim="gpu-spot-q8w2n")], [ZONE_A, ZONE_B], T0)
    assert [(s.pool, s.up, s.source) for s in got] == [
        ("zone-a", False, "karpenter"),
        ("zone-b", False, "karpenter"),
    ]


def test_an_ice_of_another_instance_type_or_nodepool_or_on_demand_is_not_ours() -> None:
    typed = place("t4", {**SPOT, "node.kubernetes.io/instance-type": "g5.xlarge"})
    assert karpenter_signals([ice_event()], [typed], T0) == []
    pinned = place("gpu", {**SPOT, "karpenter.sh/nodepool": "gpu-spot"})
    assert karpenter_signals([ice_event(ICE_MSG)], [pinned], T0) == []  # NodeClaim default-...
    assert [
        s.pool
        for s in karpenter_signals([ice_event(ICE_ALL, claim="gpu-spot-q8w2n")], [pinned], T0)
    ] == ["gpu"]
    on_demand = ice_event("NodeClaim default-x7k2p event: insufficient capacity for on-demand")
    assert karpenter_signals([on_demand], [ZONE_B], T0) == []


def test_a_quiet_karpenter_says_nothing_and_other_events_are_not_ice() -> None:
    """Karpenter forgets an ICE after 3 min: then spot is unknown, never up."""
    assert karpenter_signals([ice_event()], [ZONE_B], T0 + 179)
    assert karpenter_signals([ice_event()], [ZONE_B], T0 + 181) == []
    assert karpenter_signals([ice_event(reason="Launched")], [ZONE_B], T0) == []
    assert karpenter_signals([ice_event(kind="Node")], [ZONE_B], T0) == []


def test_the_clients_snake_case_models_read_the_same() -> None:
    ev = k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(name="default-x7k2p.1", namespace="default"),
        involved_object=k8s.V1ObjectReference(kind="NodeClaim", name="default-x7k2p"),
        reason="InsufficientCapacityError",
        message=ICE_MSG,
        last_timestamp=datetime.fromtimestamp(T0, UTC),
        type="Warning",
    )
    assert [s.pool for s in karpenter_signals([ev], [ZONE_A, ZONE_B], T0)] == ["zone-b"]


def test_several_ices_give_the_newest_per_pool() -> None:
    got = karpenter_signals([ice_event(at=T0 - 60), ice_event(at=T0)], [ZONE_B], T0)
    assert [s.at for s in got] == [T0]


# -- cluster-autoscaler ----------------------------------------------------------------------
def test_node_groups_map_to_pools_by_name() -> None:
    assert group_pool("eks-gpu-spot-2a-5ec6a3b1-1f2e", ["gpu-spot-2a", "gpu-spot"]) == "gpu-spot-2a"
    gke = "https://www.googleapis.com/compute/v1/projects/p/zones/asia-southeast1-a/instanceGroups/gke-c-gpu-pool-98cd300e-grp"
    assert group_pool(gke, ["gpu-pool"]) == "gpu-pool"
    assert group_pool("eks-cpu-ondemand-2a", ["gpu-spot"]) is None
    assert group_pool("eks-gpu-spot-2a", [""]) == ""  # no pools: a "spot" group is the preset's
    assert group_pool("eks-gpu-ondemand", [""]) is None
    assert group_pool("eks-spotless", [""]) is None  # a whole word only


def test_an_autoscaler_backoff_is_spot_down_at_its_last_update() -> None:
    cm = autoscaler_status("eks-gpu-spot-2a-5ec6a3b1", backoff=True, at=T0)
    (s,) = autoscaler_status_signals(cm, [""], T0 + 20)
    assert (s.up, s.at, s.source, s.pool) == (False, T0, "autoscaler", "")
    assert "placeholder-cannot-be-fulfilled" in s.detail
    assert autoscaler_status_signals(cm, ["cpu-spot"], T0) == []  # not a pool of ours
    assert autoscaler_status_signals(cm, [""], T0 + 1801) == []  # no backoff lasts so long


def test_other_scale_up_states_and_old_or_broken_statuses_say_nothing() -> None:
    assert (
        autoscaler_status_signals(autoscaler_status("eks-gpu-spot-2a", False, T0), [""], T0) == []
    )
    old = {
        "metadata": {
            "annotations": {
                "cluster-autoscaler.kubernetes.io/last-updated": "2021-10-19 19:06:41.612291737 +0000 UTC"
            }
        },
        "data": {
            "status": "Cluster-autoscaler status at 2021-10-19 19:06:41.612291737 +0000 UTC:\n"
            "Cluster-wide:\n  Health:      Healthy (ready=4 unready=0 notStarted=0 longNotStarted=0 registered=4 longUnregistered=0)\n"
            "NodeGroups:\n  Name:        eks-gpu-spot-2a\n  ScaleUp:     Backoff (ready=0 cloudProviderTarget=0)\n"
        },
    }
    assert autoscaler_status_signals(old, [""], T0) == []
    assert autoscaler_status_signals({"data": {"status": "a: [b"}}, [""], T0) == []
    assert autoscaler_status_signals({"data": {}}, [""], T0) == []


def test_a_backoff_without_the_annotation_is_dated_by_its_transition() -> None:
    cm = autoscaler_status("eks-gpu-spot-2a", backoff=True, at=T0)
    del cm["metadata"]["annotations"]
    (s,) = autoscaler_status_signals(cm, [""], T0)
    assert s.at == T0


def pod_event(reason: str, message: str, name: str = "train-1a2b3c4d-a1", at: float = T0) -> dict:
    return {
        "metadata": {"name": f"{name}.1843c5d2e1f0a9b8", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": "default", "apiVersion": "v1"},
        "reason": reason,
        "message": message,
        "source": {"component": "cluster-autoscaler"},
        "lastTimestamp": iso(at),
        "type": "Normal",
    }


def test_a_backoff_event_on_our_spot_pod_is_down_and_a_scale_up_says_nothing() -> None:
    ours = {"train-1a2b3c4d-a1": "zone-b"}
    (s,) = autoscaler_event_signals([pod_event("NotTriggerScaleUp", BACKOFF_MSG)], ours, T0 + 5)
    assert (s.up, s.source, s.pool) == (False, "autoscaler", "zone-b")
    triggered = pod_event(
        "TriggeredScaleUp", "pod triggered scale-up: [{eks-gpu-spot-2a 0->1 (max: 3)}]"
    )
    no_fit = pod_event(
        "NotTriggerScaleUp",
        "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector",
    )
    assert autoscaler_event_signals([triggered, no_fit], ours, T0) == []
    other = pod_event("NotTriggerScaleUp", BACKOFF_MSG, name="someone-elses")
    assert autoscaler_event_signals([other], ours, T0) == []
    assert (
        autoscaler_event_signals([pod_event("NotTriggerScaleUp", BACKOFF_MSG)], ours, T0 + 301)
        == []
    )


def test_our_pods_are_matched_to_their_pool() -> None:
    probe = {"metadata": {"labels": {"airflow-spot/pool": "zone-a"}}, "spec": {}}
    attempt = {
        "metadata": {"labels": {}},
        "spec": {"nodeSelector": ZONE_B[1]["spec"]["nodeSelector"]},
    }
    assert pod_pool(probe, [ZONE_A, ZONE_B]) == "zone-a"
    assert pod_pool(attempt, [ZONE_A, ZONE_B]) == "zone-b"
    assert pod_pool({"spec": {"nodeSelector": {"x": "y"}}}, [ZONE_A]) is None


# -- nodes -----------------------------------------------------------------------------------
def node(labels: dict[str, str], gpus: int = 4, ready: str = "True", **spec) -> dict:
    """A node as the API returns it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "ip-10-0-3-17.eu-west-3.compute.internal",
            "labels": {"kubernetes.io/os": "linux", **labels},
        },
        "spec": {"providerID": "aws:///eu-west-3b/i-0abc", **spec},
        "status": {
            "allocatable": {"cpu": "3920m", "memory": "15148980Ki", "nvidia.com/gpu": str(gpus)},
            "capacity": {"cpu": "4", "memory": "16069748Ki", "nvidia.com/gpu": str(gpus)},
            "conditions": [
                {
                    "type": "MemoryPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientMemory",
                },
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                },
            ],
        },
    }


def gpu_pod(gpus: int, phase: str = "Running") -> dict:
    return {
        "spec": {
            "containers": [
                {
                    "name": "x",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus)},
                        "requests": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ]
        },
        "status": {"phase": phase},
    }


B_NODE = {**SPOT, "topology.kubernetes.io/zone": "eu-west-3b"}


def test_a_ready_spot_node_of_the_pool_with_a_free_gpu_is_spot_up() -> None:
    pool, pod = ZONE_B
    s = node_signal(node(B_NODE), [gpu_pod(2), gpu_pod(1, "Succeeded")], pool, pod, T0)
    assert s is not None and (s.up, s.at, s.source, s.pool) == (True, T0, "node", "zone-b")
    assert "2 nvidia.com/gpu free" in s.detail
    assert free_gpus(node(B_NODE), [gpu_pod(2), gpu_pod(1, "Failed")]) == 2


@pytest.mark.parametrize(
    ("n", "pods"),
    [
        (node(B_NODE), [gpu_pod(4)]),  # all GPUs taken
        (node(B_NODE, ready="False"), []),
        (node(B_NODE, unschedulable=True), []),  # cordoned
        (node(B_NODE, taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]), []),
        (node({**B_NODE, "karpenter.sh/capacity-type": "on-demand"}), []),
        (node({**SPOT, "topology.kubernetes.io/zone": "eu-west-3a"}), []),  # another pool
        (node(B_NODE, gpus=0), []),
    ],
)
def test_a_node_that_cannot_take_the_job_says_nothing(n, pods) -> None:
    pool, pod = ZONE_B
    assert node_signal(n, pods, pool, pod, T0) is None


def test_spot_labels_of_each_cloud_and_taints_and_affinity_are_honoured() -> None:
    gke_taint = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
    tol = [
        {
            "key": "cloud.google.com/gke-spot",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ]
    gke = place("", {"cloud.google.com/gke-spot": "true"}, tolerations=tol)
    assert node_signal(
        node({"cloud.google.com/gke-spot": "true"}, taints=[gke_taint]), [], *gke, T0
    )
    untolerated = place("", {"cloud.google.com/gke-spot": "true"})
    assert (
        node_signal(
            node({"cloud.google.com/gke-spot": "true"}, taints=[gke_taint]), [], *untolerated, T0
        )
        is None
    )
    eks = place("", {"eks.amazonaws.com/capacityType": "SPOT"})
    assert node_signal(node({"eks.amazonaws.com/capacityType": "SPOT"}), [], *eks, T0)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["eu-west-3a"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    by_affinity = place("a", SPOT, affinity=affinity)
    assert node_signal(node(B_NODE), [], *by_affinity, T0) is None
    assert node_signal(
        node({**SPOT, "topology.kubernetes.io/zone": "eu-west-3a"}), [], *by_affinity, T0
    )
    custom = place("", {"pool": "cheap"})  # a custom preset: no capacity labels on its nodes
    assert node_signal(node({"pool": "cheap"}), [], *custom, T0)


def test_the_gpu_request_counts_containers_and_init_containers() -> None:
    pod = {
        "spec": {
            "containers": [gpu_pod(1)["spec"]["containers"][0]] * 2,
            "initContainers": [gpu_pod(3)["spec"]["containers"][0]],
        }
    }
    assert gpu_request(pod) == 3
    assert gpu_request({"spec": {"containers": [{"name": "x"}]}}) == 0


# -- probes ----------------------------------------------------------------------------------
def test_a_probe_has_the_training_pods_placement_and_gpus_and_nothing_else() -> None:
    tol = [
        {
            "key": "cloud.google.com/gke-spot",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ]
    _, training = place("zone-b", B_NODE, gpus=2, tolerations=tol, serviceAccountName="trainer")
    training["spec"]["containers"][0]["resources"]["limits"]["memory"] = "64Gi"
    probe = build_probe(
        training,
        name="train-1a2b3c4d-probe-9f8e7d",
        labels={"airflow-spot/task-id": "train"},
        pool="zone-b",
    )
    spec = probe["spec"]
    assert spec["nodeSelector"] == B_NODE and spec["tolerations"] == tol
    assert "serviceAccountName" not in spec and spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["image"] == PROBE_IMAGE == "registry.k8s.io/pause:3.10"
    assert c["resources"]["limits"] == {"memory": "32Mi", "nvidia.com/gpu": "2"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert spec["priorityClassName"] == PRIORITY_CLASS
    assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] == 0
    assert probe["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert probe["metadata"]["labels"] == {
        "airflow-spot/task-id": "train",
        "airflow-spot/probe": "true",
        "airflow-spot/pool": "zone-b",
        "airflow-spot/capacity": "spot",
    }
    pc = build_priority_class()
    assert (pc["value"], pc["preemptionPolicy"], pc["globalDefault"]) == (-10, "Never", False)
    assert (
        build_probe(training, name="p", labels={}, image="mirror/pause:3.10")["spec"]["containers"][
            0
        ]["image"]
        == "mirror/pause:3.10"
    )


def probe_pod(node_name: str | None = None, reason: str | None = "Unschedulable") -> dict:
    cond = {
        "type": "PodScheduled",
        "status": "True" if node_name else "False",
        "lastTransitionTime": iso(T0 + 20),
    }
    if not node_name and reason:
        cond["reason"] = reason
    return {
        "metadata": {"name": "p", "labels": {"airflow-spot/probe": "true"}},
        "spec": {"nodeName": node_name} if node_name else {},
        "status": {"phase": "Running" if node_name else "Pending", "conditions": [cond]},
    }


FAILED_SCHEDULING = pod_event(
    "FailedScheduling",
    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
    name="p",
    at=T0 + 1,
)


def test_reading_a_probe() -> None:
    kw = {"pool": "zone-b", "created_at": T0}
    up = read_probe(probe_pod("ip-10-0-3-17"), [], now=T0 + 30, **kw)
    assert up is not None and (up.up, up.at, up.source, up.pool) == (
        True,
        T0 + 20,
        "probe",
        "zone-b",
    )
    backoff = pod_event("NotTriggerScaleUp", BACKOFF_MSG, name="p", at=T0 + 12)
    down = read_probe(probe_pod(), [FAILED_SCHEDULING, backoff], now=T0 + 15, **kw)
    assert down is not None and (down.up, down.at, down.source) == (False, T0 + 12, "probe")
    ice = SpotSignal(
        False, T0 + 8, "karpenter", "zone-b", "InsufficientCapacityError on NodeClaim default-x7k2p"
    )
    down = read_probe(probe_pod(), [FAILED_SCHEDULING], now=T0 + 9, refusals=[ice], **kw)
    assert down is not None and not down.up and "default-x7k2p" in down.detail
    old_ice = SpotSignal(
        False, T0 - 60, "karpenter", "zone-b"
    )  # from before the probe: not its answer
    other_pool = SpotSignal(False, T0 + 8, "karpenter", "zone-a")
    assert (
        read_probe(
            probe_pod(), [FAILED_SCHEDULING], now=T0 + 9, refusals=[old_ice, other_pool], **kw
        )
        is None
    )
    scaling = pod_event(
        "TriggeredScaleUp",
        "pod triggered scale-up: [{eks-gpu-spot-2a 0->1 (max: 3)}]",
        name="p",
        at=T0 + 5,
    )
    assert (
        read_probe(probe_pod(), [FAILED_SCHEDULING, scaling], now=T0 + 300, **kw) is None
    )  # a node is coming
    assert (
        read_probe(probe_pod(), [FAILED_SCHEDULING], now=T0 + SETTLE_S - 1, **kw) is None
    )  # too early
    late = read_probe(probe_pod(), [FAILED_SCHEDULING], now=T0 + SETTLE_S + 1, **kw)
    assert late is not None and not late.up and "no scale-up" in late.detail
    assert read_probe(None, [], now=T0, **kw) is None


def test_the_parsers_import_no_kubernetes() -> None:
    code = (
        "import sys, airflow_spot.backends.kubernetes.signals, airflow_spot.backends.kubernetes.probe; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'airflow', 'boto3')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
