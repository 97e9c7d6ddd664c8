"""Each rank of a gang, seen alone: what one look shows of its pod and node, classified by
:func:`~.classify.classify`, and the part it plays in the gang's end (pure; the verdict that
puts the ranks together is :mod:`.gang_verdict`'s).

A rank's *role*: ``pending``, ``running``, ``succeeded``; ``infra`` (the infrastructure took
it: its node reclaimed, drained, NotReady or gone); ``app`` (a non-zero exit on healthy
capacity, or a container that cannot start); ``stopped`` (ended by the gang's own end: a
signal exit while its pod was being deleted, or its pod gone from a healthy node, or never
placed). With the role goes *when* it showed (``at``, wall seconds; None where the cluster
does not say, as for a node that is gone).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_spot.backends.kubernetes.classify import Classification, Verdict, classify
from airflow_spot.backends.kubernetes.facts import interruption_notice
from airflow_spot.backends.kubernetes.gang_launch import INDEX
from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time
from airflow_spot.backends.kubernetes.vocabulary import (
    DRAIN_TAINTS,
    HOLD_ANNOTATION,
    RELEASED_ANNOTATION,
    SIGNAL_EXITS,
)
from airflow_spot.jobstate import AttemptHandle

# How a rank that died of a peer's loss words it (gloo, NCCL, JAX's coordination service,
# torch.distributed): a consequence, never a cause, when another rank failed in that second.
# Words of an error, not of a library's name: every rank's log names gloo or NCCL.
COLLECTIVE_ERRORS = (
    "allgather failed",
    "allreduce failed",
    "broadcast failed",
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "heartbeat timeout",
    "stopped sending heartbeats",
    "the tasks have crashed",
    "nccl error",
    "ncclremoteerror",
    "collective operation timeout",
    "deadline_exceeded",
    "barrier failed",
    "barrier timed out",
)
INFRA_VERDICTS = {Verdict.PREEMPTED, Verdict.SPOT_UNAVAILABLE, Verdict.INFRA_DISRUPTION}
APP_VERDICTS = {Verdict.APP_FAILURE, Verdict.OOM_KILLED, Verdict.CHECKPOINT_UNWRITABLE}


@dataclass(frozen=True)
class GangLook:
    """One look at a gang, as API dicts: its Job (``{}`` when gone), rank pods, placeholders,
    every node a rank is or was on (``None`` when gone), and events by their object's name
    (already matched to this pod or node), at wall time ``now``."""

    nodes: int
    job: dict[str, Any]
    pods: tuple[dict[str, Any], ...]
    placeholders: tuple[dict[str, Any], ...]
    node_objects: Mapping[str, dict[str, Any] | None]
    events: Mapping[str, tuple[dict[str, Any], ...]]
    now: float

    @classmethod
    def of(
        cls,
        nodes: int,
        job: Any,
        pods: Iterable[Any],
        placeholders: Iterable[Any],
        node_objects: Mapping[str, Any],
        events: Mapping[str, Iterable[Any]],
        now: float,
    ) -> GangLook:
        """From the client's model objects (or API dicts)."""
        return cls(
            nodes,
            as_dict(job),
            tuple(as_dict(p) for p in pods),
            tuple(as_dict(p) for p in placeholders),
            {k: (as_dict(v) if v is not None else None) for k, v in node_objects.items()},
            {k: tuple(as_dict(e) for e in v) for k, v in events.items()},
            now,
        )


@dataclass(frozen=True)
class RankView:
    """One rank as a look shows it (see the module's notes)."""

    rank: int
    pod: str | None
    node: str | None
    phase: str  # the pod's phase, "Gone" when it vanished, "Missing" when never made
    verdict: Classification
    role: str
    at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    collective: bool = False  # its termination message reads as a peer's failure
    live: bool = False  # its pod still runs, and is not being deleted: to stop
    signals: tuple[str, ...] = field(default=())

    @property
    def outcome(self) -> str:
        if self.role == "infra":
            return self.verdict.verdict.value
        return {"app": "failed"}.get(self.role, self.role)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pod": self.pod,
            "node": self.node,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "reason": self.verdict.reason,
        }


