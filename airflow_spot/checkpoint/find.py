"""Find the newest valid checkpoint that meets a step or time bound (what ``CheckpointSensor``
and its trigger wait for). No Airflow import: the caller opens the store, with an S3 client
built from an Airflow connection where there is one (see :mod:`airflow_spot.hooks.conditions`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from airflow_spot.checkpoint.base import Store
from airflow_spot.checkpoint.checkpoints import Checkpoints


def find_checkpoint(
    uri: str, min_step: int | None, newer_than: float | None, store: Store
) -> dict[str, Any] | None:
    """The newest valid checkpoint in ``store`` (the store of ``uri``) meeting the bounds, as a
    manifest dict with its ``name`` and ``uri`` (None if there is none)."""
    m = Checkpoints.watching(store).latest_valid()
    if (
        m is None
        or (min_step is not None and m.step < min_step)
        or (newer_than is not None and m.created < newer_than)
    ):
        return None
    out = asdict(m)
    out["name"] = m.name
    out["uri"] = f"{uri.rstrip('/')}/{m.name}"
    return out
