"""Reading what a cluster shows about spot through the backend's API, without launching anything.

Each source (Karpenter events, the autoscaler's status and events, nodes) is read with its own
permission. A 403 means the worker's service account may not read it: one warning naming the
missing permission, and that source is left out for the rest of this object's life (the
backend keeps one per backend object). Any other failure skips the source this time only. What
was read is turned into signals by the pure parsers in :mod:`.signals`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from urllib3.exceptions import HTTPError

from airflow_spot.backends.kubernetes.api import KubeApi, refusal
from airflow_spot.backends.kubernetes.probe import PROBE_LABEL, build_priority_class
from airflow_spot.backends.kubernetes.signals import (
    ICE_REASON,
    STATUS_CONFIGMAP,
    Placement,
    autoscaler_event_signals,
    autoscaler_status_signals,
    gpu_request,
    karpenter_signals,
    node_signal,
    pod_pool,
    usable,
)
from airflow_spot.backends.signals import SpotSignal

log = logging.getLogger(__name__)
RBAC_FIX = "grant it in the worker's Role/ClusterRole (see docker/rbac.yaml)"
MAX_NODES_READ = 20  # candidate nodes whose pods are listed per call (bounds the API calls)


class ClusterView:
    """The spot signals a cluster shows, read through ``api`` (the backend's)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.core = api.core  # its CoreV1Api, whose calls :meth:`read` makes
        self.namespace = api.namespace
        self.forbidden: set[str] = set()  # sources given up after a 403
        self.priority_class_checked = False

    def read(
        self, source: str, permission: str, fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """``fn(*args, **kw)``, or None: after a 403 (once: a warning naming ``permission``,
        then ``source`` is skipped for good), a 404, or another failure (a warning; tried
        again next time)."""
        if source in self.forbidden:
            return None
        try:
            return fn(*args, **kw)
        except (HTTPError, OSError) as e:
            log.warning("Spot signals: could not %s (%s); skipped this time.", permission, e)
        except Exception as e:
            refused = refusal(e)
            if refused is None:
                raise
            status, reason = refused
            if status == 403:
                self.forbidden.add(source)
                log.warning(
                    "Spot signals: the worker may not %s (403 Forbidden): going on without %s "
                    "signals for this backend; to use them, %s.",
                    permission,
                    source,
                    RBAC_FIX,
                )
            elif status != 404:
                log.warning(
                    "Spot signals: could not %s (%s %s); skipped this time.",
                    permission,
                    status,
                    reason,
                )
        return None

    def signals(self, placements: Sequence[Placement], now: float) -> list[SpotSignal]:
        """Every source's signals now (Karpenter ICE, autoscaler backoff, Ready spot nodes)."""
        return [
            *self.karpenter(placements, now),
            *self.autoscaler_status([pool for pool, _ in placements], now),
            *self.autoscaler_events(placements, now),
            *self.nodes(placements, now),
        ]

    def karpenter(self, placements: Sequence[Placement], now: float) -> list[SpotSignal]:
        got = self.read(
            "karpenter",
            "list events in all namespaces",
            self.core.list_event_for_all_namespaces,
            field_selector=f"reason={ICE_REASON},involvedObject.kind=NodeClaim",
        )
        return karpenter_signals(got.items, placements, now) if got is not None else []

    def autoscaler_status(self, pools: list[str], now: float) -> list[SpotSignal]:
        ns, name = STATUS_CONFIGMAP
        cm = self.read(
            "autoscaler-status",
            f"get configmaps in {ns}",
            self.core.read_namespaced_config_map,
            name,
            ns,
        )
        return autoscaler_status_signals(cm, pools, now) if cm is not None else []

    def autoscaler_events(self, placements: Sequence[Placement], now: float) -> list[SpotSignal]:
        """Backoff events on our own spot pods (attempts and probes) in our namespace."""
        from airflow_spot.backends.kubernetes.pods import MANAGED_BY

        ns = self.namespace
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        pods = self.read(
            "autoscaler-events",
            f"list pods in namespace {ns}",
            self.core.list_namespaced_pod,
            ns,
            label_selector=f"{selector},airflow-spot/capacity=spot",
        )
        if pods is None or not pods.items:
            return []
        events = self.read(
            "autoscaler-events",
            f"list events in namespace {ns}",
            self.core.list_namespaced_event,
            ns,
            field_selector="reason=NotTriggerScaleUp",
        )
        pools = {p.metadata.name: pod_pool(p, placements) for p in pods.items}
        ours = {k: v for k, v in pools.items() if v is not None}
        return autoscaler_event_signals(events.items, ours, now) if events is not None else []

    def nodes(self, placements: Sequence[Placement], now: float) -> list[SpotSignal]:
        """ "Up" per placement from a Ready spot node of it with the job's GPUs free."""
        got = self.read("nodes", "list nodes", self.core.list_node)
        if got is None:
            return []
        on_node: dict[str, list[Any] | None] = {}
        out = []
        for pool, pod in placements:
            need = gpu_request(pod)
            fits = [n for n in got.items if usable(n, pod) and _allocatable(n) >= need]
            for node in sorted(fits, key=lambda n: n.metadata.name)[:MAX_NODES_READ]:
                name = node.metadata.name
                if name not in on_node:
                    listed = self.read(
                        "nodes",
                        "list pods in all namespaces",
                        self.core.list_pod_for_all_namespaces,
                        field_selector=f"spec.nodeName={name}",
                    )
                    on_node[name] = listed.items if listed is not None else None
                pods = on_node[name]
                if pods is None:
                    break  # cannot tell what is free
                if (s := node_signal(node, pods, pool, pod, now)) is not None:
                    out.append(s)
                    break
        return out

    # -- probes ------------------------------------------------------------------------------
    def ensure_priority_class(self) -> None:
        """Create the probes' PriorityClass if missing (once per object): an existing one
        (409) is fine; a 403 is one warning (an admin may have created it already)."""
        if self.priority_class_checked:
            return
        self.priority_class_checked = True
        body = build_priority_class()
        self.read(
            "priority-class",
            f"create priorityclasses (scheduling.k8s.io) to make {body['metadata']['name']!r}",
            self.api.create_priority_class,
            body,
        )

    def drop_probes(self, label_selector: str) -> None:
        """Delete the probes that match ``label_selector`` (leftovers of an earlier try)."""
        got = self.read(
            "probes",
            f"list pods in namespace {self.namespace}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{label_selector},{PROBE_LABEL}=true",
        )
        for p in got.items if got is not None else []:
            log.info("Deleting leftover probe %s.", p.metadata.name)
            self.delete_pod(p.metadata.namespace or self.namespace, p.metadata.name)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod at once (grace 0); one already gone is fine."""
        self.api.delete_pod(name, 0, namespace=namespace, what="probe pod")

    def pod_and_events(self, namespace: str, name: str) -> tuple[Any, list[Any]]:
        """The pod (None when gone or unreadable) and its events."""
        pod = self.read(
            "probes",
            f"get pods in namespace {namespace}",
            self.core.read_namespaced_pod,
            name,
            namespace,
        )
        if pod is None:
            return None, []
        events = self.read(
            "probe-events",
            f"list events in namespace {namespace}",
            self.core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.name={name}",
        )
        return pod, list(events.items) if events is not None else []


def _allocatable(node: Any) -> int:
    alloc = (node.status.allocatable if node.status is not None else None) or {}
    return int(str(alloc.get("nvidia.com/gpu") or 0))