def rank_nodes(joined: str | None, n: int) -> list[str]:
    """Each rank's node as the handle records it (``""``: not seen yet)."""
    parts = (joined or "").split(",")
    return (parts + [""] * n)[:n]


def rank_of(pod: Mapping[str, Any]) -> int | None:
    """A rank pod's index (its completion index)."""
    meta = pick(pod, "metadata") or {}
    raw = (pick(meta, "annotations") or {}).get(INDEX) or (pick(meta, "labels") or {}).get(INDEX)
    return int(str(raw)) if str(raw or "").isdigit() else None


def view_ranks(
    seen: AttemptHandle, look: GangLook, pending_timeout_s: float = 600.0
) -> list[RankView]:
    """Every rank of the gang (a rank whose pod is gone and whose node shows no trouble is
    ``stopped``; ``pending_timeout_s``: how long a container may fail to start)."""
    pods: dict[int, dict[str, Any]] = {}
    for p in look.pods:
        k = rank_of(p)
        if k is not None and k < look.nodes and (k not in pods or _deleting(pods[k])):
            pods[k] = p
    names = rank_nodes(seen.node, look.nodes)
    out = []
    for k in range(look.nodes):
        pod = pods.get(k)
        node = pick(pick(pod, "spec") or {}, "node_name", "nodeName") if pod else None
        out.append(_view(seen, look, k, pod, node or names[k] or None, pending_timeout_s))
    return out


def _view(
    seen: AttemptHandle,
    look: GangLook,
    k: int,
    pod: dict[str, Any] | None,
    node_name: str | None,
    pending_timeout_s: float,
) -> RankView:
    node = look.node_objects.get(node_name) if node_name else None
    events = [*look.events.get(_name(pod), ()), *look.events.get(node_name or "", ())]
    if pod is None:
        return _vanished(seen, look, k, node_name, node, events)
    c = classify(
        pod,
        node,
        events,
        was_spot=seen.was_spot,
        was_running=node_name is not None,
        notice=seen.notice,
        notice_age_s=_notice_age(seen, pod, look.now),
        pending_timeout_s=pending_timeout_s,  # unschedulable: the gate's (gating.timed_out)
        start_error_for_s=look.now - seen.start_error_since if seen.start_error_since else 0.0,
    )
    started, finished, code, message = container_state(pod)
    phase = pick(pick(pod, "status") or {}, "phase") or "Pending"
    role = _role(c, pod, code)
    at = _infra_at(seen, pod, node, finished) if role == "infra" else finished
    if role == "app" and phase == "Pending":
        at = seen.start_error_since or look.now
    return RankView(
        k,
        _name(pod),
        node_name,
        phase,
        c,
        role,
        at=at if role in ("infra", "app", "stopped") else None,
        ended_at=finished,
        exit_code=code,
        collective=any(w in (message or "").lower() for w in COLLECTIVE_ERRORS),
        live=phase in ("Pending", "Running") and not _deleting(pod),
    )


def _role(c: Classification, pod: dict[str, Any], code: int | None) -> str:
    if c.verdict in INFRA_VERDICTS:
        return "infra"
    if c.verdict in APP_VERDICTS:
        # a signal exit of a pod being deleted: the gang's end stopped it (the Job controller
        # or we deleted it), it did not fail
        return "stopped" if code in SIGNAL_EXITS and _deleting(pod) else "app"
    return {
        Verdict.SUCCEEDED: "succeeded",
        Verdict.RUNNING: "running",
        Verdict.PENDING: "pending",
    }[c.verdict]


def _vanished(
    seen: AttemptHandle,
    look: GangLook,
    k: int,
    node_name: str | None,
    node: dict[str, Any] | None,
    events: list[dict[str, Any]],
) -> RankView:
    """A rank whose pod is gone: the infrastructure's doing if its node is gone or shows
    trouble; else the gang's end (or it was never placed)."""
    gone = node_name is not None and node_name in look.node_objects and node is None
    if node_name is None:  # not made yet (the Job controller makes it), or never placed
        return RankView(
            k, None, None, "Missing", Classification(Verdict.PENDING, "no pod"), "pending"
        )
    if not (gone or healthy(node, events) is False):
        c = Classification(Verdict.PENDING, "stopped with the gang")
        return RankView(k, None, node_name, "Gone", c, "stopped")
    c = classify(None, node, events, was_spot=seen.was_spot, was_running=True, notice=seen.notice)
    role = "infra" if c.verdict in INFRA_VERDICTS else "stopped"
    at = None if gone else _infra_at(seen, {}, node, None)
    return RankView(k, None, node_name, "Gone", c, role, at=at)


