"""The base of every airflow-spot trigger: it owns ``serialize()`` (classpath from
``__module__`` + ``__qualname__``) and the polling loop; a subclass is a constructor and a poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_spot.exceptions import ConfigError
from airflow_spot.triggers.events import EventKind, SpotEvent

# errors that another poll will not heal: the operator hears of them at once
PERMANENT = (ConfigError, TypeError, AttributeError, NameError, AssertionError)


class SpotPollingTrigger(BaseTrigger):
    """Base: ``serialize()`` from ``__module__`` + ``__qualname__`` and the kwargs given; ``run()``
    polls :meth:`poll` every ``poll_interval`` seconds and yields the first typed event."""

    def __init__(
        self, *, poll_interval: float = 5.0, hold_until: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__()
        self.poll_interval = poll_interval
        # no event before this wall time (see SpotTrainingOperator's min_deferral): the poll
        # goes on meanwhile (a Kubernetes watch still relays notices), then reports what holds
        self.hold_until = hold_until
        self._kwargs = {"poll_interval": poll_interval, **kwargs}
        if hold_until is not None:  # only the attempt triggers take it
            self._kwargs["hold_until"] = hold_until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self._kwargs)

    def poll(self) -> SpotEvent | None:
        raise NotImplementedError

    max_errors = 3  # consecutive failed polls before the operator is woken with ERROR

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until an event; a failed poll (a network blip, a throttled API) is tried again
        after a growing pause (one poll interval more each time, at most 30 s), and only
        ``max_errors`` failures in a row, or one that another poll cannot heal, end the watch."""
        errors = 0
        while True:
            try:
                event = await asyncio.to_thread(self.poll)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - report, so the operator decides what to do
                errors += 1
                if errors >= self.max_errors or isinstance(e, PERMANENT):
                    self.log.exception(
                        "Watching failed %d times in a row; waking the operator to decide.", errors
                    )
                    await asyncio.sleep(self._hold_left())
                    yield TriggerEvent(
                        SpotEvent(
                            EventKind.ERROR, time.time(), message=f"{type(e).__name__}: {e}"
                        ).to_payload()
                    )
                    return
                pause = min(30.0, self.poll_interval * errors)
                self.log.warning(
                    "Watching failed (%s: %s); trying again in %.1f s (%d/%d).",
                    type(e).__name__,
                    e,
                    pause,
                    errors,
                    self.max_errors,
                )
                await asyncio.sleep(pause)
                continue
            errors = 0
            if event is not None and self._hold_left() == 0:
                yield TriggerEvent(event.to_payload())
                return
            await asyncio.sleep(self.poll_interval)

    def _hold_left(self) -> float:
        """Seconds until events may be reported (0 when not held)."""
        return 0.0 if self.hold_until is None else max(0.0, self.hold_until - time.time())
