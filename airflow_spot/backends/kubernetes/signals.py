"""What a cluster shows about spot capacity, read as :class:`~airflow_spot.backends.signals.SpotSignal`s.

Pure parsers: no client calls, no clock (``now`` is given). Each takes what the API returns,
as raw JSON (camelCase) or as the python client's ``to_dict()`` (snake_case), and reads both
spellings. The facts they rest on are in ``shared/research/capacity-signals.md``:

* **Karpenter** publishes a Warning ``InsufficientCapacityError`` event on the NodeClaim when a
  launch hits insufficient capacity (ICE), and forgets the offering after 3 minutes. So an ICE
  event is "spot down" at its time for :data:`KARPENTER_ICE_TTL_S` only; a quiet Karpenter says
  nothing (unknown, never "up").
* **cluster-autoscaler** reports a node group in ``Backoff`` after a failed scale-up (v1.30+ YAML
  status in ``kube-system/cluster-autoscaler-status``), and tells a pending pod
  ``NotTriggerScaleUp ... in backoff after failed scale-up``. Both are "spot down"; any other
  state is unknown (the autoscaler only tries while pods are pending).
* **A Ready spot node** of the placement, schedulable, with a free ``nvidia.com/gpu`` at least
  the job's request, is "spot up" now.

A *placement* below is the training pod the backend would build for one spot pool (API JSON:
``spec.nodeSelector``, ``spec.affinity``, ``spec.tolerations``, the GPU request); its pool name
is ``""`` when the backend has no pools.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time
from airflow_spot.backends.kubernetes.vocabulary import DRAIN_TAINTS, SPOT_LABELS, SPOT_TAINTS
from airflow_spot.backends.signals import SpotSignal

GPU = "nvidia.com/gpu"
KARPENTER_ICE_TTL_S = 180.0  # Karpenter's unavailable-offerings cache (3 min)
AUTOSCALER_EVENT_TTL_S = 300.0  # the shortest backoff (5 min): a NotTriggerScaleUp that old
AUTOSCALER_STATUS_STALE_S = 1800.0  # the longest backoff (30 min): an older status says nothing
ICE_REASON = "InsufficientCapacityError"
BACKOFF_STATUS = "Backoff"
STATUS_CONFIGMAP = ("kube-system", "cluster-autoscaler-status")
LAST_UPDATED = "cluster-autoscaler.kubernetes.io/last-updated"
ZONE_KEYS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
NODEPOOL_KEY = "karpenter.sh/nodepool"
_AWS_TYPE = re.compile(r"sufficient ([a-z][a-z0-9-]*\.[a-z0-9]+) capacity")
_AZURE_SKU = re.compile(r"\b(Standard_[A-Za-z0-9_]+)\b")
_AWS_ZONE = re.compile(r"\b([a-z]{2}(?:-gov)?-[a-z]+-\d+[a-z])\b")

Placement = tuple[str, Mapping[str, Any]]  # (pool name, the training pod as API JSON)


# -- small readers -------------------------------------------------------------------------------
def event_time(event: Mapping[str, Any]) -> float | None:
    """When the event was last seen (a repeat updates it), by the newest time it carries."""
    series = pick(event, "series") or {}
    times = [
        wall_time(pick(event, "last_timestamp", "lastTimestamp")),
        wall_time(pick(series, "last_observed_time", "lastObservedTime")),
        wall_time(pick(event, "event_time", "eventTime")),
        wall_time(pick(event, "first_timestamp", "firstTimestamp")),
        wall_time(pick(pick(event, "metadata") or {}, "creation_timestamp", "creationTimestamp")),
    ]
    return max((t for t in times if t is not None), default=None)


def _involved(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return pick(event, "involved_object", "involvedObject") or {}


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pick(pod, "spec") or {}


def gpu_request(pod: Any) -> int:
    """The pod's ``nvidia.com/gpu`` request: containers summed, an init container's if larger
    (a limit stands for the request of an extended resource)."""
    spec = _spec(as_dict(pod))

    def need(c: Mapping[str, Any]) -> int:
        res = pick(c, "resources") or {}
        value = (pick(res, "requests") or {}).get(GPU) or (pick(res, "limits") or {}).get(GPU)
        return int(str(value or 0))

    main = sum(need(c) for c in pick(spec, "containers") or [])
    init = max((need(c) for c in pick(spec, "init_containers", "initContainers") or []), default=0)
    return max(main, init)


def pinned(pod: Mapping[str, Any], keys: Iterable[str]) -> set[str] | None:
    """The values a placement allows for a node label (any of ``keys``): its node selector's,
    and its required node affinity's ``In`` values; None when it does not pin that label."""
    spec, keys = _spec(pod), tuple(keys)
    selector = pick(spec, "node_selector", "nodeSelector") or {}
    found = {selector[k] for k in keys if k in selector}
    for term in _terms(spec):
        for e in pick(term, "match_expressions", "matchExpressions") or []:
            if pick(e, "key") in keys and pick(e, "operator") == "In":
                found |= set(pick(e, "values") or [])
    return found or None


