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
:func:`timed_out`. It ends so sooner when its capacity check says "fewer than N" and nothing
may still change that (:func:`short_of_n`): Karpenter's ICE on a NodeClaim of its pods with no
NodeClaim left on its way, or the ProvisioningRequest's ``CapacityIsNotFound``, standing for
``CAPACITY_SETTLE_S`` (15 s). A gang that waits with no such answer shows its own waiting
instead (:func:`pending_signal`): "fewer than N: k of N pods pending for T s".
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
from airflow_spot.backends.signals import SpotSignal

PLACEHOLDER_LABEL = "airflow-spot/placeholder-of"  # the Job a placeholder holds nodes for
GRANTED_ANNOTATION = "airflow-spot/gang-granted-at"  # on the Job: when all N were placed
PENDING_SIGNAL_S = 30.0  # a gang waiting this long with no better answer shows "fewer than N"


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


@dataclass(frozen=True)
class GangCapacity:
    """What a waiting spot gang's capacity check says (:mod:`.gang_capacity` reads it)."""

    signal: SpotSignal | None  # "N seen", "fewer than N", or None (unknown)
    trying: tuple[str, ...] = ()  # NodeClaims that may still bring a node (Karpenter's retry)


def short_of_n(
    gate: Gate, capacity: GangCapacity | None, now: float, settle_s: float
) -> float | None:
    """How long "fewer than N" has stood, once the gang should end on it (None: not yet).

    Only an answer of the capacity check counts (Karpenter's ICE on a NodeClaim of the gang's
    pods, the ProvisioningRequest's ``CapacityIsNotFound``), never the gang's own waiting
    (:func:`pending_signal`: that is what the timeouts are for), and only while the gang's
    capacity is not granted. It must stand ``settle_s`` from its newest evidence with no
    NodeClaim still on its way: Karpenter retries a pod whose launch failed for capacity on
    the offerings left, within its batch window (:mod:`.capacity_signals`)."""
    if capacity is None or gate.granted_at is not None or gate.all_bound or capacity.trying:
        return None
    sig = capacity.signal
    if sig is None or sig.up or sig.source == "request":
        return None
    stood = now - sig.at
    return stood if stood >= settle_s else None


def pending_signal(gate: Gate, launched_at: float, now: float) -> SpotSignal | None:
    """A gang still short of N nodes :data:`PENDING_SIGNAL_S` after its launch, its capacity
    not granted: "fewer than N" (source ``request``, at ``now``), the pods still pending
    counted (placeholders, or the gated ranks of a ProvisioningRequest's gang)."""
    waited = now - launched_at
    if gate.granted_at is not None or gate.all_bound or waited < PENDING_SIGNAL_S:
        return None
    pending = max(0, gate.nodes - gate.holding)
    detail = (
        f"fewer than {gate.nodes}: {pending} of {gate.nodes} pods pending for {waited:.0f} s "
        f"(holding {gate.holding})"
    )
    return SpotSignal(False, now, "request", "", detail)


def capacity_seen(
    gate: Gate, capacity: GangCapacity | None, launched_at: float, now: float
) -> SpotSignal | None:
    """What a spot gang's status shows of its capacity (``evidence["capacity"]``): its capacity
    check's answer, else its own waiting (:func:`pending_signal`)."""
    if capacity is not None and capacity.signal is not None:
        return capacity.signal
    return pending_signal(gate, launched_at, now)


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
