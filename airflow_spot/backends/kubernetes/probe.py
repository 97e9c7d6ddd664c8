"""A probe: a pause pod that asks the cluster for the spot capacity the training pod would get.

No autoscaler says "spot is available right now"; a real request does
(``shared/research/capacity-signals.md``, "Probes"). A probe has the training pod's placement
(node selector, affinity, tolerations) and its GPU request, tiny cpu/memory, a pause container,
and a PriorityClass at -10 with ``preemptionPolicy: Never``: it never preempts anyone, any real
pod preempts it, and it still triggers a scale-up (cluster-autoscaler ignores pods *below* -10).
``karpenter.sh/do-not-disrupt`` keeps consolidation from moving it. Bound to a node, spot is up
(and that node is being paid for: drop the probe at once, and the empty node goes back).

Pure: builds manifests (API JSON) and reads a probe pod with its events; :mod:`.probing` does
the calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time
from airflow_spot.backends.kubernetes.signals import GPU, event_time, gpu_request, is_backoff_event
from airflow_spot.backends.signals import SpotSignal

PROBE_IMAGE = "registry.k8s.io/pause:3.10"
PRIORITY_CLASS = "airflow-spot-probe"
PRIORITY = -10  # the lowest that still triggers a cluster-autoscaler scale-up
PROBE_LABEL = "airflow-spot/probe"
POOL_LABEL = "airflow-spot/pool"
CAPACITY_LABEL = "airflow-spot/capacity"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SETTLE_S = 60.0  # an autoscaler acts within this; unschedulable longer with no scale-up: down
SCALE_UP_S = 900.0  # --max-node-provision-time: a scale-up older than this has failed
SCALE_UP_REASONS = {"TriggeredScaleUp", "Nominated"}  # cluster-autoscaler, Karpenter
PLACEMENT_FIELDS = ("nodeSelector", "affinity", "tolerations", "runtimeClassName", "schedulerName")


def is_probe(pod: Any) -> bool:
    """The pod (a model object) is a probe."""
    labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
    return labels.get(PROBE_LABEL) == "true"


def build_priority_class(name: str = PRIORITY_CLASS) -> dict[str, Any]:
    """The PriorityClass of probes: -10, never preempting, never a default."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "airflow-spot"}},
        "value": PRIORITY,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "airflow-spot capacity probes: lowest priority that still scales up, "
        "never preempts; any real pod preempts them.",
    }


def build_probe(
    training_pod: Mapping[str, Any],
    *,
    name: str,
    labels: Mapping[str, str],
    pool: str = "",
    image: str = PROBE_IMAGE,
    priority_class: str = PRIORITY_CLASS,
) -> dict[str, Any]:
    """The probe pod (API JSON) for ``training_pod`` (the pod the backend would launch, as API
    JSON): its placement and GPU request, nothing else of it. ``labels`` are the task's (so
    the probe is found and cleaned with the task's pods); the probe, pool and capacity labels
    are added."""
    spec = pick(training_pod, "spec") or {}
    gpus = gpu_request(training_pod)
    requests: dict[str, str] = {"cpu": "10m", "memory": "16Mi"}
    limits: dict[str, str] = {"memory": "32Mi"}
    if gpus:
        requests[GPU] = limits[GPU] = str(gpus)
    placement = {k: spec[k] for k in PLACEMENT_FIELDS if spec.get(k)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            # spot: the autoscaler events on it are read as our spot pod's
            "labels": {**labels, PROBE_LABEL: "true", POOL_LABEL: pool, CAPACITY_LABEL: "spot"},
            "annotations": {DO_NOT_DISRUPT: "true"},
        },
        "spec": {
            **placement,
            "priorityClassName": priority_class,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "runAsGroup": 65535},
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "resources": {"requests": requests, "limits": limits},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def read_probe(
    pod: Any,
    events: Iterable[Any],
    *,
    pool: str,
    created_at: float,
    now: float,
    refusals: Iterable[SpotSignal] = (),
) -> SpotSignal | None:
    """What a probe shows (source ``probe``): bound to a node, up; pending and refused (an
    autoscaler backoff on it, one of ``refusals`` since it was made, e.g. a Karpenter ICE for
    its pool, or unschedulable for :data:`SETTLE_S` with no scale-up asked for), down; else
    (waiting for a node being made, gone, ended) None: nothing known yet."""
    p = as_dict(pod)
    if not p:
        return None
    spec, status = pick(p, "spec") or {}, pick(p, "status") or {}
    name = pick(pick(p, "metadata") or {}, "name")
    scheduled: Mapping[str, Any] = next(
        (c for c in pick(status, "conditions") or [] if pick(c, "type") == "PodScheduled"), {}
    )
    node = pick(spec, "node_name", "nodeName")
    if node or pick(scheduled, "status") == "True":
        at = wall_time(pick(scheduled, "last_transition_time", "lastTransitionTime")) or now
        return SpotSignal(True, min(at, now), "probe", pool, f"probe {name} bound to node {node}")
    if (pick(status, "phase") or "Pending") != "Pending":
        return None
    evs = [e for e in map(as_dict, events) if (event_time(e) or now) >= created_at - 5.0]
    refused = [
        SpotSignal(
            False, event_time(e) or now, "probe", pool, f"probe {name}: {pick(e, 'message')}"
        )
        for e in evs
        if is_backoff_event(e)
    ] + [
        SpotSignal(False, s.at, "probe", pool, f"probe {name} pending; {s.detail}")
        for s in refusals
        if not s.up and s.pool == pool and s.at >= created_at - 5.0
    ]
    if refused:
        return max(refused, key=lambda s: s.at)
    if any(
        pick(e, "reason") in SCALE_UP_REASONS and now - (event_time(e) or now) <= SCALE_UP_S
        for e in evs
    ):
        return None  # a node is being made for it
    unschedulable = pick(scheduled, "reason") == "Unschedulable" or any(
        pick(e, "reason") == "FailedScheduling" for e in evs
    )
    if unschedulable and now - created_at >= SETTLE_S:
        return SpotSignal(
            False,
            now,
            "probe",
            pool,
            f"probe {name} unschedulable {now - created_at:.0f} s, no scale-up asked for",
        )
    return None
