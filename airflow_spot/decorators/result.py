"""A ``@task.spot_training`` function's return value, from the training process to the task.

The training process writes it into the checkpoint location (the one place both the pod and
the worker reach), tagged with the checkpoint it belongs to; the operator reads it when the job
finishes and keeps it in the task's XCom beside the ledger summary, under ``result``. A result
tagged with another checkpoint (an earlier job's at the same location) is never taken.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_spot.checkpoint.base import Store
from airflow_spot.exceptions import CheckpointError, ConfigError

RESULT_KEY = "taskflow-result.json"
MAX_RESULT_BYTES = 64_000  # the task state store warns above 64 KB; XComs should stay small


def encode(value: Any, checkpoint: str | None, step: int | None) -> bytes:
    """The result document, or a ConfigError if ``value`` is not a small JSON value."""
    try:
        text = json.dumps({"checkpoint": checkpoint, "step": step, "value": value})
    except (TypeError, ValueError) as e:
        raise ConfigError(
            "return value",
            f"is not a JSON value ({e}); return numbers, strings, lists and dicts (metrics, a "
            "model's URI), or None",
        ) from None
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise ConfigError(
            "return value",
            f"takes {len(text.encode()) // 1000} KB as JSON, over {MAX_RESULT_BYTES // 1000} KB: "
            "return a summary and write bigger outputs to files beside the checkpoints",
        )
    return text.encode()


def write(store: Store, value: Any, checkpoint: str | None, step: int | None) -> None:
    """Keep the function's return value (``checkpoint``: the newest one it saved)."""
    store.put(RESULT_KEY, encode(value, checkpoint, step))


def read(store: Store, checkpoint: str) -> tuple[bool, Any]:
    """(found, value) for the job whose final checkpoint is ``checkpoint``: a result written
    for another checkpoint, or none at all, is (False, None)."""
    try:
        doc = json.loads(store.get(RESULT_KEY))
    except (CheckpointError, ValueError):
        return False, None
    if not isinstance(doc, dict) or doc.get("checkpoint") != checkpoint:
        return False, None
    return True, doc.get("value")
