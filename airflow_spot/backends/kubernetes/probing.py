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


def start_probe(backend: Any, ident: TaskIdentity, pool: str) -> dict[str, Any]:
    """Start a probe pod for spot in ``pool`` (after deleting this task's leftover probe of
    that pool); returns its handle."""
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
    body = build_probe(
        backend.api.as_json(training),
        name=name,
        labels=labels,
        pool=pool,
        image=backend.probe_image,
    )
    backend.api.create_probe(
        body,
        name,
        f" (a probe needs the PriorityClass {body['spec']['priorityClassName']!r}: let the "
        "worker create priorityclasses, or create it once from probe.build_priority_class())",
    )
    return {"namespace": backend.namespace, "name": name, "pool": pool, "created_at": created}


def probe_signal(backend: Any, probe: dict[str, Any], now: float) -> SpotSignal | None:
    """What the probe shows now: bound, up; refused (backoff, an ICE for its pool, or
    unschedulable with no scale-up asked for), down; else None (nothing known yet)."""
    pod, events = backend.cluster.pod_and_events(probe["namespace"], probe["name"])
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
