"""A gang's verdict: one look at an indexed Job's rank pods, their nodes and events, judged as
one attempt (pure: no client, no clock; ``now`` is the look's time).

When one node of a gang goes, the cluster shows it first (a taint, a ``DisruptionTarget``
condition, a node NotReady or gone) and the other ranks then die of collective errors that
look like application failures: SkyPilot's first multi-node controller read those as the
job's fault. Here each rank is classified alone (:func:`~.classify.classify` over its pod,
its node and their events), then the gang's verdict is the first failure's cause:

* any rank lost to the infrastructure (preempted first: its node reclaimed, drained, gone)
  makes the gang ``preempted`` (or the infrastructure verdict it shows), whatever the other
  ranks' exits, unless that loss came (by its known time) more than ``settle_s`` after an
  application failure of another rank;
* a rank's non-zero exit on healthy capacity makes it ``app_failure`` naming the rank, but
  only once nothing can still explain it: every other rank ended on healthy capacity, or
  ``settle_s`` passed. A survivor often exits first (a peer's socket reset within
  milliseconds) while the lost rank's record is still on its way (a node stops heartbeating:
  NotReady only after the node monitor's grace period): the window waits for it. Ranks that
  fail within the same second (the API's resolution) are told apart by their termination
  messages: a collective error (:data:`COLLECTIVE_ERRORS`) is a consequence, not a cause;
* a rank stopped by the gang's own end (a signal exit of a pod being deleted, a pod gone
  from a healthy node) is never a cause;
* all ranks succeeded: ``succeeded``.

Ranks must be on nodes within the partial-gang timeout, or sooner when the gang's capacity
check says "fewer than N" with no launch on its way (:mod:`.gating`). What a look records
lives in the attempt's handle, so the verdict stands after pods and nodes are gone: ``pod`` is
the Job, ``node`` / ``node_uid`` each rank's node, by rank, comma-separated (node names hold
no commas), ``notice`` the first reclaim notice on any rank's node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from airflow_spot.backends.base import AttemptStatus, State
from airflow_spot.backends.kubernetes.capacity_signals import CAPACITY_SETTLE_S
from airflow_spot.backends.kubernetes.classify import Classification, Verdict
from airflow_spot.backends.kubernetes.facts import (
    container_start_error,
    interruption_notice,
    is_cloud_notice,
    node_is_spot,
)
from airflow_spot.backends.kubernetes.gang_ranks import (
    GangLook,
    RankView,
    container_state,
    held,
    rank_nodes,
    rank_of,
    view_ranks,
)
from airflow_spot.backends.kubernetes.gating import (
    GangCapacity,
    Gate,
    capacity_seen,
    read_gate,
    short_of_n,
    timed_out,
)
from airflow_spot.backends.kubernetes.reading import pick, wall_time
from airflow_spot.backends.kubernetes.verdict import GIVE_UP, OUTCOMES, RELAY_NOTICE, Judgement
from airflow_spot.jobstate import AttemptHandle

LIFT_GATES = "lift_gates"  # what a gang's status may find due, besides the single pod's
STOP_RANKS = "stop_ranks"
INFRA = (Verdict.PREEMPTED, Verdict.SPOT_UNAVAILABLE, Verdict.INFRA_DISRUPTION)  # by precedence


@dataclass(frozen=True)
class Timeouts:
    pending_s: float = 600.0  # no node held at all
    gang_s: float = 600.0  # a partial gang (the node-seconds it held are reported)
    settle_s: float = 60.0  # how long an application failure waits for a reclaim to show
    capacity_s: float = CAPACITY_SETTLE_S  # how long "fewer than N" stands before the end


def judge_gang(
    handle: AttemptHandle, look: GangLook, t: Timeouts, capacity: GangCapacity | None = None
) -> Judgement:
    """Judge one look at the gang (see the module's notes), with what its capacity check
    says while it waits (``capacity``: a spot gang's; "fewer than N" ends it early)."""
    record = recorded(handle, look)
    seen = replace(handle, **record)
    ranks = view_ranks(seen, look, t.pending_s)
    gate = read_gate(look.job, look.pods, look.placeholders, look.nodes, look.now)
    found = _verdict(seen, look, ranks, t)
    launched = float(seen.launched_at or look.now)
    limit: float | None = None
    short: float | None = None
    if not found.c.terminal:
        limit = timed_out(
            gate, launched, look.now, pending_timeout_s=t.pending_s, gang_timeout_s=t.gang_s
        )
        short = short_of_n(gate, capacity, look.now, t.capacity_s)
    due: list[str] = []
    if limit is not None or short is not None:
        found = Found(_gave_up(seen, gate, limit, short, t))
        due.append(GIVE_UP)
    elif found.c.terminal and any(r.live for r in ranks):
        due.append(STOP_RANKS)
    elif not found.c.terminal:
        due += _due(seen, look, ranks, gate)
    status = _status(seen, look, ranks, gate, found, tuple(due))
    if seen.capacity == "spot" and (GIVE_UP in due or not found.c.terminal):
        sig = capacity_seen(gate, capacity, launched, look.now)
        if sig is not None:
            status.evidence["capacity"] = sig.to_dict()
    return Judgement(status, record, found.c.default_used)


def recorded(handle: AttemptHandle, look: GangLook) -> dict[str, Any]:
    """What the look records in the handle: the Job's uid, each rank's node (and its uid),
    the gang's capacity, that it ran, the first reclaim notice on any rank's node, and since
    when a rank's container cannot start."""
    h = replace(handle)
    if look.job:
        h.pod_uid = pick(pick(look.job, "metadata") or {}, "uid") or h.pod_uid
    names, uids = rank_nodes(h.node, look.nodes), rank_nodes(h.node_uid, look.nodes)
    phases = []
    for pod in look.pods:
        k, node = rank_of(pod), pick(pick(pod, "spec") or {}, "node_name", "nodeName")
        phases.append(pick(pick(pod, "status") or {}, "phase"))
        if k is not None and k < look.nodes and node:
            names[k] = node
    for k, name in enumerate(names):
        node = look.node_objects.get(name) if name else None
        if node is not None and not uids[k]:
            uids[k] = pick(pick(node, "metadata") or {}, "uid") or ""
    h.node, h.node_uid = _joined(names), _joined(uids)
    spots = [node_is_spot(look.node_objects.get(n)) for n in names if n]
    if any(s is True for s in spots):
        h.was_spot = True
    elif spots and all(s is False for s in spots):
        h.was_spot = False
    h.was_running = bool(h.was_running) or "Running" in phases or None
    _record_notice(h, names, look)
    errors = any(container_start_error(p) for p in look.pods)
    h.start_error_since = (h.start_error_since or look.now) if errors else None
    return {k: v for k, v in vars(h).items() if getattr(handle, k) != v}


def _record_notice(h: AttemptHandle, names: list[str], look: GangLook) -> None:
    """The first reclaim notice on any rank's node (the cloud's word replaces Karpenter's
    taint, as for one pod: see :func:`.verdict.recorded`)."""
    for name in names:
        notice = notice_on(name, look) if name else None
        if not notice:
            continue
        if h.notice is None or (is_cloud_notice(notice) and not is_cloud_notice(h.notice)):
            h.notice = notice
        if h.notice_at is None:
            h.notice_at = look.now


def notice_on(node_name: str, look: GangLook) -> str | None:
    """The reclaim notice node ``node_name`` shows (its own events only)."""
    node = look.node_objects.get(node_name)
    if node is None:
        return None
    return interruption_notice(node, look.events.get(node_name, ()))


# -- the gang's verdict ----------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """The gang's classification, the ranks that caused it, and the rank whose failure
    waits for the settle window (no verdict yet)."""

    c: Classification
    causes: frozenset[int] = frozenset()
    breaking: RankView | None = None


def _verdict(seen: AttemptHandle, look: GangLook, ranks: list[RankView], t: Timeouts) -> Found:
    """The gang's classification (see the module's notes)."""
    n = look.nodes
    if seen.gave_up:  # we deleted it (its timeout): what follows is ours, not a reclaim
        return Found(
            Classification(Verdict(seen.gave_up[0]), seen.gave_up[1], tuple(seen.gave_up[2]))
        )
    if len(ranks) == n and all(r.role == "succeeded" for r in ranks):
        return Found(Classification(Verdict.SUCCEEDED, f"all {n} ranks succeeded"))
    apps = [r for r in ranks if r.role == "app"]
    first = min((r.at for r in apps if r.at is not None), default=None)
    infra = [
        r
        for r in ranks
        if r.role == "infra" and (first is None or r.at is None or r.at <= first + t.settle_s)
    ]
    if infra:
        return _infra_verdict(infra, n)
    if apps:
        cause = _cause(apps)
        others = [r for r in ranks if r is not cause]
        settled = (
            cause.phase == "Pending"  # cannot start: no reclaim explains that
            or all(r.role in ("app", "stopped", "succeeded") for r in others)
            or look.now >= (cause.at or look.now) + t.settle_s
        )
        if settled:
            return _app_verdict(cause, apps, n)
        return Found(Classification(Verdict.RUNNING, "a rank failed"), breaking=cause)
    return _no_cause(seen, look, ranks)


def _no_cause(seen: AttemptHandle, look: GangLook, ranks: list[RankView]) -> Found:
    """No rank shows a cause: the Job controller's record, ranks all stopped, the Job gone,
    or the gang still pending or running."""
    job_says = _job_disruption(seen, look)
    if job_says is not None:
        return Found(job_says)
    ended = [r for r in ranks if r.role in ("stopped", "succeeded")]
    if ranks and len(ended) == len(ranks) and any(r.role == "stopped" for r in ranks):
        return Found(
            Classification(
                Verdict.INFRA_DISRUPTION,
                "every rank was stopped and none shows why (deleted from outside the gang?)",
                ("ranks stopped",),
                default_used=True,
            )
        )
    if not look.job and not look.pods:
        return Found(
            Classification(Verdict.INFRA_DISRUPTION, "the gang's Job is gone", ("job not found",))
        )
    running = len(ranks) == look.nodes and all(r.role == "running" for r in ranks)
    return Found(Classification(Verdict.RUNNING if running else Verdict.PENDING, "gang"))


def _infra_verdict(infra: list[RankView], n: int) -> Found:
    """The infrastructure's verdict of the gang: the strongest a lost rank shows."""
    lost = min(infra, key=lambda r: (INFRA.index(r.verdict.verdict), r.rank))
    kind = lost.verdict.verdict
    victims = sorted({r.rank for r in infra if r.verdict.verdict is kind})
    who = f"rank {victims[0]}" if len(victims) == 1 else f"ranks {victims}"
    c = Classification(
        kind,
        f"{who} of {n}: {lost.verdict.reason}; every rank stopped",
        (*lost.verdict.evidence, f"victims {victims}"),
    )
    return Found(c, frozenset(victims))


def _cause(apps: list[RankView]) -> RankView:
    """The first rank to fail: the earliest exit (the API keeps whole seconds), then one that
    is not a peer's collective error or a signal, then the lowest rank."""
    first = min((r.at for r in apps if r.at is not None), default=0.0)
    return min(
        apps,
        key=lambda r: (
            (r.at if r.at is not None else first) > first + 1.0,
            r.collective,
            r.exit_code in (130, 137, 143),
            r.rank,
        ),
    )


def _app_verdict(cause: RankView, apps: list[RankView], n: int) -> Found:
    """The application's verdict, naming the rank (the ranks that failed in the same second
    in the same way, which the API cannot order)."""
    same = sorted(
        r.rank
        for r in apps
        if r.collective == cause.collective
        and r.at is not None
        and cause.at is not None
        and abs(r.at - cause.at) <= 1.0
    ) or [cause.rank]
    who = f"rank {cause.rank}" if len(same) == 1 else f"ranks {same} (the same second)"
    c = Classification(
        cause.verdict.verdict,
        f"{who} of {n}: {cause.verdict.reason}; every other rank stopped",
        (*cause.verdict.evidence, f"rank {cause.rank}"),
    )
    return Found(c, frozenset(same))


def _job_disruption(seen: AttemptHandle, look: GangLook) -> Classification | None:
    """The Job controller's record when the pods are gone: it failed the Job on a rank's
    ``DisruptionTarget`` (the last resort: that rank's own evidence is gone with its pod)."""
    if look.pods:
        return None
    for c in pick(pick(look.job, "status") or {}, "conditions") or []:
        msg = str(pick(c, "message") or "")
        if (
            pick(c, "type") == "Failed"
            and pick(c, "status") == "True"
            and "DisruptionTarget" in msg
        ):
            kind = Verdict.PREEMPTED if seen.was_spot else Verdict.INFRA_DISRUPTION
            return Classification(
                kind, f"the Job controller: {msg}", ("Job Failed/PodFailurePolicy",)
            )
    return None


def _gave_up(
    seen: AttemptHandle, gate: Gate, limit: float | None, short: float | None, t: Timeouts
) -> Classification:
    """The partial-gang (or pending) timeout passed, or the capacity check said "fewer than
    N" for ``short`` seconds with no launch on its way: the gang is deleted."""
    what = "a partial gang" if gate.held_at is not None else "no node"
    why = f" after {limit:.0f} s" if limit is not None else (
        f", fewer than {gate.nodes} for {short:.0f} s with no launch on its way (not waiting out "
        f"the {t.gang_s:.0f} s timeout)"
    )  # fmt: skip
    return Classification(
        Verdict.SPOT_UNAVAILABLE if seen.capacity == "spot" else Verdict.INFRA_DISRUPTION,
        f"{what}: {gate.bound or gate.placed} of {gate.nodes} nodes{why}; the gang is deleted",
        (
            f"held {gate.holding} of {gate.nodes}",
            f"timeout {limit:.0f} s" if limit is not None else f"fewer than N {short:.0f} s",
        ),
    )


def _due(seen: AttemptHandle, look: GangLook, ranks: list[RankView], gate: Gate) -> list[str]:
    """What a gang that has no verdict needs done: its gates lifted, a notice relayed."""
    due = [LIFT_GATES] if gate.lift else []
    names = rank_nodes(seen.node, look.nodes)
    if (
        any(notice_on(name, look) for name in names if name)
        and any(r.phase == "Running" for r in ranks)
        and not seen.notice_sent
    ):
        due.append(RELAY_NOTICE)
    return due


# -- the status ------------------------------------------------------------------------------
def _status(
    h: AttemptHandle,
    look: GangLook,
    ranks: list[RankView],
    gate: Gate,
    found: Found,
    due: tuple[str, ...],
) -> AttemptStatus:
    verdict, breaking = found.c, found.breaking
    started, held = _started(look)
    base: dict[str, Any] = dict(
        capacity=h.capacity or "",
        attempt=int(h.attempt or 0),
        launched_at=float(h.launched_at or 0),
        granted_at=gate.granted_at,
        started_at=None if held else started,
        ready_at=started if held and not h.notice else None,
        heartbeat=look.now,
        due=due,
        evidence=_evidence(h, look, ranks, gate, found),
    )
    if not verdict.terminal:
        if breaking is not None or h.notice_sent or RELAY_NOTICE in due:
            state = State.PREEMPTING
        elif verdict.verdict is Verdict.RUNNING:
            state = State.LAUNCHING if held or started is None else State.RUNNING
        elif gate.all_bound or h.capacity != "spot":
            state = State.LAUNCHING
        else:
            state = State.WAITING
        return AttemptStatus(state, **base)
    cause = next((r for r in ranks if r.rank in found.causes), None)
    finished = [r.ended_at for r in ranks if r.ended_at is not None]
    return AttemptStatus(
        State.ENDED,
        ended_at=max(finished, default=look.now),
        outcome=OUTCOMES[verdict.verdict],
        reason=verdict.reason,
        exit_code=cause.exit_code if cause else next(
            (r.exit_code for r in ranks if r.exit_code not in (None, 0)), None
        ),
        **base,
    )  # fmt: skip


def _started(look: GangLook) -> tuple[float | None, bool]:
    """(when the last rank's container started, or was released; None until all N did;
    whether the gang is held)."""
    starts, waiting = [], False
    for pod in look.pods:
        h, started = held(pod, container_state(pod)[0])
        waiting = waiting or h
        if started is not None:
            starts.append(started)
    if len(starts) < look.nodes:
        return None, waiting
    return max(starts), waiting


def _evidence(
    h: AttemptHandle, look: GangLook, ranks: list[RankView], gate: Gate, found: Found
) -> dict[str, Any]:
    """What the status shows of the gang: each rank's node and end (the causes' own; the
    others that ended, ``stopped`` with the gang), what it held, how long N nodes took."""
    v = found.c
    names = rank_nodes(h.node, look.nodes)
    binds = [wall_time(_scheduled(p)) for p in look.pods]
    out: dict[str, Any] = {
        "node": names[0] or None,
        "nodes": names,
        "spot_node": h.was_spot,
        "signals": list(v.evidence),
        "notice": h.notice,
        "world_size": look.nodes,
        "ranks": [_rank_end(r, found) for r in ranks],
        "held": gate.holding,
    }
    if gate.granted_at is None and gate.held_at is not None:
        # a partial gang: what it holds is billed though its capacity was never granted
        out["held_since"], out["held_node_s"] = gate.held_at, round(gate.held_node_s, 3)
    if gate.all_bound and all(b is not None for b in binds) and h.launched_at:
        # the time it took to get all N nodes (an on-demand gang's: the acquisition time)
        last = max(b for b in binds if b is not None)
        out["acquired_s"] = round(max(0.0, last - h.launched_at), 3)  # binds: whole seconds
    if found.causes and v.verdict in INFRA:
        out["victims"] = sorted(found.causes)
    elif found.causes:
        out["rank"] = min(found.causes)
    return out


def _rank_end(r: RankView, found: Found) -> dict[str, Any]:
    d = r.to_dict()
    ended = ("app", "infra", "running", "pending") if found.c.terminal else ("app", "infra")
    if r.rank not in found.causes and r.role in ended:
        d["outcome"] = "stopped"  # it ends with the gang, after the cause
    return d


def _scheduled(pod: Any) -> Any:
    for c in pick(pick(pod, "status") or {}, "conditions") or []:
        if pick(c, "type") == "PodScheduled" and pick(c, "status") == "True":
            return pick(c, "last_transition_time", "lastTransitionTime")
    return None


def _joined(parts: list[str]) -> str | None:
    return ",".join(parts) if any(parts) else None
