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
  ``karpenter.sh/disrupted`` [KP1, KP2]; Karpenter's own word on a drain (seen from the real
  Karpenter v1.14.1 in ``tests/backends/kubernetes/real/test_real_karpenter.py``): its
  consolidation says ``DisruptionTerminating`` "Disrupting Node: Underutilized" on the node and
  ``Evicted`` "Evicted pod: Underutilized" on the pod, a NodeClaim deleted from outside its
  disruption controller (an interruption) "Evicted pod: Forceful Termination"; AWS Node Termination Handler taint
  ``aws-node-termination-handler/spot-itn`` and events ``SpotInterruption`` ... [N1];
  GKE labels ``cloud.google.com/gke-spot`` / ``gke-preemptible`` and taint
  ``cloud.google.com/impending-node-termination`` [G1, I12]; AKS label/taint
  ``kubernetes.azure.com/scalesetpriority=spot`` and "Preempt" scheduled events [Z1, Z2];
* ``OOMKilled`` and non-zero exits on healthy capacity (application failures).

Each signal is read by one small rule; :data:`RULES` holds them in order and the first that
answers decides. Anything else falls to a safe default (infrastructure disruption: retried
without spending the user's failure budget) and the caller logs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
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
# Karpenter's own words (sigs.k8s.io/karpenter v1.14 pkg/controllers/disruption/events and
# node/termination/terminator/events). Its disruption controller (consolidation, drift) says on
# the Node and the NodeClaim, before it deletes the NodeClaim, "Disrupting Node: <reason>"; its
# termination controller then evicts and says on the pod "Evicted pod: <reason>", the reason
# being the NodeClaim's DisruptionReason, or "Forceful Termination" when the NodeClaim was
# deleted from outside the disruption controller: the interruption controller after a spot
# interruption (that is how Karpenter takes a reclaimed instance away), an expiry, a repair, a
# person. Karpenter's own disruption is never a reclaim.
KARPENTER_DISRUPTING = "DisruptionTerminating"
KARPENTER_DISRUPTING_PREFIXES = ("Disrupting Node: ", "Disrupting NodeClaim: ")
KARPENTER_EVICTED = "Evicted"
KARPENTER_EVICTED_PREFIX = "Evicted pod: "
KARPENTER_FORCEFUL = "Forceful Termination"
KARPENTER_NODEPOOL = "karpenter.sh/nodepool"  # on every node Karpenter made
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


def _karpenters(e: Mapping[str, Any]) -> bool:
    """The event is Karpenter's (or says nothing of who wrote it)."""
    source = _g(_g(e, "source") or {}, "component") or _g(
        e, "reporting_component", "reportingComponent", "reporting_controller"
    )
    return source in (None, "", "karpenter")


def karpenter_disruption(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The reason Karpenter's disruption controller gave for draining the node (``Underutilized``,
    ``Empty``, ``Drifted``), from its ``DisruptionTerminating`` or ``Evicted`` event; None if
    it gave none (no decision of its own, or not Karpenter)."""
    for e in events:
        reason, msg = _g(e, "reason"), str(_g(e, "message") or "")
        if not _karpenters(e):
            continue
        if reason == KARPENTER_DISRUPTING and msg.startswith(KARPENTER_DISRUPTING_PREFIXES):
            return msg.split(": ", 1)[1].strip() or "disruption"
        if (
            reason == KARPENTER_EVICTED
            and msg.startswith(KARPENTER_EVICTED_PREFIX)
            and msg[len(KARPENTER_EVICTED_PREFIX) :].strip() not in ("", KARPENTER_FORCEFUL)
        ):
            return msg[len(KARPENTER_EVICTED_PREFIX) :].strip()
    return None


def karpenter_forceful(node: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> str | None:
    """Evidence that Karpenter is taking its node away with no disruption decision of its own:
    its ``Evicted`` "Forceful Termination" event on the pod, or (before that event is written)
    a node of Karpenter's being deleted and tainted ``karpenter.sh/disrupted``."""
    for e in events:
        if (
            _g(e, "reason") == KARPENTER_EVICTED
            and str(_g(e, "message") or "").strip() == KARPENTER_EVICTED_PREFIX + KARPENTER_FORCEFUL
            and _karpenters(e)
        ):
            return f"event {KARPENTER_EVICTED}: {KARPENTER_FORCEFUL}"
    meta = _g(node, "metadata") or {}
    taints = {_g(t, "key") for t in _g(_g(node, "spec") or {}, "taints") or []}
    if (
        KARPENTER_NODEPOOL in (_g(meta, "labels") or {})
        and _g(meta, "deletion_timestamp", "deletionTimestamp")
        and "karpenter.sh/disrupted" in taints
    ):
        return "Karpenter's node deleted without a disruption decision"
    return None


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


def placement_is_spot(pod: Any) -> bool:
    """The pod's own placement requires spot: a node selector, or a required node-affinity
    ``In`` term in every alternative, on a spot capacity label (its node may be gone)."""
    spec = _g(_d(pod), "spec") or {}
    spot = {k: {v.lower() for v in vals} for k, vals in SPOT_LABELS.items()}
    selector = _g(spec, "node_selector", "nodeSelector") or {}
    if any(str(selector.get(k, "")).lower() in vals for k, vals in spot.items()):
        return True
    node_aff = _g(_g(spec, "affinity") or {}, "node_affinity", "nodeAffinity") or {}
    required = _g(
        node_aff,
        "required_during_scheduling_ignored_during_execution",
        "requiredDuringSchedulingIgnoredDuringExecution",
    )
    terms = _g(required or {}, "node_selector_terms", "nodeSelectorTerms") or []

    def term_spot(term: Any) -> bool:
        for e in _g(term, "match_expressions", "matchExpressions") or []:
            values = {str(v).lower() for v in _g(e, "values") or []}
            key = _g(e, "key")
            if _g(e, "operator") == "In" and key in spot and values and values <= spot[key]:
                return True
        return False

    return bool(terms) and all(term_spot(t) for t in terms)


def interruption_notice(node: Any, events: Iterable[Any] = ()) -> str | None:
    """Evidence that the node is about to be reclaimed (so the pod should checkpoint now): the
    cloud's own word first (:data:`CLOUD_NOTICES`), then Karpenter's disruption taint."""
    n = _d(node)
    taints = [_g(t, "key") for t in _g(_g(n, "spec") or {}, "taints") or []]
    for key in taints:
        if key in SPOT_TAINTS:
            return f"node taint {key}"
    for ev in events:  # the cloud's own word before Karpenter's taint, which consolidation sets too
        e = _d(ev)
        reason = _g(e, "reason") or ""
        if reason in SPOT_EVENT_REASONS or reason in ("InstanceTerminating", "InstanceStopping"):
            return f"event {reason}"
        if _scheduled_preempt(e):
            return "scheduled event Preempt"
    if "karpenter.sh/disrupted" in taints:
        return "node taint karpenter.sh/disrupted"
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


def is_cloud_notice(notice: str | None) -> bool:
    """The recorded notice is the cloud's own word that the capacity is being reclaimed."""
    return bool(notice) and str(notice).startswith(CLOUD_NOTICES)


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


@dataclass(frozen=True)
class Facts:
    """What :func:`classify` reads: the pod, its node and their events as API dicts, and what
    the caller recorded earlier (see :func:`classify` for each record)."""

    pod: dict[str, Any]  # {} when the pod is gone (404)
    node: dict[str, Any]  # {} when unknown or gone
    events: tuple[dict[str, Any], ...] = ()
    node_absent: bool = False  # ``None`` was given for the node (not merely an empty one)
    was_spot: bool | None = None
    was_running: bool = False
    pending_for_s: float = 0.0
    pending_timeout_s: float = 600.0
    notice: str | None = None
    notice_age_s: float | None = None
    start_error_for_s: float = 0.0
    # derived at construction: the capacity (the node's labels, else the recorded capacity)
    # and the cloud's own word that the capacity is being reclaimed
    spot: bool | None = field(init=False)
    cloud: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        spot = node_is_spot(self.node) if self.node else None
        if spot is None and self.was_spot is None and self.pod:
            spot = placement_is_spot(self.pod) or None  # no node, no record: its placement
        object.__setattr__(self, "spot", self.was_spot if spot is None else spot)
        cloud = _cloud_evidence(self.node, list(self.events)) if (self.node or self.events) else []
        if is_cloud_notice(self.notice):
            cloud.append(f"recorded notice: {self.notice}")
        object.__setattr__(self, "cloud", tuple(cloud))

    @classmethod
    def of(cls, pod: Any, node: Any = None, events: Iterable[Any] = (), **records: Any) -> Facts:
        """The facts of Kubernetes model objects or API dicts; ``records`` as :func:`classify`."""
        p, n = _d(pod), _d(node)
        return cls(p, n, tuple(_d(e) for e in events), node_absent=node is None, **records)

    @cached_property
    def karpenter_disruption(self) -> str | None:
        """Karpenter's own disruption reason for the drain (see :func:`karpenter_disruption`)."""
        return karpenter_disruption(self.events)

    @cached_property
    def status(self) -> Mapping[str, Any]:
        return _g(self.pod, "status") or {}

    @cached_property
    def phase(self) -> str:
        return _g(self.status, "phase") or "Pending"

    @cached_property
    def conditions(self) -> dict[Any, Any]:
        """The pod's conditions by type."""
        return {(_g(c, "type")): c for c in _g(self.status, "conditions") or []}

    @cached_property
    def disruption(self) -> tuple[str, str] | None:
        """(reason, message) of a true ``DisruptionTarget`` condition."""
        dt = self.conditions.get("DisruptionTarget")
        if dt is None or _g(dt, "status") != "True":
            return None
        return _g(dt, "reason") or "", str(_g(dt, "message") or "")

    @cached_property
    def status_reason(self) -> Any:
        return _g(self.status, "reason")

    @cached_property
    def status_message(self) -> str:
        return str(_g(self.status, "message") or "")

    @cached_property
    def node_not_ready(self) -> bool:
        """The node's Ready condition is there and not True."""
        conds = _g(_g(self.node, "status") or {}, "conditions") or []
        ready = next((c for c in conds if _g(c, "type") == "Ready"), None)
        return ready is not None and _g(ready, "status") != "True"

    @cached_property
    def terminated(self) -> list[Any]:
        """Terminated states of the containers, and of the init containers that failed the pod.

        An init container that failed (restartPolicy Never) fails the pod before "train" starts:
        its exit code and OOM kill count like the main container's. A native sidecar (an init
        container with restartPolicy Always) that died is restarted by the kubelet: not counted.
        """
        out = []
        for cs in _g(self.status, "container_statuses", "containerStatuses") or []:
            t = _g(_g(cs, "state") or {}, "terminated")
            if t:
                out.append(t)
        sidecars = {
            _g(c, "name")
            for c in _g(_g(self.pod, "spec") or {}, "init_containers", "initContainers") or []
            if _g(c, "restart_policy", "restartPolicy") == "Always"
        }
        for cs in _g(self.status, "init_container_statuses", "initContainerStatuses") or []:
            t = _g(_g(cs, "state") or {}, "terminated")
            if (
                self.phase == "Failed"
                and t
                and _g(cs, "name") not in sidecars
                and (
                    _g(t, "exit_code", "exitCode") not in (None, 0)
                    or _g(t, "reason") == "OOMKilled"
                )
            ):
                out.append(t)
        return out

    @cached_property
    def bad_exits(self) -> list[Any]:
        """The non-zero exit codes among :attr:`terminated`."""
        codes = [_g(t, "exit_code", "exitCode") for t in self.terminated]
        return [c for c in codes if c not in (None, 0)]


Rule = Callable[[Facts], Classification | None]


def _reclaimed(f: Facts, why: str, *evidence: str) -> Classification:
    """Preempted with the cloud's word, or on spot capacity unless Karpenter says it disrupted
    the node itself (consolidation, drift); else an infrastructure disruption."""
    ev = tuple(evidence) + f.cloud
    if f.cloud:
        return Classification(Verdict.PREEMPTED, why, ev)
    if f.karpenter_disruption:
        return _infra(
            f"{why}: Karpenter's own disruption ({f.karpenter_disruption}), not a reclaim",
            *ev,
            f"karpenter disruption {f.karpenter_disruption}",
        )
    if f.spot:
        return Classification(Verdict.PREEMPTED, why, ev)
    return Classification(Verdict.INFRA_DISRUPTION, f"{why} (not on spot capacity)", ev)


def _infra(reason: str, *evidence: str, default_used: bool = False) -> Classification:
    """An infrastructure disruption: retried without spending the user's failure budget."""
    return Classification(Verdict.INFRA_DISRUPTION, reason, evidence, default_used=default_used)


def pod_vanished(f: Facts) -> Classification | None:
    """The pod is gone (404): reclaimed if it had run (or ran on spot), else lost before it ran."""
    if f.pod:
        return None
    preempted = [
        e
        for e in f.events
        if _g(e, "reason") == "Preempted"
        and _g(_g(e, "involved_object", "involvedObject") or {}, "kind") == "Pod"
    ]
    if preempted:  # the kubelet finished the scheduler's graceful delete before we looked
        msg = str(_g(preempted[-1], "message") or "")
        return _infra(
            "preempted by the scheduler for a higher-priority pod (the pod is gone)",
            "pod not found",
            f"event Preempted: {msg}",
        )
    if f.was_running or f.was_spot:
        return _reclaimed(f, "the pod vanished (404) after running", "pod not found")
    return _infra("the pod vanished (404) before it ran", "pod not found")


def pod_succeeded(f: Facts) -> Classification | None:
    """Phase ``Succeeded``."""
    return (
        Classification(Verdict.SUCCEEDED, "the pod succeeded") if f.phase == "Succeeded" else None
    )


def kubelet_termination(f: Facts) -> Classification | None:
    """``DisruptionTarget/TerminationByKubelet``: a graceful node shutdown or a kubelet eviction."""
    if f.disruption is None or f.disruption[0] != "TerminationByKubelet":
        return None
    reason, msg = f.disruption
    if (
        f.status_reason in SHUTDOWN_REASONS
        or any(m in msg or m in f.status_message for m in SHUTDOWN_MESSAGES)
        or "shutdown" in msg.lower()
    ):
        return _reclaimed(f, "graceful node shutdown", f"DisruptionTarget/{reason}")
    return _infra(f"evicted by the kubelet: {msg or 'node pressure'}", f"DisruptionTarget/{reason}")


def node_lost_condition(f: Facts) -> Classification | None:
    """``DisruptionTarget/DeletionByPodGC`` or ``DeletionByTaintManager``: the node was lost."""
    if f.disruption is None or f.disruption[0] not in ("DeletionByPodGC", "DeletionByTaintManager"):
        return None
    reason = f.disruption[0]
    why = "the node was lost" if reason == "DeletionByPodGC" else "the node became unreachable"
    return _reclaimed(f, why, f"DisruptionTarget/{reason}")


# A drain is a reclaim on the cloud's word, or when Karpenter takes its spot node away with no
# disruption decision of its own (its NodeClaim was deleted: how it ends an interrupted
# instance); Karpenter's consolidation or drift never is.
def drain_eviction(f: Facts) -> Classification | None:
    """``DisruptionTarget/EvictionByEvictionAPI``: a drain (a reclaim or not: see above)."""
    if f.disruption is None or f.disruption[0] != "EvictionByEvictionAPI":
        return None
    evidence = f"DisruptionTarget/{f.disruption[0]}"
    if f.cloud:
        return Classification(
            Verdict.PREEMPTED, "drained for a spot interruption", (evidence, *f.cloud)
        )
    if f.karpenter_disruption:
        return _infra(
            f"drained by Karpenter's own disruption ({f.karpenter_disruption}), not a reclaim",
            evidence,
            f"karpenter disruption {f.karpenter_disruption}",
        )
    forceful = karpenter_forceful(f.node, f.events)
    if forceful:
        return _reclaimed(
            f,
            "Karpenter took the node away without a disruption decision of its own (its "
            "NodeClaim was deleted: a spot interruption, an expiry or by hand)",
            evidence,
            forceful,
        )
    return _infra("evicted by a drain without cloud evidence", evidence)


def scheduler_preemption(f: Facts) -> Classification | None:
    """``DisruptionTarget/PreemptionByScheduler``: a higher-priority pod took the place."""
    if f.disruption is None or f.disruption[0] != "PreemptionByScheduler":
        return None
    return _infra(
        "preempted by the scheduler for a higher-priority pod",
        f"DisruptionTarget/{f.disruption[0]}",
    )


def other_disruption(f: Facts) -> Classification | None:
    """Any other ``DisruptionTarget`` reason on a failed pod (safe default)."""
    if f.disruption is None or f.phase != "Failed":
        return None
    reason = f.disruption[0]
    return _infra(f"disruption {reason}", f"DisruptionTarget/{reason}", default_used=True)


def kubelet_shutdown_status(f: Facts) -> Classification | None:
    """A failed pod's ``status.reason`` / ``message`` of the kubelet's graceful node shutdown."""
    if f.phase != "Failed" or not (
        f.status_reason in SHUTDOWN_REASONS or any(m in f.status_message for m in SHUTDOWN_MESSAGES)
    ):
        return None
    return _reclaimed(
        f, "graceful node shutdown (kubelet status)", f"status.reason={f.status_reason}"
    )


def evicted_status(f: Facts) -> Classification | None:
    """``status.reason`` ``Evicted`` on a failed pod: node pressure on K8s < 1.26 (no condition)."""
    if f.phase != "Failed" or f.status_reason != "Evicted":
        return None
    if f.cloud:
        return _reclaimed(f, "evicted while the node was being reclaimed", "status.reason=Evicted")
    return _infra(
        f"evicted by the kubelet: {f.status_message or 'node pressure'}", "status.reason=Evicted"
    )


def node_lost_while_running(f: Facts) -> Classification | None:
    """The node gone, or NotReady on spot or with cloud evidence, while the pod ran."""
    node_gone = f.was_running and f.node_absent and f.phase == "Running" and f.was_spot
    not_ready = f.node_not_ready
    if f.phase not in ("Running", "Unknown") or not (
        node_gone or (not_ready and (f.spot or f.cloud))
    ):
        return None
    return _reclaimed(
        f,
        "the node was lost while the pod ran",
        *(
            f"event {_g(e, 'reason')}"
            for e in f.events
            if _g(e, "reason") in NODE_LOSS_EVENT_REASONS
        ),
        "node gone" if node_gone else "node NotReady",
    )


def oom_killed(f: Facts) -> Classification | None:
    """A container (or an init container that failed the pod) terminated ``OOMKilled``."""
    if not any((_g(t, "reason") or "") == "OOMKilled" for t in f.terminated):
        return None
    return Classification(
        Verdict.OOM_KILLED, "a container was OOM-killed (memory limit)", ("OOMKilled",)
    )


def signal_after_notice(f: Facts) -> Classification | None:
    """Signal exits (130, 137, 143) of a failed pod after a fresh reclaim notice."""
    if f.phase != "Failed":
        return None
    bad = f.bad_exits
    fresh = f.notice_age_s is None or f.notice_age_s <= NOTICE_WINDOW_S
    if not (bad and f.notice and fresh and all(c in SIGNAL_EXITS for c in bad)):
        return None
    return _reclaimed(
        f, f"stopped (exit {bad[0]}) after the reclaim notice", f"exit {bad[0]}", f.notice
    )


def _ts(v: Any) -> float | None:
    """Wall seconds of an API time (a datetime, or RFC 3339 text); None if absent or bad."""
    if v is None:
        return None
    if hasattr(v, "timestamp"):
        return float(v.timestamp())
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


LEASE_ANNOTATION = "airflow-spot/lease-until"  # as checkpoint.training (kept pure here)
LEASE_EXIT = 143  # the helper's exit after saving (checkpoint.training.PREEMPTED_EXIT)


def lease_expired(f: Facts) -> Classification | None:
    """Exit 143 past the pod's lease: unwatched, it saved and stopped itself (infra)."""
    ann = _g(_g(f.pod, "metadata") or {}, "annotations") or {}
    try:
        until = float(ann.get(LEASE_ANNOTATION) or "")
    except ValueError:
        return None
    ended = [
        _ts(_g(t, "finished_at", "finishedAt"))
        for t in f.terminated
        if _g(t, "exit_code", "exitCode") == LEASE_EXIT
    ]
    if f.phase != "Failed" or not ended or (ended[0] is not None and ended[0] + 1.0 < until):
        return None
    return _infra(
        "lease expired: no operator or trigger renewed it; checkpointed and stopped by itself",
        f"annotation {LEASE_ANNOTATION}={until:.0f}",
        f"exit {LEASE_EXIT}",
    )


def exit_on_healthy_capacity(f: Facts) -> Classification | None:
    """Non-zero exits of a failed pod with no cloud evidence and no NotReady node."""
    bad = f.bad_exits
    if f.phase != "Failed" or not bad or f.cloud or f.node_not_ready:
        return None
    return Classification(
        Verdict.APP_FAILURE,
        f"exit code {bad[0]} on healthy capacity",
        tuple(f"exit {c}" for c in bad),
    )


def exit_while_reclaimed(f: Facts) -> Classification | None:
    """Non-zero exits of a failed pod with cloud evidence or a NotReady node."""
    bad = f.bad_exits
    if f.phase != "Failed" or not bad or not (f.cloud or f.node_not_ready):
        return None
    return _reclaimed(
        f, f"killed (exit {bad[0]}) while the node was being reclaimed", f"exit {bad[0]}"
    )


def failed_unexplained(f: Facts) -> Classification | None:
    """Phase ``Failed`` that no signal above explains (safe default)."""
    if f.phase != "Failed":
        return None
    return _infra(
        f"failed without a known signal (reason {f.status_reason!r})",
        f"status.reason={f.status_reason}",
        default_used=True,
    )


def container_cannot_start(f: Facts) -> Classification | None:
    """A pending pod's container waiting on an image or config error (fatal ones at once)."""
    start_error = container_start_error(f.pod) if f.phase == "Pending" else None
    if not start_error or not (
        start_error[0] in CONTAINER_START_FATAL or f.start_error_for_s >= f.pending_timeout_s
    ):
        return None
    reason, msg = start_error
    return Classification(
        Verdict.APP_FAILURE,
        f"the container cannot start ({reason}"
        + (f" for {f.start_error_for_s:.0f} s" if f.start_error_for_s else "")
        + f"): {msg or 'check the image name, its registry credentials and the pod config'}",
        (f"waiting/{reason}",),
    )


def unschedulable_too_long(f: Facts) -> Classification | None:
    """Condition ``PodScheduled=False/Unschedulable`` of a pending pod past ``pending_timeout_s``."""
    if f.phase != "Pending":
        return None
    sched = f.conditions.get("PodScheduled")
    unschedulable = (
        sched is not None
        and _g(sched, "status") == "False"
        and _g(sched, "reason") == "Unschedulable"
    )
    if not (unschedulable and f.pending_for_s >= f.pending_timeout_s):
        return None
    return Classification(
        Verdict.SPOT_UNAVAILABLE if f.was_spot is not False else Verdict.INFRA_DISRUPTION,
        f"unschedulable for {f.pending_for_s:.0f} s: {_g(sched, 'message') or 'no capacity'}",
        ("PodScheduled=False/Unschedulable",),
    )


def still_pending(f: Facts) -> Classification | None:
    """Phase ``Pending``."""
    return Classification(Verdict.PENDING, "pending") if f.phase == "Pending" else None


def still_running(f: Facts) -> Classification | None:
    """Phase ``Running``."""
    return Classification(Verdict.RUNNING, "running") if f.phase == "Running" else None


def unknown_phase(f: Facts) -> Classification | None:
    """Any other phase (safe default): answers every pod, so it comes last."""
    return _infra(f"unknown pod phase {f.phase!r}", f"phase={f.phase}", default_used=True)


# The rules in order: the first that answers (not None) decides. Order matters: a rule may
# count on the ones above it having passed (the exits after the notice before the other exits).
RULES: tuple[Rule, ...] = (
    pod_vanished,
    pod_succeeded,
    kubelet_termination,
    node_lost_condition,
    drain_eviction,
    scheduler_preemption,
    other_disruption,
    kubelet_shutdown_status,
    evicted_status,
    node_lost_while_running,
    oom_killed,
    signal_after_notice,
    lease_expired,
    exit_on_healthy_capacity,
    exit_while_reclaimed,
    failed_unexplained,
    container_cannot_start,
    unschedulable_too_long,
    still_pending,
    still_running,
    unknown_phase,
)


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
    """Classify a training pod: the first of :data:`RULES` that answers.

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
    facts = Facts.of(
        pod,
        node,
        events,
        was_spot=was_spot,
        was_running=was_running,
        pending_for_s=pending_for_s,
        pending_timeout_s=pending_timeout_s,
        notice=notice,
        notice_age_s=notice_age_s,
        start_error_for_s=start_error_for_s,
    )
    for rule in RULES:
        verdict = rule(facts)
        if verdict is not None:
            return verdict
    raise AssertionError("unreachable: the last rule answers every pod")
