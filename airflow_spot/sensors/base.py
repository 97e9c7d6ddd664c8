"""What both sensors share: poke once, then wait in the triggerer, and finish on a typed event."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator

from airflow_spot.exceptions import BackendError


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
        if ev.kind is EventKind.ERROR:
            raise BackendError(
                f"{self.task_id}: watching in the triggerer failed ({ev.message}): the poll "
                "kept failing, or failed in a way another poll cannot heal. Fix the cause "
                "named (the AWS connection, the zones, the checkpoint location), then clear "
                "the task or let its retries run it again"
            )
        if ev.kind is not EventKind.CONDITION_MET:
            raise BackendError(
                f"{self.task_id}: the watch ended with a {ev.kind.value!r} event, which a "
                f"sensor's trigger never sends ({ev.message or 'no message'}); this is a bug in "
                "airflow-spot: please report it with this message"
            )
        return ev.status
