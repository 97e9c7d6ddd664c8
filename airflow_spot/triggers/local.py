"""Trigger class paths stored by airflow-spot 0.1.0 in Airflow's database: a task deferred by
that version resumes under this one. New deferrals use
:class:`airflow_spot.triggers.attempt.AttemptTrigger`."""

from __future__ import annotations

from typing import Any

from airflow_spot.triggers.attempt import AttemptTrigger


class LocalAttemptTrigger(AttemptTrigger):
    """0.1.0's trigger of a local attempt (its stored kwargs)."""

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
            handle=handle,
            backend=None,
            market=market,
            spot_was=spot_was,
            wake_at=wake_at,
            poll_interval=poll_interval,
            cooling=cooling,
            hold_until=hold_until,
        )


class KubernetesAttemptTrigger(AttemptTrigger):
    """0.1.0's trigger of a pod (its stored kwargs)."""

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
            handle=handle,
            backend=backend,
            market=None,
            spot_was=None,
            wake_at=wake_at,
            poll_interval=poll_interval,
            hold_until=hold_until,
        )
