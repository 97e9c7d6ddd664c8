"""How the Kubernetes backend sees spot beyond its own attempts: what the cluster shows
(Karpenter ICE events, autoscaler backoffs, free spot nodes) and probes that ask it. A mixin of
``KubernetesBackend`` (its ``api``, ``cluster``, ``nodes`` and placements); the parsers are
:mod:`.signals`, the probes :mod:`.probe` and :mod:`.probing`, all imported when first used.

A gang of N (``nodes`` > 1) needs N nodes: one free spot node says nothing of N, so the
cluster's "a Ready spot node has the GPUs free" signal is left out for it, and its probe is N
probe pods, up only when all N are placed (:func:`.probing.probe_signal`).
"""

from __future__ import annotations

from typing import Any

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.kubernetes.connection import reaching_server
from airflow_spot.backends.signals import SpotSignal


class SeesSpotOnCluster:
    """The :class:`~airflow_spot.backends.base.SeesSpot` side of ``KubernetesBackend``."""

    nodes: int
    api: Any
    cluster: Any

    def spot_placements(self, pool: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(pool, the spot pod a launch would create there, as API JSON) for each spot pool
        (``""``: the preset's spot placement when there are no pools)."""
        from airflow_spot.backends.kubernetes.pods import spot_pods

        return [(name, self.api.as_json(pod)) for name, pod in spot_pods(self, pool)]

    def spot_signals(self, now: float) -> list[SpotSignal]:
        """What the cluster shows about spot now, launching nothing: Karpenter ICE events of
        the last 3 min and autoscaler backoffs (down), Ready spot nodes of a pool with the
        job's GPUs free (up; not for a gang: one node is not N). A quiet cluster shows nothing
        (unknown, not up). A source the worker may not read (403) is warned about once and
        left out from then on."""
        signals = self.cluster.signals(self.spot_placements(), now)
        if self.nodes > 1:
            signals = [s for s in signals if not (s.up and s.source == "node")]
        return signals

    @reaching_server
    def probe(self, ident: TaskIdentity, pool: str = "") -> dict[str, Any]:
        """Start a probe for spot in ``pool`` (after deleting this task's leftover probe of
        that pool): one probe pod, N for a gang; returns its handle ``{namespace, name, pool,
        created_at}`` (and ``count`` for a gang's; JSON-able)."""
        from airflow_spot.backends.kubernetes.probing import start_probe

        return start_probe(self, ident, pool)

    def probe_signal(self, probe: dict[str, Any], now: float) -> SpotSignal | None:
        """What the probe shows now: bound (all N of a gang's), up; refused (backoff, an ICE
        for its pool, or unschedulable with no scale-up asked for), down; else None."""
        from airflow_spot.backends.kubernetes.probing import probe_signal

        return probe_signal(self, probe, now)

    @reaching_server
    def drop_probe(self, probe: dict[str, Any]) -> None:
        """Delete the probe's pods at once (grace 0), so nodes made for them go back."""
        from airflow_spot.backends.kubernetes.probing import probe_names

        for name in probe_names(probe):
            self.cluster.delete_pod(probe["namespace"], name)
