"""What both sensors share: poke once, then wait in the triggerer, and finish on a typed event."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator


class DeferrableSpotSensor(BaseSensorOperator):
    """Subclasses implement ``poke`` and ``trigger()``; ``deferrable`` picks where to wait."""

    deferrable: bool = True

    def trigger(self) -> Any:
        raise NotImplementedError

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if first.is_done:  # type: ignore[union-attr]
            return first.xcom_value  # type: ignore[union-attr]
        self.defer(
            trigger=self.trigger(),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)) if self.timeout else None,
        )

    def execute_complete(
        self, context: Any, event: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        from airflow_spot.triggers.events import EventKind, SpotEvent

        ev = SpotEvent.from_payload(event)
        if ev.kind is not EventKind.CONDITION_MET:
            raise RuntimeError(
                f"{self.task_id}: the watch ended with {ev.kind.value}: {ev.message}"
            )
        return ev.status
