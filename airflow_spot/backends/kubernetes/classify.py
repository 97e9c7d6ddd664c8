"""What happened to a training pod: a pure function over the pod, its node and their events.

Each signal is read by one small rule; :data:`RULES` holds them in order and the first that
answers decides. Anything else falls to a safe default (infrastructure disruption: retried
without spending the user's failure budget) and the caller logs it. A rule reads
:class:`~.facts.Facts`; the words it looks for (and their sources) are in :mod:`.vocabulary`:
a new signal is one constant there and one rule here.

Pure: no Kubernetes client import; pods, nodes and events come as model objects or API dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from airflow_spot.backends.kubernetes.facts import (
    Facts,
    container_start_error,
    karpenter_forceful,
)
from airflow_spot.backends.kubernetes.reading import pick, wall_time
from airflow_spot.backends.kubernetes.vocabulary import (
    CONTAINER_START_FATAL,
    LEASE_ANNOTATION,
    LEASE_EXIT,
    NODE_LOSS_EVENT_REASONS,
    NOTICE_WINDOW_S,
    SHUTDOWN_MESSAGES,
    SHUTDOWN_REASONS,
    SIGNAL_EXITS,
    STORAGE_EXIT,
)


class Verdict(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    SPOT_UNAVAILABLE = "spot_unavailable"
    INFRA_DISRUPTION = "infra_disruption"
    OOM_KILLED = "oom_killed"
    APP_FAILURE = "app_failure"
    CHECKPOINT_UNWRITABLE = "checkpoint_unwritable"


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    reason: str
    evidence: tuple[str, ...] = field(default_factory=tuple)
    default_used: bool = False  # no known signal matched: the safe default was taken

    @property
    def terminal(self) -> bool:
        return self.verdict not in (Verdict.PENDING, Verdict.RUNNING)


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
        if pick(e, "reason") == "Preempted"
        and pick(pick(e, "involved_object", "involvedObject") or {}, "kind") == "Pod"
    ]
    if preempted:  # the kubelet finished the scheduler's graceful delete before we looked
        msg = str(pick(preempted[-1], "message") or "")
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
            f"event {pick(e, 'reason')}"
            for e in f.events
            if pick(e, "reason") in NODE_LOSS_EVENT_REASONS
        ),
        "node gone" if node_gone else "node NotReady",
    )


def oom_killed(f: Facts) -> Classification | None:
    """A container (or an init container that failed the pod) terminated ``OOMKilled``."""
    if not any((pick(t, "reason") or "") == "OOMKilled" for t in f.terminated):
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


def lease_expired(f: Facts) -> Classification | None:
    """Exit 143 past the pod's lease: unwatched, it saved and stopped itself (infra)."""
    ann = pick(pick(f.pod, "metadata") or {}, "annotations") or {}
    try:
        until = float(ann.get(LEASE_ANNOTATION) or "")
    except ValueError:
        return None
    ended = [
        wall_time(pick(t, "finished_at", "finishedAt"))
        for t in f.terminated
        if pick(t, "exit_code", "exitCode") == LEASE_EXIT
    ]
    if f.phase != "Failed" or not ended or (ended[0] is not None and ended[0] + 1.0 < until):
        return None
    return _infra(
        "lease expired: no operator or trigger renewed it; checkpointed and stopped by itself",
        f"annotation {LEASE_ANNOTATION}={until:.0f}",
        f"exit {LEASE_EXIT}",
    )


def checkpoint_unwritable(f: Facts) -> Classification | None:
    """Exit 73 of a failed pod on healthy capacity: its checkpoint location took no writes."""
    bad = f.bad_exits
    if f.phase != "Failed" or STORAGE_EXIT not in bad or f.cloud or f.node_not_ready:
        return None
    return Classification(
        Verdict.CHECKPOINT_UNWRITABLE,
        f"the checkpoint location took no writes (exit {STORAGE_EXIT}; the log says why)",
        (f"exit {STORAGE_EXIT}",),
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
        and pick(sched, "status") == "False"
        and pick(sched, "reason") == "Unschedulable"
    )
    if not (unschedulable and f.pending_for_s >= f.pending_timeout_s):
        return None
    return Classification(
        Verdict.SPOT_UNAVAILABLE if f.was_spot is not False else Verdict.INFRA_DISRUPTION,
        f"unschedulable for {f.pending_for_s:.0f} s: {pick(sched, 'message') or 'no capacity'}",
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
    checkpoint_unwritable,
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
