"""Reading a pod and its events as the API server returns them: wall times, the hold, the
exit code, which object an event is about. Plain functions over the client's model objects
(or anything shaped like them); no API calls."""

from __future__ import annotations

import time
from typing import Any

from airflow_spot.backends.kubernetes.reading import wall_time
from airflow_spot.backends.kubernetes.vocabulary import (
    HOLD_ANNOTATION,
    LAUNCHED_ANNOTATION,
    RELEASED_ANNOTATION,
)
from airflow_spot.jobstate import AttemptHandle


def same_object(event: Any, uid: str | None, since: float | None, alias: str | None = None) -> bool:
    """The event is about the object with ``uid`` (when both are known) and not older than
    ``since`` (with a minute's slack for clock skew between nodes and the API server). The
    kubelet, the node lifecycle controller and node-problem-detector give a node event the
    node's name as uid (``alias``): only the time tells those apart."""
    inv = getattr(event, "involved_object", None)
    ev_uid = getattr(inv, "uid", None)
    if uid and ev_uid and ev_uid not in (uid, alias):
        return False
    if since is None:
        return True
    meta = getattr(event, "metadata", None)
    times = [
        wall_time(getattr(event, "last_timestamp", None)),
        wall_time(getattr(event, "event_time", None)),
        wall_time(getattr(event, "first_timestamp", None)),
        wall_time(getattr(meta, "creation_timestamp", None)),
    ]
    newest = max((t for t in times if t is not None), default=None)
    return newest is None or newest >= since - 60.0


def event_kind(event: Any) -> str:
    inv = getattr(event, "involved_object", None)
    return getattr(inv, "kind", "") or ""


def pod_launched_at(pod: Any) -> float:
    """When the pod was launched: our annotation (to the microsecond), else its
    creationTimestamp (whole seconds: a pod of an earlier release), else now."""
    try:
        return float((pod.metadata.annotations or {})[LAUNCHED_ANNOTATION])
    except (KeyError, TypeError, ValueError):
        return wall_time(pod.metadata.creation_timestamp) or time.time()


def launched_attempt(
    pod: str, namespace: str, attempt: int, capacity: str, launched_at: float
) -> AttemptHandle:
    """The handle of an attempt pod as the backend's launch makes it: pending since its launch,
    not seen running, no notice sent."""
    return AttemptHandle(
        launched_at=launched_at,
        kind="kubernetes",
        attempt=attempt,
        capacity=capacity,
        namespace=namespace,
        pod=pod,
        # an on-demand pod that cannot schedule is not "spot unavailable"
        was_spot=capacity == "spot",
        was_running=False,
        notice_sent=False,
        pending_since=launched_at,
    )


def found_attempt(pod: Any, namespace: str) -> AttemptHandle | None:
    """The handle of an attempt pod found in the cluster (its attempt and capacity read from
    its labels, its launch from :func:`pod_launched_at`), as the launch made it; None for a pod
    of no attempt."""
    lab = pod.metadata.labels or {}
    if not str(lab.get("airflow-spot/attempt", "")).isdigit():
        return None
    capacity = lab.get("airflow-spot/capacity", "")
    attempt = int(lab["airflow-spot/attempt"])
    return launched_attempt(pod.metadata.name, namespace, attempt, capacity, pod_launched_at(pod))


def pod_times(pod: Any) -> tuple[float | None, float | None, float | None]:
    """(scheduled, container started, container finished) wall times from the pod."""
    if pod is None or pod.status is None:
        return None, None, None
    granted = None
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "True":
            granted = wall_time(c.last_transition_time)
    started = finished = None
    for cs in pod.status.container_statuses or []:
        st = cs.state
        if st and st.running:
            started = wall_time(st.running.started_at)
        if st and st.terminated:
            started = started or wall_time(st.terminated.started_at)
            finished = wall_time(st.terminated.finished_at)
    return granted, started, finished


def hold_state(pod: Any, started: float | None) -> tuple[bool, float | None]:
    """(the pod is held: not released yet, when training began). Held, ``started`` is when it
    became ready; released, training began at the later of its container's start and the
    release."""
    ann = (pod.metadata.annotations if pod is not None and pod.metadata else None) or {}
    hold = ann.get(HOLD_ANNOTATION)
    if hold is None or started is None:
        return False, started
    if hold != "go":
        return True, started
    try:
        released = float(ann.get(RELEASED_ANNOTATION) or "")
    except ValueError:
        return False, started
    return False, max(started, released)


def pod_exit_code(pod: Any) -> int | None:
    if pod is None or pod.status is None:
        return None
    for cs in pod.status.container_statuses or []:
        if cs.state and cs.state.terminated:
            return cs.state.terminated.exit_code
    failed = failed_init(pod)
    return failed.state.terminated.exit_code if failed is not None else None


def failed_init(pod: Any) -> Any:
    """The status of an init container that exited non-zero, or None."""
    if pod is None or pod.status is None:
        return None
    for cs in pod.status.init_container_statuses or []:
        if cs.state and cs.state.terminated and cs.state.terminated.exit_code:
            return cs
    return None
