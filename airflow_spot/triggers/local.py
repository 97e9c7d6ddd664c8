"""Trigger class paths stored by airflow-spot 0.1.0 in Airflow's database: a task deferred by
that version resumes under this one. New deferrals use
:class:`airflow_spot.triggers.attempt.AttemptTrigger`."""

from __future__ import annotations

from typing import Any

from airflow_spot.triggers.attempt import AttemptTrigger


class LocalAttemptTrigger(AttemptTrigger):
    """0.1.0's trigger of a local attempt; its stored kwargs (``handle``, ``market``,
    ``spot_was``, ``wake_at``, ``poll_interval``, ``cooling``, ``hold_until``) name no backend."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(backend=None, **kwargs)


class KubernetesAttemptTrigger(AttemptTrigger):
    """0.1.0's trigger of a pod; its stored kwargs (``handle``, ``backend``, ``wake_at``,
    ``poll_interval``, ``hold_until``) carry no replayed market."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(market=None, spot_was=None, **kwargs)
