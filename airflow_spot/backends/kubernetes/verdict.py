"""One look at an attempt's pod, judged: a pure function from what the API showed to the
attempt's status and what the handle should record.

:func:`judge` takes the handle as it was, the pod, its node and their events as read (model
objects; None for a pod or node that is gone) and the time of the look. It reads no clock,
calls nothing and changes none of its inputs: the backend's ``status`` reads the cluster,
calls it, and writes :attr:`Judgement.record` into the handle. What the handle keeps (the
pod's node, its capacity, the first reclaim notice) makes a verdict possible after the node
is gone; what the cluster should have done next is in the status's ``due``, for
``carry_out``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from airflow_spot.backends.base import AttemptStatus, Outcome, State
from airflow_spot.backends.kubernetes.classify import Classification, Verdict, classify
from airflow_spot.backends.kubernetes.facts import (
    container_start_error,
    interruption_notice,
    is_cloud_notice,
    node_is_spot,
)
from airflow_spot.backends.kubernetes.podread import (
    event_kind,
    hold_state,
    pod_exit_code,
    pod_times,
    wall_time,
)
from airflow_spot.jobstate import AttemptHandle

RELAY_NOTICE = "relay_notice"  # what a status may find due (see the backend's carry_out)
GIVE_UP = "give_up"
OUTCOMES = {
    Verdict.SUCCEEDED: Outcome.SUCCEEDED,
    Verdict.PREEMPTED: Outcome.PREEMPTED,
    Verdict.SPOT_UNAVAILABLE: Outcome.SPOT_UNAVAILABLE,
    Verdict.INFRA_DISRUPTION: Outcome.INFRA_DISRUPTION,
    Verdict.OOM_KILLED: Outcome.OOM_KILLED,
    Verdict.APP_FAILURE: Outcome.APP_FAILURE,
    Verdict.CHECKPOINT_UNWRITABLE: Outcome.CHECKPOINT_UNWRITABLE,
}


@dataclass(frozen=True)
class Judgement:
    """The status of the attempt, the handle's fields to record (only those that change), and
    whether no known signal explained the pod (the safe default was taken: worth a warning)."""

    status: AttemptStatus
    record: dict[str, Any]
    default_used: bool = False


def identities(handle: AttemptHandle, pod: Any, node: Any) -> dict[str, Any]:
    """The uids that tell this pod and its node from namesakes (a cleared task's attempt 1, a
    recreated VM): the pod's always, the node's the first time it is seen."""
    out: dict[str, Any] = {}
    if pod is not None and pod.metadata is not None and pod.metadata.uid:
        out["pod_uid"] = pod.metadata.uid
    if node is not None and node.metadata is not None and handle.node_uid is None:
        out["node_uid"] = node.metadata.uid  # the node the pod ran on, not a namesake
        out["node_created"] = wall_time(node.metadata.creation_timestamp)
    return out


def judge(
    handle: AttemptHandle,
    pod: Any,
    node: Any,
    events: list[Any],
    now: float,
    *,
    pending_timeout_s: float = 600.0,
) -> Judgement:
    """Judge one look at the attempt (see the module's notes); ``now`` is the look's time."""
    record = recorded(handle, pod, node, events, now)
    seen = replace(handle, **record)  # the handle as this look leaves it
    phase = _phase(pod)
    due: list[str] = []
    if _notice(node, events) and pod is not None and phase == "Running" and not seen.notice_sent:
        due.append(RELAY_NOTICE)
    verdict = _classification(seen, pod, node, events, now, pending_timeout_s)
    if verdict.terminal and phase == "Pending":
        # it never ran but still holds (or waits for) a node: with delete_pods="never" it
        # would start later and train beside the next attempt
        due.append(GIVE_UP)
    return Judgement(_status(seen, pod, verdict, tuple(due), now), record, verdict.default_used)


def recorded(
    handle: AttemptHandle, pod: Any, node: Any, events: list[Any], now: float
) -> dict[str, Any]:
    """What the look records in the handle: the uids, the pod's node and its capacity, that it
    ran, the first reclaim notice and since when a container cannot start."""
    h = replace(handle, **identities(handle, pod, node))
    phase = _phase(pod)
    if pod is not None and node is not None:
        h.node = (pod.spec.node_name if pod.spec else None) or handle.node
        spot = node_is_spot(node)
        if spot is not None:
            h.was_spot = spot
    if phase == "Running":
        h.was_running = True
    if phase != "Pending":
        h.pending_since = None
    notice = _notice(node, events)
    if notice:
        # kept: the node (and its taints) may be gone at the verdict. The first one stays,
        # unless a later look shows the cloud's own word where the first was not (a drain's
        # karpenter.sh/disrupted taint alone reads as a consolidation at the verdict)
        if h.notice is None or (is_cloud_notice(notice) and not is_cloud_notice(h.notice)):
            h.notice = notice
        if h.notice_at is None:
            h.notice_at = now
    if phase == "Pending" and container_start_error(pod):
        if h.start_error_since is None:
            h.start_error_since = now
    else:
        h.start_error_since = None
    return {k: v for k, v in vars(h).items() if getattr(handle, k) != v}


def _phase(pod: Any) -> str | None:
    return pod.status.phase if pod is not None and pod.status else None


def _notice(node: Any, events: list[Any]) -> str | None:
    """The node's reclaim notice, from it and its events (the pod's own events say none)."""
    if node is None:
        return None
    return interruption_notice(node, [e for e in events if event_kind(e) != "Pod"])


def _classification(
    h: AttemptHandle, pod: Any, node: Any, events: list[Any], now: float, pending_timeout_s: float
) -> Classification:
    """The pod's verdict, from what the handle holds as this look leaves it."""
    if pod is None and h.gave_up:  # we deleted it: the 404 now is ours, not a reclaim
        return Classification(Verdict(h.gave_up[0]), h.gave_up[1], tuple(h.gave_up[2]))
    _, _, finished = pod_times(pod)
    return classify(
        pod,
        node,
        events,
        was_spot=h.was_spot,
        was_running=bool(h.was_running),
        pending_for_s=now - h.pending_since if h.pending_since else 0.0,
        pending_timeout_s=pending_timeout_s,
        notice=h.notice,
        notice_age_s=(finished or now) - h.notice_at if h.notice_at else None,
        start_error_for_s=now - h.start_error_since if h.start_error_since is not None else 0.0,
    )