def _terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    aff = pick(pick(spec, "affinity") or {}, "node_affinity", "nodeAffinity") or {}
    req = (
        pick(
            aff,
            "required_during_scheduling_ignored_during_execution",
            "requiredDuringSchedulingIgnoredDuringExecution",
        )
        or {}
    )
    return list(pick(req, "node_selector_terms", "nodeSelectorTerms") or [])


# -- Karpenter -----------------------------------------------------------------------------------
def parse_ice(message: str) -> tuple[str | None, str | None]:
    """(instance type, zone) named in an ICE message; None where it names none (e.g. ``all
    requested instance types were unavailable during launch``)."""
    kind = _AWS_TYPE.search(message) or _AZURE_SKU.search(message)
    zone = _AWS_ZONE.search(message)
    return (kind[1] if kind else None), (zone[1] if zone else None)


def ice_applies(message: str, nodeclaim: str, pod: Mapping[str, Any]) -> bool:
    """Whether an ICE on ``nodeclaim`` speaks for this spot placement.

    The rule (the event cannot tell the capacity type, and Karpenter deletes the NodeClaim):
    an ICE that names on-demand and not spot is left out; otherwise it counts unless it names
    a zone or instance type the placement does not allow, or the placement pins Karpenter
    node pools and the NodeClaim (``<nodepool>-<suffix>``) is of another. An ICE that names
    nothing counts for every spot placement (that is conservative: spot looks down 3 min)."""
    low = message.lower()
    if "on-demand" in low and "spot" not in low:
        return False
    kind, zone = parse_ice(message)
    for value, keys in ((zone, ZONE_KEYS), (kind, TYPE_KEYS)):
        allowed = pinned(pod, keys)
        if value and allowed is not None and value not in allowed:
            return False
    pools = pinned(pod, (NODEPOOL_KEY,))
    return pools is None or any(nodeclaim.startswith(f"{p}-") for p in pools)


def karpenter_signals(
    events: Iterable[Any], placements: Iterable[Placement], now: float
) -> list[SpotSignal]:
    """ "Spot down" per placement from Karpenter ICE events on NodeClaims of the last 3 minutes
    (the newest per pool). Older events, other reasons or kinds say nothing."""
    out: list[SpotSignal] = []
    places = list(placements)
    for raw in events:
        e = as_dict(raw)
        inv = _involved(e)
        if pick(e, "reason") != ICE_REASON or pick(inv, "kind") != "NodeClaim":
            continue
        at = event_time(e)
        if at is None or now - at > KARPENTER_ICE_TTL_S:
            continue  # Karpenter has forgotten it: unknown, not up
        message, claim = str(pick(e, "message") or ""), str(pick(inv, "name") or "")
        kind, zone = parse_ice(message)
        detail = f"{ICE_REASON} on NodeClaim {claim}" + "".join(
            f" {k}={v}" for k, v in (("type", kind), ("zone", zone)) if v
        )
        out += [
            SpotSignal(False, at, "karpenter", pool, detail)
            for pool, pod in places
            if ice_applies(message, claim, pod)
        ]
    return newest_per_pool(out)


def newest_per_pool(signals: Iterable[SpotSignal]) -> list[SpotSignal]:
    """One signal per (source, pool): the newest (a down among equals)."""
    best: dict[tuple[str, str], SpotSignal] = {}
    for s in signals:
        key = (s.source, s.pool)
        if key not in best or (s.at, not s.up) > (best[key].at, not best[key].up):
            best[key] = s
    return sorted(best.values(), key=lambda s: (s.source, s.pool))


