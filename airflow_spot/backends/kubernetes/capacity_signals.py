"""Karpenter's insufficient-capacity errors counted per NodeClaim for a gang's N pods (pure).

When a launch fails for lack of capacity (the cloud provider's ``Create`` returns an
``InsufficientCapacityError``), Karpenter v1.14 publishes a Warning event, reason
``InsufficientCapacityError``, on the NodeClaim ("NodeClaim <name> event: <error>") and deletes
it (``pkg/controllers/nodeclaim/lifecycle/launch.go``). Which pods a NodeClaim was made for is
in the ``Nominated`` events Karpenter puts on each pod ("Pod should schedule on:
nodeclaim/<name>", ``pkg/controllers/provisioning/provisioner.go``). So for a gang's pods (its
probes or placeholders) the NodeClaims made for them are known, and each one that failed for
capacity left its pods without a node: the cloud had fewer than N nodes for the gang then.

Karpenter's recorder publishes one ``Nominated`` event per pod in 2 minutes (its dedupe key is
the reason and the pod's UID): a pod's later NodeClaims in that window are not named, so the
count covers the first NodeClaim of each pod, which is the one that answers first.

:func:`claim_count` counts; :func:`claim_signal` is the observation the policy gets:

* ``fewer than N``: a NodeClaim of ours failed for capacity (down, at the newest such event,
  for :data:`~.signals.KARPENTER_ICE_TTL_S`: Karpenter forgets the offering after 3 minutes);
* ``N seen``: every one of the N pods has a NodeClaim that launched (an instance exists for
  each), and none failed (up, at the last launch);
* else unknown (None): nothing named yet, a launch still on its way, or NodeClaims gone.

After an ICE Karpenter does not give up on the pod: the cloud provider lists the offering
unavailable (the AWS provider for 3 minutes), the launch controller deletes the NodeClaim, and
the provisioner, the pod still pending, schedules it again on the offerings left, within one
batch (1 s after the last pending pod, 10 s at most by default): a new NodeClaim if one fits,
else a ``FailedScheduling`` event on the pod. The new NodeClaim is not named to us (the
``Nominated`` event is deduplicated, above), so :attr:`ClaimCount.trying` keeps every NodeClaim
of the cluster that may still bring a node (not failed, not deleting, not yet initialized, or
initialized less than :data:`CAPACITY_SETTLE_S` ago: its pods are being bound): a waiting gang
ends early on "fewer than N" only when that is empty :data:`CAPACITY_SETTLE_S` after the
newest ICE (:func:`~.gating.short_of_n`). Another workload's launches count too: on a busy
cluster the gang may then wait out its timeout, the safe side.

Events and NodeClaims are the API's JSON or the python client's ``to_dict()`` (both read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time
from airflow_spot.backends.kubernetes.signals import ICE_REASON, KARPENTER_ICE_TTL_S, event_time
from airflow_spot.backends.signals import SpotSignal

NOMINATED_REASON = "Nominated"
_CLAIM = re.compile(r"\bnodeclaim/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)")
EARLY_S = 5.0  # events this much older than the gang's pods still count (clock skew)
# how long "fewer than N" must stand before a waiting gang ends on it: past Karpenter's 10 s
# batch, so that a retry on another offering has made its NodeClaim (see the module's notes)
CAPACITY_SETTLE_S = 15.0


@dataclass(frozen=True)
class ClaimCount:
    """What Karpenter did for a gang's pods: ``k`` of its NodeClaims failed for capacity."""

    nodes: int  # N
    nominated: Mapping[str, str]  # pod -> the NodeClaim it was nominated to
    failed: Mapping[str, float]  # NodeClaim -> when it failed for capacity
    launched: Mapping[str, float]  # NodeClaim -> when it launched (an instance exists)
    trying: tuple[str, ...] = ()  # NodeClaims that may still bring a node (any workload's)

    @property
    def claims(self) -> set[str]:
        return set(self.nominated.values())

    @property
    def stranded(self) -> list[str]:
        """Pods whose NodeClaim failed for capacity."""
        return sorted(p for p, c in self.nominated.items() if c in self.failed)

    @property
    def all_launched(self) -> bool:
        """Each of the N pods has a NodeClaim that launched, and none failed."""
        return (
            len(self.nominated) >= self.nodes
            and not self.failed
            and all(c in self.launched for c in self.nominated.values())
        )


