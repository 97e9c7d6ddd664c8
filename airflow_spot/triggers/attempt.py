"""The attempt trigger: watches the live attempt (or nothing, while waiting for spot) on any
backend, the replayed market where there is one, and the clock: the clock of the worker that
built it, whatever the triggerer's says (see :mod:`airflow_spot.triggers.base`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airflow_spot.backends.base import stop_and_release
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.triggers.base import SpotPollingTrigger
from airflow_spot.triggers.events import SpotEvent
from airflow_spot.triggers.watch import Watch


class AttemptTrigger(SpotPollingTrigger):
    """Watches an attempt through its backend (a Kubernetes pod's node and events too,
    relaying interruption notices to the pod as it goes: the pod's node and capacity are
    recorded in the handle it carries, so a verdict is possible after the node is gone)."""

    def __init__(
        self,
        *,
        handle: dict[str, Any] | None,
        backend: dict[str, Any] | None,
        market: dict[str, Any] | None,
        spot_was: bool | None,
        wake_at: float,
        poll_interval: float = 5.0,
        cooling: dict[str, float] | None = None,
        hold_until: float | None = None,
        issued_at: float | None = None,
    ) -> None:
        super().__init__(
            poll_interval=poll_interval,
            hold_until=hold_until,
            issued_at=issued_at,
            handle=handle,
            backend=backend,
            market=market,
            spot_was=spot_was,
            wake_at=wake_at,
            cooling=cooling,
        )
        typed = None if handle is None else AttemptHandle.from_dict(handle)
        self.watch = Watch(typed, market, spot_was, wake_at, backend, cooling, self.clock)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{AttemptTrigger.__module__}.{AttemptTrigger.__qualname__}", dict(self._kwargs)

    def poll(self) -> SpotEvent | None:
        return self.watch.poll_once()

    async def on_kill(self) -> None:
        """The user killed the task while it waited: stop the attempt (Airflow >= 3.3)."""
        handle = self.watch.handle
        if handle is not None:
            await asyncio.to_thread(stop_and_release, self.watch.attempts, handle)


def attempt_trigger(
    backend: dict[str, Any],
    handle: AttemptHandle | None,
    *,
    market: dict[str, Any] | None,
    spot_was: bool | None,
    wake_at: float,
    poll_interval: float,
    cooling: dict[str, float] | None = None,
    hold_until: float | None = None,
    issued_at: float | None = None,
) -> AttemptTrigger:
    """The trigger (and, as its ``watch``, the watcher the worker polls in synchronous mode)
    for an attempt on the backend ``backend`` (its ``to_dict()``): the one place they are picked.
    Runs on the worker: ``wake_at``, ``hold_until`` and ``cooling`` are wall times on its clock,
    and ``issued_at`` is that clock's time they were computed from (default: now), which lets
    the triggerer keep them on the worker's clock (see :mod:`airflow_spot.triggers.base`)."""
    return AttemptTrigger(
        handle=None if handle is None else handle.to_dict(),
        backend=backend,
        market=market,
        spot_was=spot_was,
        wake_at=wake_at,
        poll_interval=poll_interval,
        cooling=cooling or None,
        hold_until=hold_until,
        issued_at=time.time() if issued_at is None else issued_at,
    )
