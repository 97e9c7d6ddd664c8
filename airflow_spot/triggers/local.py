"""The attempt triggers: a local attempt under its supervisor, and a pod on Kubernetes."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_spot.triggers.base import SpotPollingTrigger
from airflow_spot.triggers.events import SpotEvent
from airflow_spot.triggers.watch import Watch


class LocalAttemptTrigger(SpotPollingTrigger):
    """Watches a local attempt (or nothing, while waiting for spot), the replayed market and the clock."""

    def __init__(
        self,
        *,
        handle: dict[str, Any] | None,
        market: dict[str, Any] | None,
        spot_was: bool | None,
        wake_at: float,
        poll_interval: float = 5.0,
        cooling: dict[str, float] | None = None,
        hold_until: float | None = None,
    ) -> None:
        super().__init__(
            poll_interval=poll_interval,
            hold_until=hold_until,
            handle=handle,
            market=market,
            spot_was=spot_was,
            wake_at=wake_at,
            cooling=cooling,
        )
        self.watch = Watch(handle, market, spot_was, wake_at, cooling=cooling)

    def poll(self) -> SpotEvent | None:
        return self.watch.poll_once()

    async def on_kill(self) -> None:
        """The user killed the task while it waited: stop the attempt (Airflow >= 3.3)."""
        if self.watch.handle is not None:
            from airflow_spot.backends.local.backend import LocalBackend

            await asyncio.to_thread(LocalBackend().cancel, self.watch.handle)


class KubernetesAttemptTrigger(SpotPollingTrigger):
    """Watches an attempt pod, its node and their events (relaying interruption notices to the
    pod as it goes), and the clock. The pod's node and capacity are recorded in the handle it
    carries, so a verdict is possible after the node is gone."""

    def __init__(
        self,
        *,
        handle: dict[str, Any] | None,
        backend: dict[str, Any],
        wake_at: float,
        poll_interval: float = 5.0,
        hold_until: float | None = None,
    ) -> None:
        super().__init__(
            poll_interval=poll_interval,
            hold_until=hold_until,
            handle=handle,
            backend=backend,
            wake_at=wake_at,
        )
        self.watch = Watch(handle, None, None, wake_at, backend)

    def poll(self) -> SpotEvent | None:
        return self.watch.poll_once()

    async def on_kill(self) -> None:
        """The user killed the task while it waited: delete the pod (Airflow >= 3.3)."""
        handle = self.watch.handle
        if handle is not None:
            from airflow_spot.backends.base import stop

            await asyncio.to_thread(lambda: stop(self.watch.k8s, handle))