def healthy(node: dict[str, Any] | None, events: Iterable[Any] = ()) -> bool | None:
    """The node is Ready with no drain or reclaim sign (None: not known)."""
    if not node:
        return None
    taints = {pick(t, "key") for t in pick(pick(node, "spec") or {}, "taints") or []}
    return (
        _not_ready_at(node) is None
        and not taints & DRAIN_TAINTS
        and interruption_notice(node, [e for e in events if _kind(e) != "Pod"]) is None
    )


def _infra_at(
    seen: AttemptHandle,
    pod: dict[str, Any],
    node: dict[str, Any] | None,
    finished: float | None,
) -> float | None:
    """When the infrastructure's hand showed on a rank: its DisruptionTarget, its node turning
    NotReady, the notice, its exit; the earliest known (None: none known, e.g. a node gone)."""
    times = [_disruption_at(pod), _not_ready_at(node) if node else None, seen.notice_at]
    known = [t for t in times if t is not None]
    if not known and finished is not None and node is not None:
        known.append(finished)
    return min(known, default=None)


def container_state(pod: dict[str, Any]) -> tuple[float | None, float | None, int | None, str]:
    """(started, finished, exit code, termination message) of the training container."""
    statuses = pick(pick(pod, "status") or {}, "container_statuses", "containerStatuses") or []
    cs = next((c for c in statuses if pick(c, "name") == "train"), statuses[0] if statuses else {})
    state = pick(cs, "state") or {}
    run, term = pick(state, "running") or {}, pick(state, "terminated") or {}
    started = wall_time(pick(run, "started_at", "startedAt")) or wall_time(
        pick(term, "started_at", "startedAt")
    )
    return (
        started,
        wall_time(pick(term, "finished_at", "finishedAt")),
        pick(term, "exit_code", "exitCode"),
        str(pick(term, "message") or ""),
    )


def held(pod: dict[str, Any], started: float | None) -> tuple[bool, float | None]:
    """(the rank is held: a make-before-break launch not released yet, when it began
    training): as :func:`.podread.hold_state` for one pod."""
    ann = pick(pick(pod, "metadata") or {}, "annotations") or {}
    hold = ann.get(HOLD_ANNOTATION)
    if hold is None or started is None:
        return False, started
    if hold != "go":
        return True, started
    try:
        return False, max(started, float(ann.get(RELEASED_ANNOTATION) or ""))
    except ValueError:
        return False, started


def _notice_age(seen: AttemptHandle, pod: dict[str, Any], now: float) -> float | None:
    if seen.notice_at is None:
        return None
    finished = container_state(pod)[1]
    return (finished or now) - seen.notice_at


def _disruption_at(pod: dict[str, Any]) -> float | None:
    for c in pick(pick(pod, "status") or {}, "conditions") or []:
        if pick(c, "type") == "DisruptionTarget" and pick(c, "status") == "True":
            return wall_time(pick(c, "last_transition_time", "lastTransitionTime"))
    return None


def _not_ready_at(node: dict[str, Any]) -> float | None:
    """When the node's Ready condition left True (None: it is Ready, or says nothing)."""
    for c in pick(pick(node, "status") or {}, "conditions") or []:
        if pick(c, "type") == "Ready" and pick(c, "status") != "True":
            return wall_time(pick(c, "last_transition_time", "lastTransitionTime")) or 0.0
    return None


def _deleting(pod: dict[str, Any]) -> bool:
    meta = pick(pod, "metadata") or {}
    return bool(pick(meta, "deletion_timestamp", "deletionTimestamp"))


def _name(pod: dict[str, Any] | None) -> str:
    return str(pick(pick(pod, "metadata") or {}, "name") or "") if pod else ""


def _kind(event: Any) -> str:
    return str(pick(pick(event, "involved_object", "involvedObject") or {}, "kind") or "")