def nominations(events: Iterable[Any], pods: Iterable[str], since: float) -> dict[str, str]:
    """pod -> NodeClaim, from Karpenter's ``Nominated`` events on ``pods`` (the newest per pod)
    no older than ``since``. A nomination to an existing node only names no NodeClaim."""
    wanted, best = set(pods), dict[str, tuple[float, str]]()
    for e in map(as_dict, events):
        inv = pick(e, "involved_object", "involvedObject") or {}
        pod = pick(inv, "name")
        if pick(e, "reason") != NOMINATED_REASON or pick(inv, "kind") != "Pod" or pod not in wanted:
            continue
        at = event_time(e)
        found = _CLAIM.search(str(pick(e, "message") or ""))
        if at is None or at < since - EARLY_S or found is None:
            continue
        if pod not in best or at >= best[pod][0]:
            best[pod] = (at, found[1])
    return {pod: claim for pod, (_, claim) in best.items()}


def capacity_failures(events: Iterable[Any], claims: Iterable[str], now: float) -> dict[str, float]:
    """NodeClaim -> when it failed for capacity, for ``claims`` with an ICE event of the last
    :data:`~.signals.KARPENTER_ICE_TTL_S`."""
    wanted, out = set(claims), dict[str, float]()
    for e in map(as_dict, events):
        inv = pick(e, "involved_object", "involvedObject") or {}
        claim = pick(inv, "name")
        if pick(e, "reason") != ICE_REASON or pick(inv, "kind") != "NodeClaim":
            continue
        at = event_time(e)
        if claim in wanted and at is not None and now - at <= KARPENTER_ICE_TTL_S:
            out[claim] = max(at, out.get(claim, at))
    return out


def launches(nodeclaims: Iterable[Any], claims: Iterable[str]) -> dict[str, float]:
    """NodeClaim -> when its ``Launched`` condition turned True, for ``claims`` that have it."""
    wanted, out = set(claims), dict[str, float]()
    for nc in map(as_dict, nodeclaims):
        name = pick(pick(nc, "metadata") or {}, "name")
        if name not in wanted:
            continue
        for c in pick(pick(nc, "status") or {}, "conditions") or []:
            if pick(c, "type") == "Launched" and pick(c, "status") == "True":
                at = wall_time(pick(c, "last_transition_time", "lastTransitionTime"))
                if at is not None:
                    out[name] = at
    return out


def in_flight(nodeclaims: Iterable[Any], failed: Iterable[str], now: float) -> tuple[str, ...]:
    """NodeClaims that may still bring a node: not ``failed``, not being deleted, and not
    initialized (its node Ready, startup taints gone) or initialized less than
    :data:`CAPACITY_SETTLE_S` ago (the pods it was made for are being bound)."""
    gone, out = set(failed), []
    for nc in map(as_dict, nodeclaims):
        meta = pick(nc, "metadata") or {}
        name = pick(meta, "name")
        if not name or name in gone or pick(meta, "deletion_timestamp", "deletionTimestamp"):
            continue
        ready = next(
            (
                c
                for c in pick(pick(nc, "status") or {}, "conditions") or []
                if pick(c, "type") == "Initialized" and pick(c, "status") == "True"
            ),
            None,
        )
        at = wall_time(pick(ready, "last_transition_time", "lastTransitionTime")) if ready else None
        if ready is None or at is None or now - at < CAPACITY_SETTLE_S:
            out.append(str(name))
    return tuple(sorted(out))


def claim_count(
    nodes: int,
    pods: Iterable[str],
    pod_events: Iterable[Any],
    ice_events: Iterable[Any],
    nodeclaims: Iterable[Any],
    since: float,
    now: float,
) -> ClaimCount:
    """Count what Karpenter did for the gang's ``pods`` (made at ``since``): their
    nominations, and which of those NodeClaims failed for capacity or launched."""
    nominated = nominations(pod_events, pods, since)
    claims, nodeclaims = set(nominated.values()), list(nodeclaims)
    failed = capacity_failures(ice_events, claims, now)
    return ClaimCount(
        nodes, nominated, failed, launches(nodeclaims, claims), in_flight(nodeclaims, failed, now)
    )


def claim_signal(count: ClaimCount, pool: str) -> SpotSignal | None:
    """The gang's capacity as Karpenter's NodeClaims show it: ``fewer than N``, ``N seen``, or
    None (unknown). Source ``karpenter``."""
    n, claims = count.nodes, count.claims
    if count.failed:
        at = max(count.failed.values())
        detail = (
            f"fewer than {n}: {len(count.failed)} of {len(claims)} NodeClaims for the gang's "
            f"{n} pods failed for capacity ({ICE_REASON}: {', '.join(sorted(count.failed))}); "
            f"pods left without a node: {', '.join(count.stranded)}"
        )
        return SpotSignal(False, at, "karpenter", pool, detail)
    if count.all_launched:
        at = max(count.launched[c] for c in claims)
        return SpotSignal(
            True, at, "karpenter", pool, f"{n} seen: {len(claims)} NodeClaims launched for {n} pods"
        )
    return None
