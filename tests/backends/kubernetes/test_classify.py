"""The preemption classifier, one row per signal, on real-shaped pod / node / event objects.

Sources (``../shared/research/anchors.md`` section 5): K7 kubelet nodeshutdown_manager.go,
K8 pod disruption conditions docs, F4/F5 Flyte pod_helper / plugin_manager, KP1/KP2 Karpenter
disruption docs and interruption events, N1 aws-node-termination-handler node.go and
k8s-events.go, G1 GKE Spot VMs, I12 impending-node-termination, Z1/Z2 AKS spot pools and
node termination handlers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Node,
    V1NodeCondition,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
    V1Taint,
)

from airflow_spot.backends.kubernetes.classify import Verdict, classify
from airflow_spot.backends.kubernetes.facts import interruption_notice, node_is_spot


def pod(
    phase="Running",
    reason=None,
    message=None,
    conditions=(),
    exit_code=None,
    term_reason=None,
    waiting=None,
) -> V1Pod:
    statuses = None
    if waiting is not None:
        statuses = [
            V1ContainerStatus(
                name="train",
                image="img",
                image_id="",
                ready=False,
                restart_count=0,
                state=V1ContainerState(
                    waiting=V1ContainerStateWaiting(reason=waiting, message=f"{waiting}: img")
                ),
            )
        ]
    if exit_code is not None:
        statuses = [
            V1ContainerStatus(
                name="train",
                image="img",
                image_id="",
                ready=False,
                restart_count=0,
                state=V1ContainerState(
                    terminated=V1ContainerStateTerminated(exit_code=exit_code, reason=term_reason)
                ),
            )
        ]
    return V1Pod(
        metadata=V1ObjectMeta(name="p", namespace="ml"),
        status=V1PodStatus(
            phase=phase,
            reason=reason,
            message=message,
            conditions=list(conditions) or None,
            container_statuses=statuses,
        ),
    )


def dt(reason: str, message: str = "") -> V1PodCondition:
    return V1PodCondition(type="DisruptionTarget", status="True", reason=reason, message=message)


def node(
    labels=None, taints=(), ready=True, ready_message="kubelet is posting ready status"
) -> V1Node:
    return V1Node(
        metadata=V1ObjectMeta(name="n1", labels=labels or {}),
        spec=V1NodeSpec(taints=list(taints) or None),
        status=V1NodeStatus(
            conditions=[
                V1NodeCondition(
                    type="Ready", status="True" if ready else "False", message=ready_message
                )
            ]
        ),
    )


def event(reason: str, message: str = "", kind: str = "Node") -> dict:
    return {
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": kind, "name": "n1"},
        "type": "Warning",
    }


EKS_SPOT = {"eks.amazonaws.com/capacityType": "SPOT"}
KARPENTER_SPOT = {"karpenter.sh/capacity-type": "spot"}
GKE_SPOT = {"cloud.google.com/gke-spot": "true"}
GKE_PREEMPTIBLE = {"cloud.google.com/gke-preemptible": "true"}
AKS_SPOT = {"kubernetes.azure.com/scalesetpriority": "spot"}
ON_DEMAND = {"karpenter.sh/capacity-type": "on-demand"}
SHUTDOWN_MSG = "Pod was terminated in response to imminent node shutdown."
# the scheduler's event on every pod that waited for a node to be added (Karpenter, autoscaler)
NO_FIT = (
    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)

CASES = [
    # (id, pod, node, events, kwargs, verdict, source)
    (
        "kubelet-graceful-shutdown-condition",
        pod("Failed", "Terminated", SHUTDOWN_MSG, [dt("TerminationByKubelet", SHUTDOWN_MSG)]),
        node(GKE_SPOT),
        [],
        {},
        Verdict.PREEMPTED,
        "K7",
    ),
    (
        "kubelet-shutdown-status-only-older",
        pod(
            "Failed",
            "Shutdown",
            "Pod Node is in progress of shutting down, not admitting any new pods",
        ),
        node(GKE_PREEMPTIBLE),
        [],
        {},
        Verdict.PREEMPTED,
        "F4",
    ),
    (
        "kubelet-nodeshutdown-admission",
        pod("Failed", "NodeShutdown", "Pod was rejected as the node is shutting down."),
        node(AKS_SPOT),
        [],
        {},
        Verdict.PREEMPTED,
        "K7",
    ),
    (
        "podgc-node-gone",
        pod("Failed", conditions=[dt("DeletionByPodGC", "PodGC: node no longer exists")]),
        None,
        [],
        {"was_spot": True},
        Verdict.PREEMPTED,
        "K8",
    ),
    (
        "taint-manager-unreachable",
        pod("Failed", conditions=[dt("DeletionByTaintManager")]),
        node(
            AKS_SPOT,
            [V1Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")],
            ready=False,
        ),
        [],
        {},
        Verdict.PREEMPTED,
        "K8/Z3",
    ),
    (
        "karpenter-drain-spot-interrupted",
        pod("Failed", conditions=[dt("EvictionByEvictionAPI")]),
        node(KARPENTER_SPOT, [V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
        [event("SpotInterrupted", "Spot interruption warning was triggered")],
        {},
        Verdict.PREEMPTED,
        "KP1/KP2",
    ),
    (
        "nth-drain-spot-itn-taint",
        pod("Failed", conditions=[dt("EvictionByEvictionAPI")]),
        node(
            EKS_SPOT,
            [
                V1Taint(
                    key="aws-node-termination-handler/spot-itn", value="evt-1", effect="NoSchedule"
                )
            ],
        ),
        [],
        {},
        Verdict.PREEMPTED,
        "N1",
    ),
    (
        "nth-spot-interruption-event",
        pod("Failed", conditions=[dt("EvictionByEvictionAPI")]),
        node(EKS_SPOT),
        [event("SpotInterruption", "Spot ITN received")],
        {},
        Verdict.PREEMPTED,
        "N1",
    ),
    (
        "aks-preempt-scheduled-event",
        pod("Failed", conditions=[dt("EvictionByEvictionAPI")]),
        node(AKS_SPOT),
        [event("PreemptScheduled", "Node will change into status 'Preempt'")],
        {},
        Verdict.PREEMPTED,
        "Z2",
    ),
    (
        "consolidation-drain-no-cloud-evidence",
        pod("Failed", conditions=[dt("EvictionByEvictionAPI")]),
        node(KARPENTER_SPOT),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "KP1",
    ),
    (
        "scheduler-priority-preemption",
        pod("Failed", conditions=[dt("PreemptionByScheduler")]),
        node(KARPENTER_SPOT),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "K8",
    ),
    (
        "kubelet-node-pressure-eviction",
        pod(
            "Failed",
            "Evicted",
            "The node was low on resource: memory.",
            [dt("TerminationByKubelet", "node pressure")],
        ),
        node(EKS_SPOT),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "K8",
    ),
    (
        "node-pressure-eviction-without-condition-k8s-pre-1.26",
        pod("Failed", "Evicted", "The node was low on resource: memory.", exit_code=137),
        node(EKS_SPOT),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "K8",
    ),
    (
        "karpenter-disrupted-notice-relayed-helper-exits-143-on-spot",
        pod("Failed", exit_code=143, term_reason="Error"),
        node(KARPENTER_SPOT, [V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
        [],
        {"notice": "node taint karpenter.sh/disrupted"},
        Verdict.PREEMPTED,
        "KP1",
    ),
    (
        "karpenter-instance-terminating-notice-node-gone",
        pod("Failed", exit_code=143, term_reason="Error"),
        None,
        [],
        {"notice": "event InstanceTerminating", "was_spot": True},
        Verdict.PREEMPTED,
        "KP2",
    ),
    (
        "consolidation-notice-on-demand-exit-143",
        pod("Failed", exit_code=143, term_reason="Error"),
        node(ON_DEMAND, [V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
        [],
        {"notice": "node taint karpenter.sh/disrupted"},
        Verdict.INFRA_DISRUPTION,
        "KP1",
    ),
    (
        "exit-1-after-notice-is-still-the-application",
        pod("Failed", exit_code=1, term_reason="Error"),
        node(KARPENTER_SPOT, [V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
        [],
        {"notice": "node taint karpenter.sh/disrupted"},
        Verdict.APP_FAILURE,
        "KF1",
    ),
    (
        "stale-notice-then-sigkill-is-the-application",
        pod("Failed", exit_code=137, term_reason="Error"),
        node(KARPENTER_SPOT),
        [],
        {"notice": "node taint karpenter.sh/disrupted", "notice_age_s": 3600},
        Verdict.APP_FAILURE,
        "KP1",
    ),
    (
        "image-pull-backoff-briefly",
        pod("Pending", waiting="ImagePullBackOff"),
        node(EKS_SPOT),
        [],
        {"start_error_for_s": 30},
        Verdict.PENDING,
        "-",
    ),
    (
        "image-pull-backoff-past-the-bound",
        pod("Pending", waiting="ImagePullBackOff"),
        node(EKS_SPOT),
        [],
        {"start_error_for_s": 900},
        Verdict.APP_FAILURE,
        "-",
    ),
    (
        "create-container-config-error-past-the-bound",
        pod("Pending", waiting="CreateContainerConfigError"),
        node(EKS_SPOT),
        [],
        {"start_error_for_s": 900},
        Verdict.APP_FAILURE,
        "-",
    ),
    (
        "invalid-image-name-at-once",
        pod("Pending", waiting="InvalidImageName"),
        node(EKS_SPOT),
        [],
        {},
        Verdict.APP_FAILURE,
        "-",
    ),
    (
        "container-creating-is-pending",
        pod("Pending", waiting="ContainerCreating"),
        node(EKS_SPOT),
        [],
        {"start_error_for_s": 900},
        Verdict.PENDING,
        "-",
    ),
    (
        "pod-vanished-404-after-running-on-spot",
        None,
        None,
        [],
        {"was_spot": True, "was_running": True},
        Verdict.PREEMPTED,
        "F5/#59626",
    ),
    (
        "pod-vanished-404-on-demand",
        None,
        None,
        [],
        {"was_spot": False, "was_running": True},
        Verdict.INFRA_DISRUPTION,
        "F5",
    ),
    (
        "node-gone-while-running-on-spot",
        pod("Running"),
        None,
        [],
        {"was_spot": True, "was_running": True},
        Verdict.PREEMPTED,
        "S4",
    ),
    (
        "node-not-ready-spot",
        pod("Running"),
        node(GKE_SPOT, ready=False),
        [event("NodeNotReady", kind="Pod")],
        {"was_running": True},
        Verdict.PREEMPTED,
        "S4",
    ),
    (
        "gke-impending-termination-taint",
        pod("Failed", exit_code=143, term_reason="Error"),
        node(
            GKE_SPOT,
            [V1Taint(key="cloud.google.com/impending-node-termination", effect="NoSchedule")],
        ),
        [],
        {},
        Verdict.PREEMPTED,
        "I12",
    ),
    (
        "oom-killed",
        pod("Failed", exit_code=137, term_reason="OOMKilled"),
        node(EKS_SPOT),
        [],
        {},
        Verdict.OOM_KILLED,
        "K8",
    ),
    (
        "app-failure-exit-1",
        pod("Failed", exit_code=1, term_reason="Error"),
        node(KARPENTER_SPOT),
        [],
        {},
        Verdict.APP_FAILURE,
        "KF1",
    ),
    (
        "app-failure-on-demand",
        pod("Failed", exit_code=2, term_reason="Error"),
        node(ON_DEMAND),
        [],
        {},
        Verdict.APP_FAILURE,
        "KF1",
    ),
    (
        "graceful-shutdown-on-demand-node",
        pod("Failed", "Terminated", SHUTDOWN_MSG, [dt("TerminationByKubelet", SHUTDOWN_MSG)]),
        node(ON_DEMAND),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "K7",
    ),
    (
        "succeeded",
        pod("Succeeded", exit_code=0, term_reason="Completed"),
        node(EKS_SPOT),
        [],
        {},
        Verdict.SUCCEEDED,
        "-",
    ),
    ("running", pod("Running"), node(EKS_SPOT), [], {}, Verdict.RUNNING, "-"),
    (
        "pending-briefly",
        pod(
            "Pending",
            conditions=[
                V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable")
            ],
        ),
        None,
        [],
        {"was_spot": True, "pending_for_s": 30},
        Verdict.PENDING,
        "-",
    ),
    (
        "spot-unavailable",
        pod(
            "Pending",
            conditions=[
                V1PodCondition(
                    type="PodScheduled",
                    status="False",
                    reason="Unschedulable",
                    message="0/3 nodes are available",
                )
            ],
        ),
        None,
        [],
        {"was_spot": True, "pending_for_s": 900},
        Verdict.SPOT_UNAVAILABLE,
        "-",
    ),
    (
        "unknown-phase-safe-default",
        pod("Unknown"),
        node(ON_DEMAND),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "KPO #65202",
    ),
    (
        "app-exit-after-failedscheduling-on-demand",
        pod("Failed", exit_code=1),
        node(ON_DEMAND),
        [event("FailedScheduling", NO_FIT, kind="Pod")],
        {},
        Verdict.APP_FAILURE,
        "scheduler words are not cloud evidence",
    ),
    (
        "app-exit-after-failedscheduling-on-spot",
        pod("Failed", exit_code=1),
        node(KARPENTER_SPOT),
        [event("FailedScheduling", NO_FIT, kind="Pod")],
        {},
        Verdict.APP_FAILURE,
        "scheduler words are not cloud evidence",
    ),
    (
        "drain-with-only-scheduler-preemption-talk",
        pod("Failed", conditions=[dt("EvictionByEvictionAPI")]),
        node(AKS_SPOT),
        [event("FailedScheduling", NO_FIT, kind="Pod"), event("Preempted", "Preempted by ml/p2")],
        {},
        Verdict.INFRA_DISRUPTION,
        "KP1",
    ),
    (
        "failed-without-signal-safe-default",
        pod("Failed", reason="Mystery"),
        node(ON_DEMAND),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "-",
    ),
]


@pytest.mark.parametrize(
    ("case", "p", "n", "events", "kwargs", "verdict", "source"), CASES, ids=[c[0] for c in CASES]
)
def test_signal(case, p, n, events, kwargs, verdict, source) -> None:
    """Each preemption signal (or its absence) gives the verdict its source documents."""
    got = classify(p, n, events, **kwargs)
    assert got.verdict is verdict, f"{case} ({source}): {got}"
    assert got.reason


def test_api_json_dicts_classify_like_models() -> None:
    """Plain API JSON (camelCase) reads the same as client model objects."""
    raw = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Failed",
            "reason": "Terminated",
            "message": SHUTDOWN_MSG,
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": SHUTDOWN_MSG,
                }
            ],
            "containerStatuses": [
                {"name": "t", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}
            ],
        },
    }
    assert classify(raw, {"metadata": {"labels": GKE_SPOT}}).verdict is Verdict.PREEMPTED
    raw2 = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
            ],
        }
    }
    assert classify(raw2).verdict is Verdict.OOM_KILLED


def _initialising(phase: str, init_state: dict) -> dict:
    """A pod (API JSON) whose init container "fetch" is in ``init_state`` and whose "train"
    container waits for it."""
    return {
        "status": {
            "phase": phase,
            "initContainerStatuses": [{"name": "fetch", "state": init_state}],
            "containerStatuses": [
                {"name": "train", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        }
    }


def test_an_init_container_that_cannot_start_fails_the_attempt() -> None:
    """An image pull error on an init container (API JSON) counts like one on the main one."""
    raw = _initialising("Pending", {"waiting": {"reason": "ImagePullBackOff"}})
    assert classify(raw, start_error_for_s=30).verdict is Verdict.PENDING
    got = classify(raw, start_error_for_s=900)
    assert got.verdict is Verdict.APP_FAILURE and "ImagePullBackOff" in got.reason


@pytest.mark.parametrize(
    ("terminated", "verdict"),
    [
        ({"exitCode": 2, "reason": "Error"}, Verdict.APP_FAILURE),
        ({"exitCode": 137, "reason": "OOMKilled"}, Verdict.OOM_KILLED),
    ],
)
def test_a_failed_init_container_is_the_application_s(terminated, verdict) -> None:
    """An init container that exits non-zero (or is OOM-killed) on healthy capacity fails the
    attempt like the main container would; it is not an infrastructure disruption."""
    raw = _initialising("Failed", {"terminated": terminated})
    got = classify(raw, {"metadata": {"labels": ON_DEMAND}})
    assert got.verdict is verdict, got


def test_a_native_sidecar_that_died_does_not_end_a_running_attempt() -> None:
    """An init container with restartPolicy Always (GKE's gcsfuse sidecar) that was OOM-killed
    is restarted by the kubelet; the training runs on."""
    raw = {
        "spec": {
            "initContainers": [{"name": "gcsfuse", "restartPolicy": "Always"}],
            "containers": [{"name": "train"}],
        },
        "status": {
            "phase": "Running",
            "initContainerStatuses": [
                {
                    "name": "gcsfuse",
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ],
            "containerStatuses": [{"name": "train", "state": {"running": {}}}],
        },
    }
    assert classify(raw, {"metadata": {"labels": GKE_SPOT}}).verdict is Verdict.RUNNING


def test_safe_default_is_flagged() -> None:
    """An unknown shape is flagged so the caller logs it."""
    assert classify(pod("Unknown"), node(ON_DEMAND)).default_used


@pytest.mark.parametrize(
    ("labels", "spot"),
    [
        (EKS_SPOT, True),
        (KARPENTER_SPOT, True),
        (GKE_SPOT, True),
        (GKE_PREEMPTIBLE, True),
        (AKS_SPOT, True),
        (ON_DEMAND, False),
        ({}, False),
    ],
)
def test_node_capacity_labels(labels, spot) -> None:
    """Every cloud's spot label is recognised; on-demand and unlabelled nodes are not spot."""
    assert node_is_spot(node(labels)) is spot


@pytest.mark.parametrize(
    ("n", "events", "notice"),
    [
        (
            node(KARPENTER_SPOT),
            [event("SpotInterrupted", "Spot interruption warning was triggered")],
            "event SpotInterrupted",
        ),
        (
            node(
                EKS_SPOT,
                [V1Taint(key="aws-node-termination-handler/spot-itn", effect="NoSchedule")],
            ),
            [],
            "node taint aws-node-termination-handler/spot-itn",
        ),
        (
            node(GKE_SPOT, ready=False, ready_message="node is shutting down"),
            [],
            "node shutting down",
        ),
        (
            node(AKS_SPOT),
            [event("Preempt", "will change into status 'Preempt'")],
            "scheduled event Preempt",
        ),
        (
            node(KARPENTER_SPOT, [V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
            [],
            "node taint karpenter.sh/disrupted",
        ),
        (  # Karpenter's interruption: its taint and the cloud's word; the cloud's is the notice
            node(KARPENTER_SPOT, [V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
            [event("SpotInterrupted", "Spot interruption warning was triggered")],
            "event SpotInterrupted",
        ),
        (node(EKS_SPOT), [], None),
        (node(AKS_SPOT), [event("FailedScheduling", NO_FIT, kind="Pod")], None),
    ],
)
def test_interruption_notice(n, events, notice) -> None:
    """A coming reclaim is recognised early enough to tell the pod to checkpoint."""
    assert interruption_notice(n, events) == notice


def test_classifier_imports_no_kubernetes() -> None:
    """The classifier and the verdict are pure: importing them loads no Kubernetes client,
    Airflow or boto3."""
    code = (
        "import sys, airflow_spot.backends.kubernetes.classify, airflow_spot.backends.kubernetes.verdict; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'airflow', 'boto3', 'numpy')))"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )


@pytest.mark.parametrize(
    ("spec", "verdict"),
    [
        ({"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}, Verdict.PREEMPTED),
        ({"nodeSelector": {"eks.amazonaws.com/capacityType": "SPOT"}}, Verdict.PREEMPTED),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "cloud.google.com/gke-spot",
                                            "operator": "In",
                                            "values": ["true"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            Verdict.PREEMPTED,
        ),
        ({"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}}, Verdict.INFRA_DISRUPTION),
        ({}, Verdict.INFRA_DISRUPTION),
    ],
)
def test_pod_gc_with_no_node_and_no_record_reads_the_pods_own_placement(spec, verdict) -> None:
    """PodGC on a pod whose node is gone and whose capacity nothing recorded: a spot node
    selector (or a required spot affinity) on the pod itself makes it a preemption."""
    gc = {
        "metadata": {"name": "train-1"},
        "spec": {"containers": [{"name": "train", "image": "img"}], **spec},
        "status": {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists",
                }
            ],
        },
    }
    assert classify(gc, None).verdict is verdict


def test_a_pod_gone_after_the_schedulers_preemption_is_not_a_spot_reclaim() -> None:
    """The kubelet finished the scheduler's graceful delete before the backend looked: the
    pod is gone (404) but its ``Preempted`` event (kube-scheduler's own shape) remains, so it
    is an infrastructure disruption even on spot, not a preemption by the cloud."""
    event = {
        "reason": "Preempted",
        "type": "Normal",
        "message": "Preempted by pod 4a1c6f0e-3b9d-4c55-9a2e-1f0d2b7c8e11 on node spot-1",
        "involvedObject": {"kind": "Pod", "name": "train-a1", "uid": "u1"},
        "reportingComponent": "default-scheduler",
    }
    c = classify(None, None, [event], was_spot=True, was_running=True)
    assert c.verdict is Verdict.INFRA_DISRUPTION and "scheduler" in c.reason, c
    assert classify(None, None, [], was_spot=True, was_running=True).verdict is Verdict.PREEMPTED


@pytest.mark.parametrize(
    ("finished", "code", "verdict"),
    [
        ("2026-01-01T00:00:10Z", 143, Verdict.INFRA_DISRUPTION),  # after the lease: stopped itself
        ("2026-01-01T00:00:01Z", 143, Verdict.APP_FAILURE),  # before it: not the lease's doing
        ("2026-01-01T00:00:10Z", 1, Verdict.APP_FAILURE),  # a real failure past the lease
    ],
)
def test_a_pod_that_stopped_itself_past_its_lease_is_not_an_application_failure(
    finished, code, verdict
) -> None:
    """Exit 143 at or after the pod's ``airflow-spot/lease-until``: the helper checkpointed
    and stopped because nobody renewed the lease (an infrastructure disruption); other exits,
    or a 143 well before the lease, keep their usual verdict."""
    lease = 1767225605.0  # 2026-01-01T00:00:05Z
    p = {
        "metadata": {"name": "t", "annotations": {"airflow-spot/lease-until": repr(lease)}},
        "spec": {"containers": [{"name": "train", "image": "img"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "train",
                    "state": {"terminated": {"exitCode": code, "finishedAt": finished}},
                }
            ],
        },
    }
    n = node({"karpenter.sh/capacity-type": "on-demand"})
    c = classify(p, n, [])
    assert c.verdict is verdict, c
    assert ("lease expired" in c.reason) is (verdict is Verdict.INFRA_DISRUPTION)


# Karpenter v1.14.1's own shapes, as the real one wrote them (tests/backends/kubernetes/real/
# test_real_karpenter.py): its node being taken away (deletionTimestamp and the disrupted taint),
# the pod drained through the Eviction API, and its events.
K_NODE = "kwok-airflow-spot-f7mkz-fishfringe-2-swzzmjwyys-64294605"


def karpenter_node(capacity: str = "spot", deleting: bool = True) -> dict:
    meta: dict = {
        "name": K_NODE,
        "labels": {"karpenter.sh/capacity-type": capacity, "karpenter.sh/nodepool": "pool"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T14:22:51Z"
    taints = [{"key": "airflow-spot/karpenter", "value": "true", "effect": "NoSchedule"}]
    if deleting:
        taints.append({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})
    return {"metadata": meta, "spec": {"taints": taints}, "status": {}}


def k_event(kind: str, reason: str, message: str, component: str = "karpenter") -> dict:
    name = {"Node": K_NODE, "NodeClaim": "airflow-spot-f7mkz", "Pod": "p"}[kind]
    return {
        "reason": reason,
        "message": message,
        "type": "Normal",
        "involvedObject": {"kind": kind, "name": name},
        "source": {"component": component},
    }


DRAINED = {
    "metadata": {"name": "p"},
    "status": {
        "phase": "Running",
        "conditions": [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
            }
        ],
    },
}
CONSOLIDATING = [
    k_event("NodeClaim", "DisruptionTerminating", "Disrupting NodeClaim: Underutilized"),
    k_event("Node", "DisruptionTerminating", "Disrupting Node: Underutilized"),
]
FAILED_DRAINING = k_event(
    "Node", "FailedDraining", "Failed to drain node, 1 pods are waiting to be evicted"
)
KARPENTER_CASES = [
    # (id, pod, node, events, kwargs, verdict, reason says)
    (
        "consolidation-drain",
        DRAINED,
        karpenter_node(),
        [*CONSOLIDATING, FAILED_DRAINING],
        {},
        Verdict.INFRA_DISRUPTION,
        "Underutilized",
    ),
    (
        "consolidation-drain-evicted-event-only",
        DRAINED,
        karpenter_node(),
        [k_event("Pod", "Evicted", "Evicted pod: Underutilized")],
        {},
        Verdict.INFRA_DISRUPTION,
        "Underutilized",
    ),
    (
        "empty-node-drift-drain",
        DRAINED,
        karpenter_node(),
        [k_event("Node", "DisruptionTerminating", "Disrupting Node: Drifted")],
        {},
        Verdict.INFRA_DISRUPTION,
        "Drifted",
    ),
    (
        "nodeclaim-deleted-drain-before-its-evicted-event",
        DRAINED,
        karpenter_node(),
        [FAILED_DRAINING],
        {},
        Verdict.PREEMPTED,
        "NodeClaim was deleted",
    ),
    (
        "nodeclaim-deleted-drain-with-forceful-evicted-event",
        DRAINED,
        karpenter_node(),
        [FAILED_DRAINING, k_event("Pod", "Evicted", "Evicted pod: Forceful Termination")],
        {},
        Verdict.PREEMPTED,
        "NodeClaim was deleted",
    ),
    (
        "nodeclaim-deleted-drain-on-demand",
        DRAINED,
        karpenter_node("on-demand"),
        [k_event("Pod", "Evicted", "Evicted pod: Forceful Termination")],
        {},
        Verdict.INFRA_DISRUPTION,
        "not on spot capacity",
    ),
    (
        "a-drain-of-a-karpenter-node-not-being-deleted-is-no-reclaim",
        DRAINED,
        karpenter_node(deleting=False),
        [],
        {},
        Verdict.INFRA_DISRUPTION,
        "without cloud evidence",
    ),
    (
        "spot-interrupted-during-consolidation-is-the-cloud-s",
        DRAINED,
        karpenter_node(),
        [
            *CONSOLIDATING,
            k_event("Node", "SpotInterrupted", "Spot interruption warning was triggered"),
        ],
        {},
        Verdict.PREEMPTED,
        "spot interruption",
    ),
    (
        "pod-gone-after-consolidation",
        None,
        karpenter_node(),
        [*CONSOLIDATING, k_event("Pod", "Evicted", "Evicted pod: Underutilized")],
        {"was_running": True, "was_spot": True},
        Verdict.INFRA_DISRUPTION,
        "Underutilized",
    ),
    (
        "pod-and-node-gone-after-nodeclaim-deleted",
        None,
        None,
        [FAILED_DRAINING, k_event("Pod", "Evicted", "Evicted pod: Forceful Termination")],
        {"was_running": True, "was_spot": True},
        Verdict.PREEMPTED,
        "vanished",
    ),
    (
        "exit-143-after-the-notice-of-a-consolidation",
        {
            "metadata": {"name": "p"},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "train", "state": {"terminated": {"exitCode": 143}}}
                ],
            },
        },
        karpenter_node(),
        CONSOLIDATING,
        {"notice": "node taint karpenter.sh/disrupted"},
        Verdict.INFRA_DISRUPTION,
        "Underutilized",
    ),
    (
        "an-evicted-pod-message-from-another-component-is-not-karpenter-s",
        DRAINED,
        karpenter_node(),
        [k_event("Pod", "Evicted", "Evicted pod: Underutilized", component="kubelet")],
        {},
        Verdict.PREEMPTED,
        "NodeClaim was deleted",
    ),
]


@pytest.mark.parametrize(
    ("case", "p", "n", "events", "kwargs", "verdict", "says"),
    KARPENTER_CASES,
    ids=[c[0] for c in KARPENTER_CASES],
)
def test_karpenter_s_own_words(case, p, n, events, kwargs, verdict, says) -> None:
    """Karpenter's consolidation or drift drain is no reclaim; its NodeClaim deleted from outside
    (how it ends an interrupted instance) on spot is, read from the node before its events."""
    got = classify(p, n, events, **kwargs)
    assert got.verdict is verdict, f"{case}: {got}"
    assert says in got.reason, f"{case}: {got}"
