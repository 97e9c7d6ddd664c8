"""A checkpoint's manifest: the files it names, each with its sha256, size and store tag.

It is written after the data, so a checkpoint exists only once its manifest does;
:class:`~airflow_spot.checkpoint.checkpoints.Checkpoints` saves, finds and verifies them."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_spot.checkpoint.base import safe_key

log = logging.getLogger(__name__)
MANIFEST = "MANIFEST.json"
OWNER = "job-owner.json"  # which task instance trains into this location
# what a watcher (operator, sensor) always hashes: a bigger file whose size and store tag are
# those the save recorded is the very object written; the training process hashes everything
WATCH_HASH_UP_TO = 64 << 20
RESUME_STAGE = ".airflow-spot-resume."  # resume_to's staging folder inside the user's folder


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds. ``created`` is seconds since the epoch, given by the caller."""

    step: int
    total_steps: int | None
    created: float
    files: dict[str, FileEntry]
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)  # each file's store tag when written
    # how many ranks trained it (a gang of N processes; 1 for one process): a resumed gang
    # is bit-identical to an uninterrupted one only at the same world size
    world_size: int = 1

    @property
    def name(self) -> str:
        return checkpoint_name(self.step)

    @property
    def progress(self) -> float | None:
        return self.step / self.total_steps if self.total_steps else None

    def to_json(self) -> bytes:
        d = asdict(self)
        if d["world_size"] == 1:  # one process: written as before gangs (older readers, digests)
            del d["world_size"]
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        d = json.loads(raw)
        files = {safe_key(k): FileEntry(**v) for k, v in d["files"].items()}
        return cls(
            int(d["step"]),
            d.get("total_steps"),
            float(d["created"]),
            files,
            d.get("metrics", {}),
            d.get("extra", {}),
            {str(k): str(v) for k, v in (d.get("tags") or {}).items()},
            int(d.get("world_size") or 1),  # manifests written before gangs: one process
        )


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:012d}"
