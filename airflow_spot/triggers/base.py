"""The base of every airflow-spot trigger: it owns ``serialize()`` (classpath from
``__module__`` + ``__qualname__``), the polling loop and the trigger's clock; a subclass is a
constructor and a poll.

The clock. A trigger built by a worker (the attempt triggers) carries ``issued_at``, the worker's
wall time when it built it, and every time it holds (``wake_at``, ``hold_until``, cool-downs, a
replayed market's epoch) is on that worker's clock. The triggerer never compares them with its
own wall clock, which may be minutes off: it reads the worker's clock as :class:`IssuerClock`
does, ``issued_at`` plus the time elapsed since the trigger started running, measured on its
own monotonic clock. Two costs, both bounded: the time from the worker's deferral to the
triggerer starting the trigger (the triggerer loads new triggers every second or so) counts as
not elapsed, so a TICK comes that much late; and a triggerer restart rebuilds the trigger from
its kwargs, so its clock starts again from ``issued_at`` and the TICK (a periodic re-decision,
at most one ``decision_interval`` away) and a replayed market's next change are seen late by
the time the trigger had run before the restart: at most one TICK. An attempt that ended is
reported at the first poll either way. A trigger stored without ``issued_at`` (by an earlier
airflow-spot, 0.1.0 included) reads its times on the triggerer's wall clock, as before.

The heap. The first airflow-spot trigger to run in a triggerer process freezes the objects alive
then (``gc.freeze()``: Airflow's imports, mostly), as Airflow's dag-processor does before it
forks. A full collection then scans only what came later: with 1,000 deferred attempts, full
collections over a real triggerer's heap stopped the event loop for 0.1-0.26 s each
(``benchmarks/triggerer_load.py``), every trigger's poll waiting behind them. The cost: an
object alive at the freeze that later becomes cyclic garbage is never freed (bounded by that
heap, which a triggerer keeps anyway).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_spot.exceptions import ConfigError
from airflow_spot.triggers.events import EventKind, SpotEvent

# errors that another poll will not heal: the operator hears of them at once
PERMANENT = (ConfigError, TypeError, AttributeError, NameError, AssertionError)
_heap_frozen = False  # see "The heap" above: once per process


def freeze_heap_once() -> None:
    """``gc.freeze()`` the first time a trigger runs in this process (see the docstring)."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


class IssuerClock:
    """The wall clock of the worker that issued a trigger, as the trigger can know it without
    comparing clocks: ``issued_at`` (that worker's wall time when it built the trigger) plus
    the time elapsed since :meth:`start`, on this process's monotonic clock (so neither the
    skew between hosts nor a step of this host's wall clock moves it)."""

    def __init__(self, issued_at: float) -> None:
        self.issued_at = issued_at
        self.start()

    def start(self) -> None:
        """Count from now: where the trigger starts running (in the worker that built it, its
        construction is that moment)."""
        self._started = time.monotonic()

    def __call__(self) -> float:
        return self.issued_at + (time.monotonic() - self._started)


class SpotPollingTrigger(BaseTrigger):
    """Base: ``serialize()`` from ``__module__`` + ``__qualname__`` and the kwargs given; ``run()``
    polls :meth:`poll` every ``poll_interval`` seconds and yields the first typed event.
    ``clock`` is what "now" means to the trigger: the issuing worker's clock (see the module's
    docstring) where it was built with ``issued_at``, else this host's wall clock."""

    def __init__(
        self,
        *,
        poll_interval: float = 5.0,
        hold_until: float | None = None,
        issued_at: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.poll_interval = poll_interval
        # no event before this time on ``clock`` (see SpotTrainingOperator's min_deferral): the
        # poll goes on meanwhile (a Kubernetes watch still relays notices), then reports
        self.hold_until = hold_until
        self.clock: IssuerClock | Callable[[], float] = (
            time.time if issued_at is None else IssuerClock(issued_at)
        )
        self._kwargs = {"poll_interval": poll_interval, **kwargs}
        if hold_until is not None:  # only the attempt triggers take it
            self._kwargs["hold_until"] = hold_until
        if issued_at is not None:  # only the attempt triggers take it
            self._kwargs["issued_at"] = issued_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self._kwargs)

    def poll(self) -> SpotEvent | None:
        raise NotImplementedError

    max_errors = 3  # consecutive failed polls before the operator is woken with ERROR

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until an event; a failed poll (a network blip, a throttled API) is tried again
        after a growing pause (one poll interval more each time, at most 30 s), and only
        ``max_errors`` failures in a row, or one that another poll cannot heal, end the watch."""
        if isinstance(self.clock, IssuerClock):
            self.clock.start()  # the worker's times count from here (see the module docstring)
        freeze_heap_once()
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
                            EventKind.ERROR, self.clock(), message=f"{type(e).__name__}: {e}"
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
        """Seconds until events may be reported (0 when not held), on the trigger's clock."""
        return 0.0 if self.hold_until is None else max(0.0, self.hold_until - self.clock())
