"""What the rules of :mod:`.classify` read: a pod, its node and their events made into
:class:`Facts`, and the questions about them the backend also asks (is the node spot, does it
show a reclaim notice, can the container start).

Pure: no Kubernetes client import. It accepts Kubernetes model objects (anything with
``to_dict()``) or plain API JSON dicts (camelCase), and reads each field under both spellings
(:mod:`.reading`); the words it looks for are in :mod:`.vocabulary`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from airflow_spot.backends.kubernetes.reading import as_dict, pick
from airflow_spot.backends.kubernetes.vocabulary import (
    CLOUD_NOTICES,
    CONTAINER_START_ERRORS,
    CONTAINER_START_FATAL,
    KARPENTER_DISRUPTING,
    KARPENTER_DISRUPTING_PREFIXES,
    KARPENTER_EVICTED,
    KARPENTER_EVICTED_PREFIX,
    KARPENTER_FORCEFUL,
    KARPENTER_NODEPOOL,
    SCHEDULER_EVENT_REASONS,
    SPOT_EVENT_REASONS,
    SPOT_LABELS,
    SPOT_TAINTS,
)


def _scheduled_preempt(e: Mapping[str, Any]) -> bool:
    """An Azure scheduled "Preempt" event relayed onto the node (not the scheduler's words)."""
    inv = pick(e, "involved_object", "involvedObject") or {}
    return (
        "Preempt" in str(pick(e, "message") or "")
        and (pick(inv, "kind") or "Node") != "Pod"
        and (pick(e, "reason") or "") not in SCHEDULER_EVENT_REASONS
    )


def _karpenters(e: Mapping[str, Any]) -> bool:
    """The event is Karpenter's (or says nothing of who wrote it)."""
    source = pick(pick(e, "source") or {}, "component") or pick(
        e, "reporting_component", "reportingComponent", "reporting_controller"
    )
    return source in (None, "", "karpenter")


def karpenter_disruption(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The reason Karpenter's disruption controller gave for draining the node (``Underutilized``,
    ``Empty``, ``Drifted``), from its ``DisruptionTerminating`` or ``Evicted`` event; None if
    it gave none (no decision of its own, or not Karpenter)."""
    for e in events:
        reason, msg = pick(e, "reason"), str(pick(e, "message") or "")
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
            pick(e, "reason") == KARPENTER_EVICTED
            and str(pick(e, "message") or "").strip()
            == KARPENTER_EVICTED_PREFIX + KARPENTER_FORCEFUL
            and _karpenters(e)
        ):
            return f"event {KARPENTER_EVICTED}: {KARPENTER_FORCEFUL}"
    meta = pick(node, "metadata") or {}
    taints = {pick(t, "key") for t in pick(pick(node, "spec") or {}, "taints") or []}
    if (
        KARPENTER_NODEPOOL in (pick(meta, "labels") or {})
        and pick(meta, "deletion_timestamp", "deletionTimestamp")
        and "karpenter.sh/disrupted" in taints
    ):
        return "Karpenter's node deleted without a disruption decision"
    return None


def node_is_spot(node: Any) -> bool | None:
    """True/False from the node's capacity labels; None if the node is unknown."""
    n = as_dict(node)
    if not n:
        return None
    labels = pick(pick(n, "metadata") or {}, "labels") or {}
    return any(
        str(labels.get(k, "")).lower() in {v.lower() for v in vals}
        for k, vals in SPOT_LABELS.items()
    )


def placement_is_spot(pod: Any) -> bool:
    """The pod's own placement requires spot: a node selector, or a required node-affinity
    ``In`` term in every alternative, on a spot capacity label (its node may be gone)."""
    spec = pick(as_dict(pod), "spec") or {}
    spot = {k: {v.lower() for v in vals} for k, vals in SPOT_LABELS.items()}
    selector = pick(spec, "node_selector", "nodeSelector") or {}
    if any(str(selector.get(k, "")).lower() in vals for k, vals in spot.items()):
        return True
    node_aff = pick(pick(spec, "affinity") or {}, "node_affinity", "nodeAffinity") or {}
    required = pick(
        node_aff,
        "required_during_scheduling_ignored_during_execution",
        "requiredDuringSchedulingIgnoredDuringExecution",
    )
    terms = pick(required or {}, "node_selector_terms", "nodeSelectorTerms") or []

    def term_spot(term: Any) -> bool:
        for e in pick(term, "match_expressions", "matchExpressions") or []:
            values = {str(v).lower() for v in pick(e, "values") or []}
            key = pick(e, "key")
            if pick(e, "operator") == "In" and key in spot and values and values <= spot[key]:
                return True
        return False

    return bool(terms) and all(term_spot(t) for t in terms)


def interruption_notice(node: Any, events: Iterable[Any] = ()) -> str | None:
    """Evidence that the node is about to be reclaimed (so the pod should checkpoint now): the
    cloud's own word first (:data:`CLOUD_NOTICES`), then Karpenter's disruption taint."""
    n = as_dict(node)
    taints = [pick(t, "key") for t in pick(pick(n, "spec") or {}, "taints") or []]
    for key in taints:
        if key in SPOT_TAINTS:
            return f"node taint {key}"
    for ev in events:  # the cloud's own word before Karpenter's taint, which consolidation sets too
        e = as_dict(ev)
        reason = pick(e, "reason") or ""
        if reason in SPOT_EVENT_REASONS or reason in ("InstanceTerminating", "InstanceStopping"):
            return f"event {reason}"
        if _scheduled_preempt(e):
            return "scheduled event Preempt"
    if "karpenter.sh/disrupted" in taints:
        return "node taint karpenter.sh/disrupted"
    for c in pick(pick(n, "status") or {}, "conditions") or []:
        if (
            pick(c, "type") == "Ready"
            and pick(c, "status") != "True"
            and "shutting down" in str(pick(c, "message") or "")
        ):
            return "node shutting down"
    return None


def container_start_error(pod: Any) -> tuple[str, str] | None:
    """(reason, message) of a container (init containers included) waiting on an error that
    keeps it from starting."""
    status = pick(as_dict(pod), "status") or {}
    statuses = [
        *(pick(status, "init_container_statuses", "initContainerStatuses") or []),
        *(pick(status, "container_statuses", "containerStatuses") or []),
    ]
    for cs in statuses:
        w = pick(pick(cs, "state") or {}, "waiting")
        reason = pick(w, "reason") or ""
        if reason in CONTAINER_START_ERRORS or reason in CONTAINER_START_FATAL:
            return reason, str(pick(w, "message") or "")
    return None


def is_cloud_notice(notice: str | None) -> bool:
    """The recorded notice is the cloud's own word that the capacity is being reclaimed."""
    return bool(notice) and str(notice).startswith(CLOUD_NOTICES)


def _cloud_evidence(node: Mapping[str, Any], events: list[dict[str, Any]]) -> list[str]:
    out = []
    for t in pick(pick(node, "spec") or {}, "taints") or []:
        if pick(t, "key") in SPOT_TAINTS:
            out.append(f"taint {pick(t, 'key')}")
    for e in events:
        reason = pick(e, "reason") or ""
        if reason in SPOT_EVENT_REASONS:
            out.append(f"event {reason}")
        elif _scheduled_preempt(e):
            out.append("event Preempt (scheduled events)")
    return out


@dataclass(frozen=True)
class Facts:
    """What the rules of :func:`.classify.classify` read: the pod, its node and their events
    as API dicts, and what the caller recorded earlier (see ``classify`` for each record)."""

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
        """The facts of Kubernetes model objects or API dicts (``records``: as ``classify``)."""
        p, n = as_dict(pod), as_dict(node)
        return cls(p, n, tuple(as_dict(e) for e in events), node_absent=node is None, **records)

    @cached_property
    def karpenter_disruption(self) -> str | None:
        """Karpenter's own disruption reason for the drain (see :func:`karpenter_disruption`)."""
        return karpenter_disruption(self.events)

    @cached_property
    def status(self) -> Mapping[str, Any]:
        return pick(self.pod, "status") or {}

    @cached_property
    def phase(self) -> str:
        return pick(self.status, "phase") or "Pending"

    @cached_property
    def conditions(self) -> dict[Any, Any]:
        """The pod's conditions by type."""
        return {(pick(c, "type")): c for c in pick(self.status, "conditions") or []}

    @cached_property
    def disruption(self) -> tuple[str, str] | None:
        """(reason, message) of a true ``DisruptionTarget`` condition."""
        dt = self.conditions.get("DisruptionTarget")
        if dt is None or pick(dt, "status") != "True":
            return None
        return pick(dt, "reason") or "", str(pick(dt, "message") or "")

    @cached_property
    def status_reason(self) -> Any:
        return pick(self.status, "reason")

    @cached_property
    def status_message(self) -> str:
        return str(pick(self.status, "message") or "")

    @cached_property
    def node_not_ready(self) -> bool:
        """The node's Ready condition is there and not True."""
        conds = pick(pick(self.node, "status") or {}, "conditions") or []
        ready = next((c for c in conds if pick(c, "type") == "Ready"), None)
        return ready is not None and pick(ready, "status") != "True"

    @cached_property
    def terminated(self) -> list[Any]:
        """Terminated states of the containers, and of the init containers that failed the pod.

        An init container that failed (restartPolicy Never) fails the pod before "train" starts:
        its exit code and OOM kill count like the main container's. A native sidecar (an init
        container with restartPolicy Always) that died is restarted by the kubelet: not counted.
        """
        out = []
        for cs in pick(self.status, "container_statuses", "containerStatuses") or []:
            t = pick(pick(cs, "state") or {}, "terminated")
            if t:
                out.append(t)
        sidecars = {
            pick(c, "name")
            for c in pick(pick(self.pod, "spec") or {}, "init_containers", "initContainers") or []
            if pick(c, "restart_policy", "restartPolicy") == "Always"
        }
        for cs in pick(self.status, "init_container_statuses", "initContainerStatuses") or []:
            t = pick(pick(cs, "state") or {}, "terminated")
            if (
                self.phase == "Failed"
                and t
                and pick(cs, "name") not in sidecars
                and (
                    pick(t, "exit_code", "exitCode") not in (None, 0)
                    or pick(t, "reason") == "OOMKilled"
                )
            ):
                out.append(t)
        return out

    @cached_property
    def bad_exits(self) -> list[Any]:
        """The non-zero exit codes among :attr:`terminated`."""
        codes = [pick(t, "exit_code", "exitCode") for t in self.terminated]
        return [c for c in codes if c not in (None, 0)]
