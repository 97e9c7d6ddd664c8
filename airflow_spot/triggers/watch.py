"""The watcher's logic, shared by the trigger (deferrable) and the operator (synchronous mode).

Pure of Airflow: one :func:`poll_once` looks at the attempt's status, the market and the
clock and returns an event or ``None``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_spot.backends.local.backend import read_status
from airflow_spot.backends.local.market import Pools
from airflow_spot.triggers.events import EventKind, SpotEvent


@dataclass
class Watch:
    """What to watch: an attempt (or none, while idle), the market, and when to wake anyway."""

    handle: dict[str, Any] | None
    market: dict[str, Any] | None
    spot_was: bool | None
    wake_at: float
    backend: dict[str, Any] | None = None  # a Kubernetes backend's settings; None = local
    # pools kept out after losing the job's capacity, with the wall time their cool-down ends:
    # the watcher sees spot as the controller does, or it would wake it for a pool it skips
    cooling: dict[str, float] | None = None

    def __post_init__(self) -> None:
        self._loaded = False
        self._market: Pools | None = None
        self._k8s: Any = None

    def _load(self) -> None:
        """Read the market and build the backend on first use: in the triggerer that is the
        first poll, in a thread, not the constructor, which runs in the event loop."""
        if self._loaded:
            return
        self._market = Pools.load(self.market) if self.market else None
        if self.backend and self.backend.get("kind") == "kubernetes":
            from airflow_spot.backends.kubernetes.backend import KubernetesBackend

            self._k8s = KubernetesBackend.from_dict(self.backend)
        self._loaded = True

    @property
    def k8s(self) -> Any:
        self._load()
        return self._k8s

    def status(self, handle: dict[str, Any]):
        return self.k8s.status(handle) if self.k8s is not None else read_status(handle)

    def poll_once(self, now: float | None = None) -> SpotEvent | None:
        now = time.time() if now is None else now
        self._load()
        spot = None
        if self._market:
            cool = {p for p, until in (self.cooling or {}).items() if now < until}
            spot = self._market.available_at(now, cool)
        if self.handle is not None:
            st = self.status(self.handle)
            if st.terminal:
                return SpotEvent(
                    EventKind.ATTEMPT_ENDED, now, spot, st.to_dict(), handle=self.handle
                )
        if spot is not None and self.spot_was is not None and spot != self.spot_was:
            return SpotEvent(EventKind.MARKET_CHANGED, now, spot, handle=self.handle)
        if now >= self.wake_at:
            return SpotEvent(EventKind.TICK, now, spot, handle=self.handle)
        return None
