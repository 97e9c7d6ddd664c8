"""Checkpoints: data files first, then a manifest naming them with their sha256 and size.

A checkpoint exists only once its manifest does, and is *valid* only if every file it names
is present with that hash and size. ``latest_valid()`` walks from the newest manifest back
and skips torn or corrupt checkpoints with a warning; it never returns one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_spot.checkpoint.stores import Store, safe_key
from airflow_spot.exceptions import CheckpointError

log = logging.getLogger(__name__)
MANIFEST = "MANIFEST.json"


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

    @property
    def name(self) -> str:
        return checkpoint_name(self.step)

    @property
    def progress(self) -> float | None:
        return self.step / self.total_steps if self.total_steps else None

    def to_json(self) -> bytes:
        d = asdict(self)
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
        )


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:012d}"


class Checkpoints:
    """Save, find and load checkpoints in a store; keep the last ``keep`` valid ones."""

    def __init__(self, store: Store, keep: int = 3) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1, got {keep}")
        self.store = store
        self.keep = keep
        self._verified: set[str] = set()  # names saved or verified by this instance

    def save(
        self,
        step: int,
        files: dict[str, bytes],
        *,
        now: float,
        total_steps: int | None = None,
        metrics: dict[str, float] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Manifest:
        """Write ``files`` for ``step``, then the manifest; then apply retention."""
        if not files:
            raise CheckpointError("a checkpoint needs at least one file")
        base = checkpoint_name(step)
        entries = {}
        for name, data in files.items():
            safe_key(name)
            self.store.put(f"{base}/{name}", data)
            entries[name] = FileEntry(hashlib.sha256(data).hexdigest(), len(data))
        manifest = Manifest(step, total_steps, now, entries, dict(metrics or {}), dict(extra or {}))
        self.store.put(f"{base}/{MANIFEST}", manifest.to_json())
        self._verified.add(base)
        self._retain(base)
        return manifest

    def manifests(self) -> list[str]:
        """Checkpoint names that have a manifest, newest (highest step) first."""
        names = {k.split("/")[0] for k in self.store.list("ckpt-") if k.endswith("/" + MANIFEST)}
        return sorted(names, reverse=True)

    def read_manifest(self, name: str) -> Manifest:
        try:
            return Manifest.from_json(self.store.get(f"{safe_key(name)}/{MANIFEST}"))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{name}: unreadable manifest ({e})") from e

    def verify(self, name: str) -> Manifest:
        """The manifest of ``name`` if every file matches it; raises CheckpointError otherwise."""
        m = self.read_manifest(name)
        for fname, entry in m.files.items():
            data = self.store.get(f"{name}/{fname}")
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CheckpointError(f"{name}/{fname}: size or sha256 differs from the manifest")
        self._verified.add(name)
        return m

    def latest_valid(self) -> Manifest | None:
        """The newest complete checkpoint whose files match their hashes (None if there is none)."""
        for name in self.manifests():
            try:
                return self.verify(name)
            except CheckpointError as e:
                log.warning("Skipping checkpoint %s: %s; trying the one before it.", name, e)
        return None

    def latest_manifest(self) -> Manifest | None:
        """The newest readable manifest, without hashing files (cheap progress probe)."""
        for name in self.manifests():
            try:
                return self.read_manifest(name)
            except CheckpointError:
                continue
        return None

    def load(self, manifest: Manifest) -> dict[str, bytes]:
        """The files of a checkpoint, each checked against the manifest."""
        out = {}
        for fname, entry in manifest.files.items():
            data = self.store.get(f"{manifest.name}/{fname}")
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CheckpointError(f"{manifest.name}/{fname}: sha256 differs from the manifest")
            out[fname] = data
        return out

    def _is_valid(self, name: str) -> bool:
        if name in self._verified:
            return True
        try:
            self.verify(name)
        except CheckpointError as e:
            log.warning("Deleting checkpoint %s: %s.", name, e)
            return False
        return True

    def _retain(self, saved: str) -> None:
        """Keep the newest ``keep`` *valid* checkpoints, always including ``saved``.

        Validity, not step, decides: after resuming from an older checkpoint because a newer
        one was corrupt, the corrupt one must neither count toward ``keep`` (it would push out
        every good one) nor stay (``latest_manifest()`` would report its step as progress).
        Each checkpoint is hashed at most once per instance.
        """
        kept: list[str] = []
        for name in self.manifests():  # newest first
            if name == saved or (len(kept) < self.keep and self._is_valid(name)):
                kept.append(name)
                continue
            self._verified.discard(name)
            self.store.delete(f"{name}/{MANIFEST}")  # invisible first, then its data
            for key in self.store.list(name + "/"):
                self.store.delete(key)
        # data left behind by saves that never wrote their manifest, older than the oldest kept
        oldest = min(kept)
        for key in self.store.list("ckpt-"):
            if key.split("/")[0] < oldest:
                self.store.delete(key)