def _status(
    h: AttemptHandle, pod: Any, verdict: Classification, due: tuple[str, ...], now: float
) -> AttemptStatus:
    granted, started, finished = pod_times(pod)
    held, started = hold_state(pod, started)
    base: dict[str, Any] = dict(
        capacity=h.capacity or "",
        attempt=int(h.attempt or 0),
        launched_at=float(h.launched_at or 0),
        granted_at=granted,
        started_at=None if held else started,
        # ready to take over: held, its container started, no reclaim notice on its node
        ready_at=started if held and not h.notice else None,
        heartbeat=now,
        due=due,
        evidence={
            "node": h.node,
            "spot_node": h.was_spot,
            "signals": list(verdict.evidence),
            "notice": h.notice,
        },
    )
    if verdict.verdict is Verdict.RUNNING:
        running = State.LAUNCHING if held else State.RUNNING  # held: its changeover
        return AttemptStatus(State.PREEMPTING if h.notice_sent or due else running, **base)
    if verdict.verdict is Verdict.PENDING:
        return AttemptStatus(State.WAITING if h.capacity == "spot" else State.LAUNCHING, **base)
    return AttemptStatus(
        State.ENDED,
        ended_at=finished or now,
        outcome=OUTCOMES[verdict.verdict],
        reason=verdict.reason,
        exit_code=pod_exit_code(pod),
        **base,
    )
