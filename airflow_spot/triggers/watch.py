"""The watcher's logic, shared by the trigger (deferrable) and the operator (synchronous mode).

Pure of Airflow: one :func:`poll_once` looks at the attempt's status, the market and the
clock and returns an event or ``None``.

Every time a watch holds is on the clock of the worker that built it (``wake_at``, the cool-downs,
the replayed market's epoch, the handle's lease), and ``clock`` reads that clock: in the worker,
its wall clock; in the triggerer, :class:`~airflow_spot.triggers.base.IssuerClock` (never the
triggerer's own wall clock, which may be minutes off). The lease is renewed on that clock too:
a local attempt's supervisor, spawned by the worker on its host, reads it on the same clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_spot.backends.base import AttemptStatus, Backend, renew_lease
from airflow_spot.backends.capacity import replayed_spot
from airflow_spot.backends.local.market import Pools
from airflow_spot.backends.registry import load_backend
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.triggers.events import EventKind, SpotEvent


@dataclass
class Watch:
    """What to watch: an attempt (or none, while idle), the market, and when to wake anyway."""

    handle: AttemptHandle | None
    market: dict[str, Any] | None
    spot_was: bool | None
    wake_at: float
    # the backend's settings (``to_dict``); None: the local backend
    backend: dict[str, Any] | None = None
    # pools kept out after losing the job's capacity, with the wall time their cool-down ends:
    # the watcher sees spot as the controller does, or it would wake it for a pool it skips
    cooling: dict[str, float] | None = None
    # "now" on the clock of the worker that built the watch (see the module's docstring)
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._loaded = False
        self._market: Pools | None = None
        self._backend: Backend | None = None

    def _load(self) -> None:
        """Read the market and build the backend on first use: in the triggerer that is the
        first poll, in a thread, not the constructor, which runs in the event loop."""
        if self._loaded:
            return
        self._market = Pools.load(self.market) if self.market else None
        self._backend = load_backend(self.backend or {"kind": "local"})
        self._loaded = True

    @property
    def attempts(self) -> Backend:
        """The backend the watched attempt runs on."""
        self._load()
        assert self._backend is not None
        return self._backend

    def status(self, handle: AttemptHandle, now: float | None = None) -> AttemptStatus:
        """The attempt's status, after doing what it found due (relaying a notice while the
        task is deferred is the watcher's job): ``backends.base.look``, with the lease renewed
        on the watch's clock (``now``), not this host's."""
        backend = self.attempts
        status = backend.status(handle)
        backend.carry_out(handle, status)
        if not status.terminal:
            renew_lease(backend, handle, self.clock() if now is None else now)
        return status

    def poll_once(self, now: float | None = None) -> SpotEvent | None:
        now = self.clock() if now is None else now
        self._load()
        spot = replayed_spot(self._market, now, self.cooling) if self._market else None
        if self.handle is not None:
            st = self.status(self.handle, now)
            if st.terminal:
                return SpotEvent(
                    EventKind.ATTEMPT_ENDED, now, spot, st.to_dict(), handle=self.handle
                )
        if spot is not None and self.spot_was is not None and spot != self.spot_was:
            return SpotEvent(EventKind.MARKET_CHANGED, now, spot, handle=self.handle)
        if now >= self.wake_at:
            return SpotEvent(EventKind.TICK, now, spot, handle=self.handle)
        return None
