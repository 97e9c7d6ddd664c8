"""Where attempts run. An attempt is one launch on one capacity; a backend launches, watches,
cancels, and says what happened in typed terms (:class:`Outcome`)."""

from __future__ import annotations

from airflow_spot.backends.base import AttemptStatus, Outcome, State

__all__ = ["AttemptStatus", "Outcome", "State"]
