"""A checkpoint's manifest: the files it names, each with its digest (XXH3-128, BLAKE3 or
sha256: the entry names which), size and store tag.

It is written after the data, so a checkpoint exists only once its manifest does;
:class:`~airflow_spot.checkpoint.checkpoints.Checkpoints` saves, finds and verifies them."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_spot.checkpoint.base import safe_key
from airflow_spot.checkpoint.hashing import ALGORITHMS, SHA256

log = logging.getLogger(__name__)
MANIFEST = "MANIFEST.json"
OWNER = "job-owner.json"  # which task instance trains into this location
# what a watcher (operator, sensor) always hashes: a bigger file whose size and store tag are
# those the save recorded is the very object written; the training process hashes everything
WATCH_HASH_UP_TO = 64 << 20
RESUME_STAGE = ".airflow-spot-resume."  # resume_to's staging folder inside the user's folder


@dataclass(frozen=True)
class FileEntry:
    """A file's digest in ``algo`` and its size; written ``{algo: digest, "size": size}``,
    which for sha256 is every manifest's form before BLAKE3."""

    digest: str
    size: int
    algo: str = SHA256

    @property
    def sha256(self) -> str | None:
        """The sha256 (None for an entry hashed otherwise)."""
        return self.digest if self.algo == SHA256 else None

    def to_dict(self) -> dict[str, Any]:
        return {self.algo: self.digest, "size": self.size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileEntry:
        algos = [a for a in ALGORITHMS if a in d]
        if len(algos) != 1 or set(d) != {algos[0], "size"}:
            raise ValueError(f"a file entry is {{one of {list(ALGORITHMS)}, 'size'}}, not {d}")
        return cls(str(d[algos[0]]), int(d["size"]), algos[0])


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
        d["files"] = {k: e.to_dict() for k, e in self.files.items()}
        if d["world_size"] == 1:  # one process: written as before gangs (older readers, digests)
            del d["world_size"]
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        d = json.loads(raw)
        files = {safe_key(k): FileEntry.from_dict(v) for k, v in d["files"].items()}
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