# -- cluster-autoscaler --------------------------------------------------------------------------
def group_pool(group: str, pools: Iterable[str]) -> str | None:
    """The pool a node group stands for, by name: the group's last path segment (GKE names
    groups by URL) holds the pool name as a whole run of ``-`` separated words
    (``gpu-spot`` in ``eks-gpu-spot-2a-5ec6``); the longest such pool wins. With no pools
    (``[""]``) a group counts for the default spot placement when ``spot`` is one of its words.
    Any other group is none of ours: None."""
    base = "-" + group.rstrip("/").rsplit("/", 1)[-1].lower() + "-"
    named = sorted((p for p in pools if p), key=len, reverse=True)
    for p in named:
        if f"-{p.lower()}-" in base:
            return p
    if "" in pools and not named and "-spot-" in base:
        return ""
    return None


def autoscaler_status_signals(configmap: Any, pools: Iterable[str], now: float) -> list[SpotSignal]:
    """ "Spot down" for each node group of ours in scale-up ``Backoff`` in the autoscaler's
    status ConfigMap, at the status's ``last-updated`` time (the freshest moment the backoff
    was seen; else the group's ``scaleUp.lastTransitionTime``). Any other state, an old free
    text status, an unreadable one or one older than 30 min (no backoff lasts longer): none."""
    cm = as_dict(configmap)
    meta = pick(cm, "metadata") or {}
    try:
        status = yaml.safe_load(str((pick(cm, "data") or {}).get("status") or ""))
    except yaml.YAMLError:
        return []
    groups = status.get("nodeGroups") if isinstance(status, dict) else None
    if not isinstance(groups, list):
        return []  # a pre-1.30 free text status, or none
    updated = wall_time((pick(meta, "annotations") or {}).get(LAST_UPDATED))
    pools = list(pools)
    out = []
    for g in groups:
        scale_up = g.get("scaleUp") if isinstance(g, dict) else None
        if not isinstance(scale_up, dict) or scale_up.get("status") != BACKOFF_STATUS:
            continue
        pool = group_pool(str(g.get("name") or ""), pools)
        at = updated or wall_time(scale_up.get("lastTransitionTime"))
        if pool is None or at is None or now - at > AUTOSCALER_STATUS_STALE_S:
            continue
        info = scale_up.get("backoffInfo") or {}
        detail = f"node group {g.get('name')} in Backoff"
        if isinstance(info, dict) and (info.get("errorCode") or info.get("errorMessage")):
            detail += f": {info.get('errorCode') or ''} {info.get('errorMessage') or ''}".rstrip()
        out.append(SpotSignal(False, at, "autoscaler", pool, detail))
    return newest_per_pool(out)


def is_backoff_event(event: Mapping[str, Any]) -> bool:
    """A ``NotTriggerScaleUp`` that says a node group is in backoff after a failed scale-up."""
    return pick(event, "reason") == "NotTriggerScaleUp" and "backoff" in str(
        pick(event, "message") or ""
    )


def autoscaler_event_signals(
    events: Iterable[Any], pod_pools: Mapping[str, str], now: float
) -> list[SpotSignal]:
    """ "Spot down" from ``NotTriggerScaleUp ... in backoff after failed scale-up`` events on our
    own spot pods (``pod_pools``: pod name -> pool) of the last 5 minutes (the shortest backoff;
    the autoscaler repeats the event while the pod waits). ``TriggeredScaleUp`` says nothing:
    capacity is being asked for, not found."""
    out = []
    for raw in events:
        e = as_dict(raw)
        inv = _involved(e)
        name = str(pick(inv, "name") or "")
        at = event_time(e)
        if (
            not is_backoff_event(e)
            or pick(inv, "kind") != "Pod"
            or name not in pod_pools
            or at is None
            or now - at > AUTOSCALER_EVENT_TTL_S
        ):
            continue
        message = str(pick(e, "message") or "")[:200]
        out.append(SpotSignal(False, at, "autoscaler", pod_pools[name], f"pod {name}: {message}"))
    return newest_per_pool(out)


# -- nodes ---------------------------------------------------------------------------------------
def node_ready(node: Mapping[str, Any]) -> bool:
    conds = pick(pick(node, "status") or {}, "conditions") or []
    return any(pick(c, "type") == "Ready" and pick(c, "status") == "True" for c in conds)


