"""Checkpoints: data files first, then a manifest naming them with their sha256 and size.

A checkpoint exists only once its manifest does, and is *valid* only if every file it names
is present with that hash and size. ``latest_valid()`` walks from the newest manifest back
and skips torn or corrupt checkpoints with a warning; it never returns one.

A file may be given as bytes or as a local path; a path is hashed and uploaded in chunks
(multi-GB model files never sit in memory). The manifest also records each file's tag as the
store wrote it (S3's ETag; inode and mtime on disk). ``hash_up_to`` lets a watcher that only
needs to know a checkpoint is whole (the operator, the sensor) check a bigger file by its size
and tag, which a HEAD gives, and hash it only if the tag differs (the files were copied, or
written again); the training process, which loads the files, hashes them all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from airflow_spot.checkpoint.base import Store, file_digest, safe_key
from airflow_spot.checkpoint.manifest import (
    MANIFEST,
    OWNER,
    RESUME_STAGE,
    WATCH_HASH_UP_TO,
    FileEntry,
    Manifest,
    checkpoint_name,
)
from airflow_spot.checkpoint.writable import writing
from airflow_spot.exceptions import CheckpointError, ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Checkpoints:
    """Save, find and load checkpoints in a store; keep the last ``keep`` valid ones."""

    def __init__(self, store: Store, keep: int = 3, *, hash_up_to: int | None = None) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1, got {keep}")
        self.store = store
        self.keep = keep
        self.hash_up_to = hash_up_to  # bigger files: size and store tag (hashed if the tag moved)
        self._verified: set[str] = set()  # names saved or verified by this instance

    @classmethod
    def watching(cls, store: Store) -> Checkpoints:
        """For a watcher (the operator, the sensor): big files checked by size and tag."""
        return cls(store, hash_up_to=WATCH_HASH_UP_TO)

    def save(
        self,
        step: int,
        files: Mapping[str, bytes | os.PathLike[str]],
        *,
        now: float,
        total_steps: int | None = None,
        metrics: dict[str, float] | None = None,
        extra: dict[str, Any] | None = None,
        world_size: int = 1,
    ) -> Manifest:
        """Write ``files`` for ``step``, then the manifest; then apply retention. A file is
        bytes or the path of a local file (streamed: hashed, then uploaded in parts), which
        must not change until this returns. A location that takes no writes (full, read-only,
        permission denied) raises :class:`~.writable.LocationUnwritable`; the checkpoints
        saved before stay as they were."""
        if not files:
            raise CheckpointError("a checkpoint needs at least one file")
        for name in files:
            safe_key(name)
            if any(other.startswith(name + "/") for other in files):
                raise CheckpointError(f"{name}: is both a file and a folder of this checkpoint")
        base = checkpoint_name(step)
        entries, tags = {}, {}
        for name, data in files.items():
            key = f"{base}/{name}"
            if isinstance(data, (bytes, bytearray, memoryview)):
                data = bytes(data)
                with writing(self.store):
                    self.store.put(key, data)
                entries[name] = FileEntry(hashlib.sha256(data).hexdigest(), len(data))
            elif isinstance(data, os.PathLike):
                entries[name] = self._put_path(name, key, data)
            else:
                raise CheckpointError(
                    f"{name}: a checkpoint file is bytes or a pathlib.Path, not "
                    f"{type(data).__name__}; give Path(...) for a file on disk, or bytes "
                    "(text.encode()) for its content"
                )
            size, tags[name] = self.store.stat(key)
            if size != entries[name].size:
                raise CheckpointError(f"{key}: {size} bytes stored of {entries[name].size} written")
        manifest = Manifest(
            step,
            total_steps,
            now,
            entries,
            dict(metrics or {}),
            dict(extra or {}),
            tags,
            world_size,
        )
        with writing(self.store):
            self.store.put(f"{base}/{MANIFEST}", manifest.to_json())
        self._verified.add(base)
        self._retain(base)
        return manifest

    def _put_path(self, name: str, key: str, path: os.PathLike[str]) -> FileEntry:
        """Hash a local file, then store it; refused if it changed in between."""
        try:
            before = os.stat(path)
        except FileNotFoundError as e:
            raise CheckpointError(
                f"{name}: {os.fspath(path)} does not exist; write the file before returning "
                "its path to step_done"
            ) from e
        if not stat.S_ISREG(before.st_mode):
            raise CheckpointError(f"{name}: {os.fspath(path)} is not a file")
        sha, size = file_digest(path)
        with writing(self.store):
            self.store.put_file(key, path)
        after = os.stat(path)
        if not (
            before.st_size == size == after.st_size and before.st_mtime_ns == after.st_mtime_ns
        ):
            raise CheckpointError(
                f"{name}: {os.fspath(path)} changed while it was being saved; write it "
                "completely before returning it to step_done, and leave it alone until "
                "step_done returns"
            )
        return FileEntry(sha, size)

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
        self._check(m)
        self._verified.add(name)
        return m

    def _check(self, m: Manifest) -> None:
        """Raise CheckpointError unless every file of ``m`` is as the save wrote it."""
        for fname, entry in m.files.items():
            key = f"{m.name}/{fname}"
            if self.hash_up_to is not None and entry.size > self.hash_up_to:
                size, tag = self.store.stat(key)
                if size != entry.size:
                    raise CheckpointError(f"{key}: size differs from the manifest")
                if tag == m.tags.get(fname):
                    continue  # the very object the save wrote: no need to download it
            if self.store.digest(key) != (entry.sha256, entry.size):
                raise CheckpointError(f"{key}: size or sha256 differs from the manifest")

    def latest_valid(self) -> Manifest | None:
        """The newest complete checkpoint whose files match their hashes (None if there is none)."""
        found = self._first_loadable(self._check)
        return None if found is None else found[0]

    def latest_manifest(self) -> Manifest | None:
        """The newest readable manifest, without hashing files (cheap progress probe)."""
        for name in self.manifests():
            try:
                return self.read_manifest(name)
            except CheckpointError:
                continue
        return None

    def claim(self, owner: dict[str, Any], key: str = OWNER) -> dict[str, Any] | None:
        """Record ``owner`` (who trains into this location) under ``key`` if no one is
        recorded there yet, in one conditional write; otherwise leave the record and return it
        (``{}`` if unreadable)."""
        if self.store.create(key, json.dumps(owner, sort_keys=True).encode()):
            return None
        return self.owner(key) or {}

    def owner(self, key: str = OWNER) -> dict[str, Any] | None:
        """The owner recorded under ``key`` (None if there is none or it is unreadable)."""
        try:
            rec = json.loads(self.store.get(key))
        except (CheckpointError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None

    def set_owner(self, owner: dict[str, Any]) -> None:
        self.store.put(OWNER, json.dumps(owner, sort_keys=True).encode())

    def load(self, manifest: Manifest) -> dict[str, bytes]:
        """The files of a checkpoint, each checked against the manifest."""
        out = {}
        for fname, entry in manifest.files.items():
            data = self.store.get(f"{manifest.name}/{fname}")
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CheckpointError(f"{manifest.name}/{fname}: sha256 differs from the manifest")
            out[fname] = data
        return out

    def load_to(self, manifest: Manifest, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Download a checkpoint's files into ``directory`` (streamed, never whole in memory),
        each checked against the manifest; their local paths by name. The files are
        downloaded and checked in a staging folder first, then moved into place: a checkpoint
        that does not load leaves ``directory`` as it was."""
        root = Path(directory)
        for stale in root.glob(RESUME_STAGE + "*"):  # left by a resume killed mid-download
            shutil.rmtree(stale, ignore_errors=True)
        try:
            root.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=RESUME_STAGE, dir=root))
        except OSError as e:  # not "this checkpoint is bad": no older one would load either
            raise ConfigError(
                "resume_to",
                f"cannot write into {root} ({e}); give a folder the training process can write",
            ) from e
        try:
            for fname, entry in manifest.files.items():
                path = stage / safe_key(fname)
                self.store.get_file(f"{manifest.name}/{fname}", path)
                if file_digest(path) != (entry.sha256, entry.size):
                    raise CheckpointError(
                        f"{manifest.name}/{fname}: size or sha256 differs from the manifest"
                    )
            out = {}
            for fname in manifest.files:
                out[fname] = root / fname
                out[fname].parent.mkdir(parents=True, exist_ok=True)
                os.replace(stage / fname, out[fname])
            return out
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def load_latest(self) -> tuple[Manifest, dict[str, bytes]] | None:
        """The newest checkpoint whose files load whole, with its files (read once)."""
        return self._first_loadable(self.load)

    def load_latest_to(
        self, directory: str | os.PathLike[str]
    ) -> tuple[Manifest, dict[str, Path]] | None:
        """The newest checkpoint whose files download whole into ``directory``, with their paths."""
        return self._first_loadable(lambda m: self.load_to(m, directory))

    def _first_loadable(self, fetch: Callable[[Manifest], T]) -> tuple[Manifest, T] | None:
        for name in self.manifests():
            try:
                m = self.read_manifest(name)
                files = fetch(m)
            except CheckpointError as e:
                log.warning("Skipping checkpoint %s: %s; trying the one before it.", name, e)
                continue
            self._verified.add(name)
            return m, files
        return None

    def _retain(self, saved: str) -> None:
        """Keep the newest ``keep`` checkpoints, always including ``saved``; delete the rest.

        A checkpoint *newer* than ``saved`` exists only when training resumed from an older one
        because it was torn or corrupt: it is hashed (once per instance) and deleted if invalid,
        so it neither counts toward ``keep`` (pushing out every good one) nor stays
        (``latest_manifest()`` would report its step as progress). Older ones are not re-read
        (``saved`` is known good). Retention never fails a save: the new checkpoint is already
        complete, so a read or delete error here is only logged.
        """
        try:
            kept: list[str] = []
            for name in self.manifests():  # newest first
                if name == saved:
                    kept.append(name)
                    continue
                if name > saved:
                    valid = self._valid_or_none(name)
                    if valid is None:  # could not be read now: keep it, do not count it
                        continue
                    if valid:
                        kept.append(name)
                        continue
                elif len(kept) < self.keep:
                    kept.append(name)
                    continue
                self._delete(name)
            if kept:
                # data left behind by saves that never wrote their manifest, older than any kept
                oldest = min(kept)
                for key in self.store.list("ckpt-"):
                    if key.split("/")[0] < oldest:
                        self.store.delete(key)
                # and what writers killed mid-save left there (temporary files, S3 uploads)
                self.store.discard_partial("ckpt-", oldest)
        except Exception as e:  # noqa: BLE001 - the checkpoint just saved is complete already
            log.warning("Checkpoint retention after %s did not finish: %s", saved, e)

    def _valid_or_none(self, name: str) -> bool | None:
        """True/False once hashed (cached); None if it could not be read (a passing error)."""
        if name in self._verified:
            return True
        try:
            self.verify(name)
        except CheckpointError as e:
            log.warning("Deleting checkpoint %s, newer than the one just saved: %s.", name, e)
            return False
        except Exception as e:  # noqa: BLE001 - a store hiccup is not a corrupt checkpoint
            log.warning("Could not check checkpoint %s (%s); keeping it.", name, e)
            return None
        return True

    def _delete(self, name: str) -> None:
        self._verified.discard(name)
        self.store.delete(f"{name}/{MANIFEST}")  # invisible first, then its data
        for key in self.store.list(name + "/"):
            self.store.delete(key)
