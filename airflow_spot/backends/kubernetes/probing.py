"""Probing spot for the backend: a probe pod started for a task and a pool, and read.

The probe's manifest and what a probe pod shows are pure (:mod:`.probe`); here they meet the
cluster: the probe is built on the spot pod a launch would create (its placement and GPUs),
its PriorityClass made if missing, a leftover probe of the task deleted first, and a pending
probe read with the refusals Karpenter published for its pool. A probe's handle is JSON
(``{namespace, name, pool, created_at}``): the operator stores it in the task's state. The
``backend`` below is the ``KubernetesBackend`` that probes (its API, cluster view, placements).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.kubernetes.pods import attempt_pod, label_selector, pod_name, task_labels
from airflow_spot.backends.kubernetes.probe import POOL_LABEL, build_probe, read_probe
from airflow_spot.backends.signals import SpotSignal


def probe_names(probe: dict[str, Any]) -> list[str]:
    """The pods of a probe: its name, or for a gang's (``count`` N) ``<name>-0`` ... ``-N-1``."""
    count = int(probe.get("count") or 1)
    name = str(probe["name"])
    return [name] if count == 1 else [f"{name}-{k}" for k in range(count)]


def start_probe(backend: Any, ident: TaskIdentity, pool: str) -> dict[str, Any]:
    """Start a probe for spot in ``pool`` (after deleting this task's leftover probes of that
    pool): one pod, or one per rank of a gang (``backend.nodes``); returns its handle."""
    backend.placement("spot", pool)  # an unknown pool is a ConfigError now
    labels = task_labels(ident)
    view = backend.cluster
    view.ensure_priority_class()
    view.drop_probes(f"{label_selector(labels)},{POOL_LABEL}={pool}")
    created = time.time()
    stem = pod_name(ident, 0)[: -len("-a0")]
    suffix = hashlib.sha1(f"{pool}/{created}".encode()).hexdigest()[:6]
    name = f"{stem}-probe-{suffix}"
    training = attempt_pod(
        backend,
        name=name,
        labels=labels,
        try_number=ident.try_number,
        attempt=0,
        capacity="spot",
        command=["/pause"],
        checkpoint_uri="",
        pool=pool,
    )
    handle = {"namespace": backend.namespace, "name": name, "pool": pool, "created_at": created}
    if backend.nodes > 1:
        handle["count"] = int(backend.nodes)
    for pod in probe_names(handle):
        body = build_probe(
            backend.api.as_json(training),
            name=pod,
            labels=labels,
            pool=pool,
            image=backend.probe_image,
        )
        backend.api.create_probe(
            body,
            pod,
            f" (a probe needs the PriorityClass {body['spec']['priorityClassName']!r}: let the "
            "worker create priorityclasses, or create it once from probe.build_priority_class())",
        )
    return handle


def probe_signal(backend: Any, probe: dict[str, Any], now: float) -> SpotSignal | None:
    """What the probe shows now: bound, up; refused (backoff, an ICE for its pool, or
    unschedulable with no scale-up asked for), down; else None (nothing known yet). A gang's
    N probe pods: up when all N are bound, down when one is refused ("fewer than N"), else
    what Karpenter's NodeClaims for them show (:mod:`.capacity_signals`): one failed for
    capacity, down ("fewer than N"); all launched, up ("N seen"); else None."""
    names = probe_names(probe)
    seen = [_one_probe(backend, probe, name, now) for name in names]
    if len(names) == 1:
        return seen[0]
    up = [s for s in seen if s is not None and s.up]
    down = [s for s in seen if s is not None and not s.up]
    pool, n = str(probe.get("pool") or ""), len(names)
    if len(up) == n:
        return SpotSignal(True, max(s.at for s in up), "probe", pool, f"all {n} probes placed")
    claims = claims_signal(backend, probe["namespace"], names, float(probe["created_at"]), now)
    if claims is not None and not claims.up:
        down.insert(0, claims)  # the gang's own count first among refusals of the same time
    if down:
        first = min(down, key=lambda s: s.at)
        return SpotSignal(
            False, first.at, "probe", pool, f"{len(up)} of {n} probes placed; {first.detail}"
        )
    if claims is not None:
        return SpotSignal(True, claims.at, "probe", pool, claims.detail)
    return None


def claims_signal(
    backend: Any, namespace: str, pods: list[str], since: float, now: float
) -> SpotSignal | None:
    """A gang's capacity as Karpenter's NodeClaims for its ``pods`` show it ("fewer than N",
    "N seen", None: unknown; :func:`.capacity_signals.claim_signal`)."""
    from airflow_spot.backends.kubernetes.capacity_calls import count_claims
    from airflow_spot.backends.kubernetes.capacity_signals import claim_signal

    count = count_claims(backend.cluster, namespace, pods, len(pods), since, now)
    return claim_signal(count, "")


def _one_probe(backend: Any, probe: dict[str, Any], name: str, now: float) -> SpotSignal | None:
    pod, events = backend.cluster.pod_and_events(probe["namespace"], name)
    if pod is None:
        return None
    pool = str(probe.get("pool") or "")
    bound = pod.spec is not None and pod.spec.node_name
    refusals = [] if bound else backend.cluster.karpenter(backend.spot_placements(pool), now)
    return read_probe(
        pod,
        events,
        pool=pool,
        created_at=float(probe["created_at"]),
        now=now,
        refusals=refusals,
    )