def node_matches(node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """The placement's pod could go on this node: its node selector and required node affinity
    match the node's labels, and it tolerates the node's NoSchedule/NoExecute taints."""
    spec = _spec(pod)
    labels = pick(pick(node, "metadata") or {}, "labels") or {}
    selector = pick(spec, "node_selector", "nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    terms = _terms(spec)
    if terms and not any(_term_matches(t, labels) for t in terms):
        return False
    tolerations = pick(spec, "tolerations") or []
    return all(
        pick(t, "effect") not in ("NoSchedule", "NoExecute")
        or any(_tolerates(tol, t) for tol in tolerations)
        for t in pick(pick(node, "spec") or {}, "taints") or []
    )


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for e in pick(term, "match_expressions", "matchExpressions") or []:
        key, op, values = pick(e, "key"), pick(e, "operator"), set(pick(e, "values") or [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op, False)
        if not ok:
            return False
    return True


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if pick(tol, "effect") and pick(tol, "effect") != pick(taint, "effect"):
        return False
    if pick(tol, "operator") == "Exists":
        return not pick(tol, "key") or pick(tol, "key") == pick(taint, "key")
    return pick(tol, "key") == pick(taint, "key") and (pick(tol, "value") or "") == (
        pick(taint, "value") or ""
    )


def node_is_spot_for(node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """A spot node: by its capacity labels when it has any (``karpenter.sh/capacity-type``,
    ``eks.amazonaws.com/capacityType``, ``cloud.google.com/gke-spot``,
    ``kubernetes.azure.com/scalesetpriority``); without them, by the placement's own spot
    selector or affinity (a custom preset's labels say spot for this backend)."""
    labels = pick(pick(node, "metadata") or {}, "labels") or {}
    if any(k in labels for k in SPOT_LABELS):
        return any(
            str(labels.get(k, "")).lower() in {v.lower() for v in vs}
            for k, vs in SPOT_LABELS.items()
        )
    spec = _spec(pod)
    return bool(pick(spec, "node_selector", "nodeSelector") or _terms(spec))


def usable(node: Any, pod: Mapping[str, Any]) -> bool:
    """Ready, not cordoned, not being drained or reclaimed, a spot node the placement fits."""
    n = as_dict(node)
    spec = pick(n, "spec") or {}
    drained = any(pick(t, "key") in DRAIN_TAINTS | SPOT_TAINTS for t in pick(spec, "taints") or [])
    return (
        node_ready(n)
        and not pick(spec, "unschedulable")
        and not drained
        and node_is_spot_for(n, pod)
        and node_matches(n, pod)
    )


def free_gpus(node: Any, pods: Iterable[Any]) -> int:
    """The node's allocatable ``nvidia.com/gpu`` less the requests of the pods bound to it that
    have not ended."""
    alloc = pick(pick(as_dict(node), "status") or {}, "allocatable") or {}
    used = 0
    for raw in pods:
        p = as_dict(raw)
        if (pick(pick(p, "status") or {}, "phase") or "") not in ("Succeeded", "Failed"):
            used += gpu_request(p)
    return int(str(alloc.get(GPU) or 0)) - used


def node_signal(
    node: Any, pods: Iterable[Any], pool: str, pod: Mapping[str, Any], now: float
) -> SpotSignal | None:
    """ "Spot up" now when ``node`` is usable for the placement and has the job's GPUs free."""
    if not usable(node, pod):
        return None
    need, free = gpu_request(pod), free_gpus(node, pods)
    if free < need:
        return None
    name = pick(pick(as_dict(node), "metadata") or {}, "name")
    return SpotSignal(True, now, "node", pool, f"node {name}: {free} {GPU} free, {need} needed")


def pod_pool(pod: Any, placements: Iterable[Placement]) -> str | None:
    """The spot pool of one of our pods: a probe's pool label; else the placement whose node
    selector the pod's includes (the most specific); None when none fits."""
    p = as_dict(pod)
    labels = pick(pick(p, "metadata") or {}, "labels") or {}
    if "airflow-spot/pool" in labels:
        return str(labels["airflow-spot/pool"])
    have = pick(_spec(p), "node_selector", "nodeSelector") or {}
    best: tuple[int, str] | None = None
    for pool, place in placements:
        want = pick(_spec(place), "node_selector", "nodeSelector") or {}
        if all(have.get(k) == v for k, v in want.items()) and (best is None or len(want) > best[0]):
            best = (len(want), pool)
    return best[1] if best else None
