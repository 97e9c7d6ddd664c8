"""What happened to a training pod: a pure function over the pod, its node and their events.

Pure: no Kubernetes client import. It accepts Kubernetes model objects (anything with
``to_dict()``) or plain API JSON dicts (camelCase), and reads each field under both spellings.
The signals and their sources are in ``../shared/research/anchors.md`` section 2:

* pod condition ``DisruptionTarget`` (K8s >= 1.26) and its reasons ``TerminationByKubelet``,
  ``DeletionByPodGC``, ``DeletionByTaintManager``, ``EvictionByEvictionAPI``,
  ``PreemptionByScheduler`` [K7, K8];
* the kubelet's graceful node shutdown: ``status.reason`` ``Terminated`` (older: ``Shutdown``,
  ``NodeShutdown``) and its messages [K7, F4];
* a pod that vanished (404) or whose node vanished, after running on a spot node [F5, S4];
* Karpenter events ``SpotInterrupted``, ``TerminatingOnInterruption``, ... and taint
  ``karpenter.sh/disrupted`` [KP1, KP2]; AWS Node Termination Handler taint
  ``aws-node-termination-handler/spot-itn`` and events ``SpotInterruption`` ... [N1];
  GKE labels ``cloud.google.com/gke-spot`` / ``gke-preemptible`` and taint
  ``cloud.google.com/impending-node-termination`` [G1, I12]; AKS label/taint
  ``kubernetes.azure.com/scalesetpriority=spot`` and "Preempt" scheduled events [Z1, Z2];
* ``OOMKilled`` and non-zero exits on healthy capacity (application failures).

Anything else falls to a safe default (infrastructure disruption: retried without spending
the user's failure budget) and the caller logs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Verdict(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    SPOT_UNAVAILABLE = "spot_unavailable"
    INFRA_DISRUPTION = "infra_disruption"
    OOM_KILLED = "oom_killed"
    APP_FAILURE = "app_failure"


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    reason: str
    evidence: tuple[str, ...] = field(default_factory=tuple)
    default_used: bool = False  # no known signal matched: the safe default was taken

    @property
    def terminal(self) -> bool:
        return self.verdict not in (Verdict.PENDING, Verdict.RUNNING)


SPOT_LABELS: dict[str, tuple[str, ...]] = {
    "eks.amazonaws.com/capacityType": ("SPOT",),
    "karpenter.sh/capacity-type": ("spot",),
    "cloud.google.com/gke-spot": ("true",),
    "cloud.google.com/gke-preemptible": ("true",),
    "kubernetes.azure.com/scalesetpriority": ("spot",),
}
SHUTDOWN_REASONS = {"Terminated", "Shutdown", "NodeShutdown"}
SHUTDOWN_MESSAGES = (
    "Pod was terminated in response to imminent node shutdown.",
    "Pod Node is in progress of shutting down, not admitting any new pods",
    "Pod was rejected as the node is shutting down.",
)
SPOT_EVENT_REASONS = {"SpotInterrupted", "TerminatingOnInterruption", "SpotInterruption"}
NODE_LOSS_EVENT_REASONS = {
    "NodeNotReady",
    "DeletingNode",
    "TaintManagerEviction",
    "InstanceTerminating",
    "InstanceStopping",
    "RemovingNode",
}
SPOT_TAINTS = {
    "aws-node-termination-handler/spot-itn",
    "cloud.google.com/impending-node-termination",
}
# A container that cannot start: these keep a scheduled pod Pending for ever. The image or its
# config is wrong (or the registry is down): fail the attempt after a bound, at once if the
# name itself is invalid.
CONTAINER_START_ERRORS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}
CONTAINER_START_FATAL = {"InvalidImageName", "ErrImageNeverPull"}
# Exit codes of a container stopped by a signal (SIGINT, SIGKILL, SIGTERM): after a relayed
# reclaim notice these are the checkpoint helper exiting or the eviction, not the user's code.
SIGNAL_EXITS = {130, 137, 143}
NOTICE_WINDOW_S = 900.0  # a notice older than this at the exit no longer explains it
# Recorded notices that are the cloud's own word that the capacity is being reclaimed
# (``karpenter.sh/disrupted`` alone is not: Karpenter's consolidation sets it too).
CLOUD_NOTICES = (
    "node taint aws-node",
    "node taint cloud.google",
    "event Spot",
    "event Instance",
    "scheduled event",
)
# The scheduler's and autoscaler's own events about a pod: "preemption: ... Preemption is not
# helpful for scheduling" in a FailedScheduling message is priority preemption talk, never a
# cloud reclaim. Only events of the node (or its NodeClaim) may say "Preempt" for the cloud.
SCHEDULER_EVENT_REASONS = {
    "FailedScheduling",
    "Scheduled",
    "Preempted",
    "Preempting",
    "NotTriggerScaleUp",
    "TriggeredScaleUp",
}
DRAIN_TAINTS = {
    "karpenter.sh/disrupted",
    "node.kubernetes.io/out-of-service",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/rebalance-recommendation",
}


def _scheduled_preempt(e: Mapping[str, Any]) -> bool:
    """An Azure scheduled "Preempt" event relayed onto the node (not the scheduler's words)."""
    inv = _g(e, "involved_object", "involvedObject") or {}
    return (
        "Preempt" in str(_g(e, "message") or "")
        and (_g(inv, "kind") or "Node") != "Pod"
        and (_g(e, "reason") or "") not in SCHEDULER_EVENT_REASONS
    )


def _d(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"cannot read {type(obj).__name__} as a Kubernetes object")


def _g(d: Mapping[str, Any] | None, *names: str) -> Any:
    """The first present field among snake_case / camelCase spellings."""
    if not d:
        return None
    for n in names:
        v = d.get(n)
        if v is not None:
            return v
    return None


def node_is_spot(node: Any) -> bool | None:
    """True/False from the node's capacity labels; None if the node is unknown."""
    n = _d(node)
    if not n:
        return None
    labels = _g(_g(n, "metadata") or {}, "labels") or {}
    return any(
        str(labels.get(k, "")).lower() in {v.lower() for v in vals}
        for k, vals in SPOT_LABELS.items()
    )


def interruption_notice(node: Any, events: Iterable[Any] = ()) -> str | None:
    """Evidence that the node is about to be reclaimed (so the pod should checkpoint now)."""
    n = _d(node)
    for t in _g(_g(n, "spec") or {}, "taints") or []:
        key = _g(t, "key")
        if key in SPOT_TAINTS or key == "karpenter.sh/disrupted":
            return f"node taint {key}"
    for ev in events:
        e = _d(ev)
        reason = _g(e, "reason") or ""
        if reason in SPOT_EVENT_REASONS or reason in ("InstanceTerminating", "InstanceStopping"):
            return f"event {reason}"
        if _scheduled_preempt(e):
            return "scheduled event Preempt"
    for c in _g(_g(n, "status") or {}, "conditions") or []:
        if (
            _g(c, "type") == "Ready"
            and _g(c, "status") != "True"
            and "shutting down" in str(_g(c, "message") or "")
        ):
            return "node shutting down"
    return None


def container_start_error(pod: Any) -> tuple[str, str] | None:
    """(reason, message) of a container (init containers included) waiting on an error that
    keeps it from starting."""
    status = _g(_d(pod), "status") or {}
    statuses = [
        *(_g(status, "init_container_statuses", "initContainerStatuses") or []),
        *(_g(status, "container_statuses", "containerStatuses") or []),
    ]
    for cs in statuses:
        w = _g(_g(cs, "state") or {}, "waiting")
        reason = _g(w, "reason") or ""
        if reason in CONTAINER_START_ERRORS or reason in CONTAINER_START_FATAL:
            return reason, str(_g(w, "message") or "")
    return None


def _cloud_evidence(node: Mapping[str, Any], events: list[dict[str, Any]]) -> list[str]:
    out = []
    for t in _g(_g(node, "spec") or {}, "taints") or []:
        if _g(t, "key") in SPOT_TAINTS:
            out.append(f"taint {_g(t, 'key')}")
    for e in events:
        reason = _g(e, "reason") or ""
        if reason in SPOT_EVENT_REASONS:
            out.append(f"event {reason}")
        elif _scheduled_preempt(e):
            out.append("event Preempt (scheduled events)")
    return out


def classify(
    pod: Any,
    node: Any = None,
    events: Iterable[Any] = (),
    *,
    was_spot: bool | None = None,
    was_running: bool = False,
    pending_for_s: float = 0.0,
    pending_timeout_s: float = 600.0,
    notice: str | None = None,
    notice_age_s: float | None = None,
    start_error_for_s: float = 0.0,
) -> Classification:
    """Classify a training pod.

    :param pod: the pod, or ``None`` if it is gone (404).
    :param node: its node, or ``None`` if unknown or gone.
    :param events: events of the pod and its node (and NodeClaim).
    :param was_spot: capacity recorded while the pod ran (the node may be gone now).
    :param was_running: the pod was seen running before.
    :param pending_for_s: how long the pod has been pending unschedulable.
    :param notice: an interruption warning recorded earlier (its node may be gone now).
    :param notice_age_s: seconds from the notice to the container's exit (None: unknown).
    :param start_error_for_s: how long a container has been unable to start (image pull or
        container config error); past ``pending_timeout_s`` the attempt fails.
    """
    p, n = _d(pod), _d(node)
    evs = [_d(e) for e in events]
    spot = node_is_spot(n) if n else None
    spot = was_spot if spot is None else spot
    cloud = _cloud_evidence(n, evs) if (n or evs) else []
    if notice and notice.startswith(CLOUD_NOTICES):
        cloud.append(f"recorded notice: {notice}")

    def reclaimed(why: str, *evidence: str) -> Classification:
        ev = tuple(evidence) + tuple(cloud)
        if spot or cloud:
            return Classification(Verdict.PREEMPTED, why, ev)
        return Classification(Verdict.INFRA_DISRUPTION, f"{why} (not on spot capacity)", ev)

    if not p:
        if was_running or was_spot:
            return reclaimed("the pod vanished (404) after running", "pod not found")
        return Classification(
            Verdict.INFRA_DISRUPTION, "the pod vanished (404) before it ran", ("pod not found",)
        )
    status = _g(p, "status") or {}
    phase = _g(status, "phase") or "Pending"
    if phase == "Succeeded":
        return Classification(Verdict.SUCCEEDED, "the pod succeeded")

    conds = {(_g(c, "type")): c for c in _g(status, "conditions") or []}
    dt = conds.get("DisruptionTarget")
    if dt is not None and _g(dt, "status") == "True":
        reason = _g(dt, "reason") or ""
        msg = str(_g(dt, "message") or "")
        evidence = f"DisruptionTarget/{reason}"
        if reason == "TerminationByKubelet":
            if (
                _g(status, "reason") in SHUTDOWN_REASONS
                or any(m in msg or m in str(_g(status, "message") or "") for m in SHUTDOWN_MESSAGES)
                or "shutdown" in msg.lower()
            ):
                return reclaimed("graceful node shutdown", evidence)
            return Classification(
                Verdict.INFRA_DISRUPTION,
                f"evicted by the kubelet: {msg or 'node pressure'}",
                (evidence,),
            )
        if reason in ("DeletionByPodGC", "DeletionByTaintManager"):
            return reclaimed(
                "the node was lost"
                if reason == "DeletionByPodGC"
                else "the node became unreachable",
                evidence,
            )
        if reason == "EvictionByEvictionAPI":
            if cloud:
                return Classification(
                    Verdict.PREEMPTED, "drained for a spot interruption", (evidence, *cloud)
                )
            return Classification(
                Verdict.INFRA_DISRUPTION, "evicted by a drain without cloud evidence", (evidence,)
            )
        if reason == "PreemptionByScheduler":
            return Classification(
                Verdict.INFRA_DISRUPTION,
                "preempted by the scheduler for a higher-priority pod",
                (evidence,),
            )
        if reason == "TerminationByKubelet" or phase == "Failed":
            return Classification(
                Verdict.INFRA_DISRUPTION, f"disruption {reason}", (evidence,), default_used=True
            )

    s_reason, s_msg = _g(status, "reason"), str(_g(status, "message") or "")
    if phase == "Failed" and (
        s_reason in SHUTDOWN_REASONS or any(m in s_msg for m in SHUTDOWN_MESSAGES)
    ):
        return reclaimed("graceful node shutdown (kubelet status)", f"status.reason={s_reason}")
    if phase == "Failed" and s_reason == "Evicted":  # node pressure on K8s < 1.26 (no condition)
        if cloud:
            return reclaimed("evicted while the node was being reclaimed", "status.reason=Evicted")
        return Classification(
            Verdict.INFRA_DISRUPTION,
            f"evicted by the kubelet: {s_msg or 'node pressure'}",
            ("status.reason=Evicted",),
        )

    node_gone = was_running and not n and node is None and phase == "Running" and was_spot
    node_lost_events = [
        f"event {_g(e, 'reason')}" for e in evs if _g(e, "reason") in NODE_LOSS_EVENT_REASONS
    ]
    ready = next(
        (c for c in _g(_g(n, "status") or {}, "conditions") or [] if _g(c, "type") == "Ready"), None
    )
    node_not_ready = ready is not None and _g(ready, "status") != "True"
    if phase in ("Running", "Unknown") and (node_gone or (node_not_ready and (spot or cloud))):
        return reclaimed(
            "the node was lost while the pod ran",
            *node_lost_events,
            "node gone" if node_gone else "node NotReady",
        )

    terminated = []
    for cs in _g(status, "container_statuses", "containerStatuses") or []:
        t = _g(_g(cs, "state") or {}, "terminated")
        if t:
            terminated.append(t)
    # an init container that failed (restartPolicy Never) fails the pod before "train" starts:
    # its exit code and OOM kill count like the main container's. A native sidecar (an init
    # container with restartPolicy Always) that died is restarted by the kubelet: not counted.
    sidecars = {
        _g(c, "name")
        for c in _g(_g(p, "spec") or {}, "init_containers", "initContainers") or []
        if _g(c, "restart_policy", "restartPolicy") == "Always"
    }
    for cs in _g(status, "init_container_statuses", "initContainerStatuses") or []:
        t = _g(_g(cs, "state") or {}, "terminated")
        if (
            phase == "Failed"
            and t
            and _g(cs, "name") not in sidecars
            and (_g(t, "exit_code", "exitCode") not in (None, 0) or _g(t, "reason") == "OOMKilled")
        ):
            terminated.append(t)
    if any((_g(t, "reason") or "") == "OOMKilled" for t in terminated):
        return Classification(
            Verdict.OOM_KILLED, "a container was OOM-killed (memory limit)", ("OOMKilled",)
        )
    if phase == "Failed":
        codes = [_g(t, "exit_code", "exitCode") for t in terminated]
        bad = [c for c in codes if c not in (None, 0)]
        fresh = notice_age_s is None or notice_age_s <= NOTICE_WINDOW_S
        if bad and notice and fresh and all(c in SIGNAL_EXITS for c in bad):
            return reclaimed(
                f"stopped (exit {bad[0]}) after the reclaim notice", f"exit {bad[0]}", notice
            )
        if bad and not cloud and not node_not_ready:
            return Classification(
                Verdict.APP_FAILURE,
                f"exit code {bad[0]} on healthy capacity",
                tuple(f"exit {c}" for c in bad),
            )
        if bad and (cloud or node_not_ready):
            return reclaimed(
                f"killed (exit {bad[0]}) while the node was being reclaimed", f"exit {bad[0]}"
            )
        return Classification(
            Verdict.INFRA_DISRUPTION,
            f"failed without a known signal (reason {s_reason!r})",
            (f"status.reason={s_reason}",),
            default_used=True,
        )
    if phase == "Pending":
        start_error = container_start_error(p)
        if start_error and (
            start_error[0] in CONTAINER_START_FATAL or start_error_for_s >= pending_timeout_s
        ):
            reason, msg = start_error
            return Classification(
                Verdict.APP_FAILURE,
                f"the container cannot start ({reason}"
                + (f" for {start_error_for_s:.0f} s" if start_error_for_s else "")
                + f"): {msg or 'check the image name, its registry credentials and the pod config'}",
                (f"waiting/{reason}",),
            )
        sched = conds.get("PodScheduled")
        unschedulable = (
            sched is not None
            and _g(sched, "status") == "False"
            and _g(sched, "reason") == "Unschedulable"
        )
        if unschedulable and pending_for_s >= pending_timeout_s:
            return Classification(
                Verdict.SPOT_UNAVAILABLE if was_spot is not False else Verdict.INFRA_DISRUPTION,
                f"unschedulable for {pending_for_s:.0f} s: {_g(sched, 'message') or 'no capacity'}",
                ("PodScheduled=False/Unschedulable",),
            )
        return Classification(Verdict.PENDING, "pending")
    if phase == "Running":
        return Classification(Verdict.RUNNING, "running")
    return Classification(
        Verdict.INFRA_DISRUPTION,
        f"unknown pod phase {phase!r}",
        (f"phase={phase}",),
        default_used=True,
    )
