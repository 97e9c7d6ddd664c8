"""Capacity gating for a spot gang: no partial gang holds nodes for long (pure).

Karpenter has no all-or-nothing provisioning for a group of pods: pending gang pods get nodes
one by one, and a gang of 8 that finds 5 pays for 5 idle nodes while it waits. So a spot
gang's pods are created gated (:data:`~.gang_launch.GATE`: pending, asking for nothing) beside
N placeholders: pause pods with a rank's placement and GPUs at the probes' PriorityClass
(-10, never preempting, see :mod:`.probe`). The autoscaler makes nodes for the placeholders.
Once all N are placed, the placeholders are deleted and the gates lifted at once, and the
ranks take those nodes (:func:`read_gate` says when: ``lift``). The gang's capacity is granted
then (the time the N-th placeholder was placed, which the Job records:
:data:`GRANTED_ANNOTATION`); before, the attempt is a request waiting for spot, whatever part
of it is held. What a partial gang holds is billed all the same: ``held_node_s``, node-seconds
since each placeholder was placed.

If not all N ranks are on nodes within the partial-gang timeout (``gang_timeout_s``, 10 min
by default; ``pending_timeout_s`` while no node at all is held) the gang is deleted,
placeholders and all, and the attempt ends ``spot_unavailable``: a failed spot attempt,
:func:`timed_out`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_spot.backends.kubernetes.gang_launch import GATE, owner
from airflow_spot.backends.kubernetes.probe import (
    CAPACITY_LABEL,
    POOL_LABEL,
    PROBE_LABEL,
    build_probe,
)
from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time

PLACEHOLDER_LABEL = "airflow-spot/placeholder-of"  # the Job a placeholder holds nodes for
GRANTED_ANNOTATION = "airflow-spot/gang-granted-at"  # on the Job: when all N were placed


def placeholder_name(job: str, k: int) -> str:
    return f"{job}-place-{k}"


def build_placeholders(
    pod: Mapping[str, Any],
    *,
    job: str,
    job_uid: str,
    nodes: int,
    labels: Mapping[str, str],
    image: str,
) -> list[dict[str, Any]]:
    """N placeholders (API JSON) with the rank pod ``pod``'s placement and GPUs: probes,
    labelled for their Job (not for a pool: the task's probes are dropped by pool, and these
    are the gang's), owned by it (the garbage collector deletes them with it)."""
    out = []
    for k in range(nodes):
        body = build_probe(pod, name=placeholder_name(job, k), labels=labels, image=image)
        meta = body["metadata"]
        meta["labels"] = {
            **{key: v for key, v in meta["labels"].items() if key != POOL_LABEL},
            PROBE_LABEL: "true",
            CAPACITY_LABEL: "spot",
            PLACEHOLDER_LABEL: job,
        }
        meta["ownerReferences"] = [owner(job, job_uid)]
        out.append(body)
    return out


@dataclass(frozen=True)
class Gate:
    """Where a gang stands on its way to N nodes."""

    nodes: int  # N
    gated: tuple[str, ...]  # rank pods still behind the gate
    ranks: int  # rank pods that exist
    placed: int  # placeholders on a node
    bound: int  # rank pods on a node
    held_at: float | None  # when the first node was held (a placeholder or a rank placed)
    granted_at: float | None  # when all N were placed (the gang's capacity granted)
    lifted: bool  # the gates were lifted once (the Job records its grant)
    held_node_s: float = 0.0  # node-seconds held by the placeholders and ranks placed

    @property
    def lift(self) -> bool:
        """Lift the gates now: all N placeholders are placed and all N ranks wait (or the
        gates were lifted before, and a rank still waits behind one)."""
        if not self.gated:
            return False
        return self.lifted or (self.placed >= self.nodes and self.ranks >= self.nodes)

    @property
    def all_bound(self) -> bool:
        return self.bound >= self.nodes

    @property
    def holding(self) -> int:
        """Nodes held now (billed): the ranks' and the placeholders'."""
        return self.bound + self.placed


def read_gate(
    job: Any, pods: Iterable[Any], placeholders: Iterable[Any], nodes: int, now: float
) -> Gate:
    """The gang's gate from its Job, rank pods and placeholders as read at ``now``."""
    pods, placeholders = [as_dict(p) for p in pods], [as_dict(p) for p in placeholders]
    ann = pick(pick(as_dict(job), "metadata") or {}, "annotations") or {}
    recorded = _float(ann.get(GRANTED_ANNOTATION))
    rank_binds = sorted(t for t in map(_bound_at, pods) if t is not None)
    held_binds = sorted(t for t in map(_bound_at, placeholders) if t is not None)
    binds = sorted(rank_binds + held_binds)
    granted = recorded
    if granted is None and len(held_binds) >= nodes:
        granted = held_binds[nodes - 1]  # the N-th placed
    if granted is None and len(rank_binds) >= nodes:
        granted = rank_binds[nodes - 1]  # no gate (on demand): the N-th rank placed
    gated = tuple(
        pick(pick(p, "metadata") or {}, "name")
        for p in pods
        if any(pick(g, "name") == GATE for g in _gates(p))
    )
    return Gate(
        nodes,
        gated,
        len(pods),
        sum(1 for p in placeholders if _node(p)),
        sum(1 for p in pods if _node(p)),
        binds[0] if binds else None,
        granted,
        recorded is not None,
        sum(max(0.0, now - t) for t in binds),
    )


def timed_out(
    gate: Gate, launched_at: float, now: float, *, pending_timeout_s: float, gang_timeout_s: float
) -> float | None:
    """The timeout that has passed with fewer than N ranks on nodes (None: none has): the
    partial-gang timeout once a node is held, ``pending_timeout_s`` while none is; once all N
    were placed, the ranks have the partial-gang timeout from then to take their nodes."""
    if gate.all_bound:
        return None
    if gate.granted_at is not None:
        return gang_timeout_s if now - gate.granted_at >= gang_timeout_s else None
    limit = gang_timeout_s if gate.held_at is not None else pending_timeout_s
    return limit if now - launched_at >= limit else None


def _gates(pod: Mapping[str, Any]) -> list[Any]:
    return pick(pick(pod, "spec") or {}, "scheduling_gates", "schedulingGates") or []


def _node(pod: Mapping[str, Any]) -> str | None:
    return pick(pick(pod, "spec") or {}, "node_name", "nodeName")


def _bound_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod was placed on a node (its PodScheduled condition), if it is."""
    if not _node(pod):
        return None
    for c in pick(pick(pod, "status") or {}, "conditions") or []:
        if pick(c, "type") == "PodScheduled" and pick(c, "status") == "True":
            return wall_time(pick(c, "last_transition_time", "lastTransitionTime"))
    return None


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
