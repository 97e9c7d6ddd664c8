"""Find the newest valid checkpoint that meets a step or time bound (what ``CheckpointSensor``
and its trigger wait for). No Airflow import: an S3 client built from an Airflow connection is
passed in (see :mod:`airflow_spot.hooks.conditions`), or an already open store."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.stores import Store, open_store


def find_checkpoint(
    uri: str,
    min_step: int | None,
    newer_than: float | None,
    *,
    s3_client: Any = None,
    store: Store | None = None,
) -> dict[str, Any] | None:
    """The newest valid checkpoint under ``uri`` meeting the bounds, as a manifest dict with its
    ``name`` and ``uri`` (None if there is none).

    :param store: the store of ``uri``, already open (a watcher polling again reuses it); else
        it is opened here, with ``s3_client`` for ``s3://`` (None: boto3's own environment).
    """
    if store is None:
        store = open_store(uri, s3_client=s3_client)
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
