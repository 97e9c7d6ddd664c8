"""Checkpoints: data files first, then a manifest naming them with their digest and size.

A checkpoint exists only once its manifest does, and is *valid* only if every file it names
is present with that hash and size. ``latest_valid()`` walks from the newest manifest back
and skips torn or corrupt checkpoints with a warning; it never returns one.

A file may be given as bytes or as a local path; a path is copied or uploaded in chunks and
hashed on the way, in one pass (multi-GB model files never sit in memory, and are read once),
and a resume hashes what it downloads as it writes it. The files of a checkpoint are written
(and read back) several at a time. New manifests hash with XXH3-128 (or BLAKE3) where it is
installed (:mod:`.hashing`); BLAKE3 and sha256 manifests read as before. The manifest also
records each file's tag as the store wrote it (S3's ETag; inode and mtime on disk).
``hash_up_to`` lets a watcher that only needs to know a checkpoint is whole (the operator, the
sensor) check a bigger file by its size and tag, which a HEAD gives, and hash it only if the
tag differs (the files were copied, or written again); the training process, which loads the
files, hashes them all.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from airflow_spot.checkpoint import resume
from airflow_spot.checkpoint.base import Store, each_at_once, file_digest, safe_key
from airflow_spot.checkpoint.hashing import SHA256, available, digest_bytes, save_algorithm
from airflow_spot.checkpoint.manifest import (
    MANIFEST,
    OWNER,
    WATCH_HASH_UP_TO,
    FileEntry,
    Manifest,
    checkpoint_name,
)
from airflow_spot.checkpoint.writable import writing
from airflow_spot.exceptions import CheckpointError

log = logging.getLogger(__name__)
T = TypeVar("T")


def _with_manifest(listed: Mapping[str, set[str]]) -> list[str]:
    """The listed checkpoints that have a manifest, newest (highest step) first."""
    return sorted((name for name, files in listed.items() if MANIFEST in files), reverse=True)


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
        bytes or the path of a local file (streamed, and hashed on the way), which must
        not change until this returns; several files are written at once. A location that takes no writes (full, read-only,
        permission denied) raises :class:`~.writable.LocationUnwritable`; the checkpoints
        saved before stay as they were."""
        if not files:
            raise CheckpointError("a checkpoint needs at least one file")
        for name in files:
            safe_key(name)
            if any(other.startswith(name + "/") for other in files):
                raise CheckpointError(f"{name}: is both a file and a folder of this checkpoint")
            if not isinstance(files[name], (bytes, bytearray, memoryview, os.PathLike)):
                raise CheckpointError(
                    f"{name}: a checkpoint file is bytes or a pathlib.Path, not "
                    f"{type(files[name]).__name__}; give Path(...) for a file on disk, or "
                    "bytes (text.encode()) for its content"
                )
        base = checkpoint_name(step)
        algo = self._save_algorithm()
        written = each_at_once(files, lambda name: self._put(base, name, files[name], algo))
        entries = {name: entry for name, (entry, _) in written.items()}
        tags = {name: tag for name, (_, tag) in written.items()}
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

    def _save_algorithm(self) -> str:
        """The first hash installed (:func:`.hashing.save_algorithm`) where the store hashes on
        the way; sha256 for any other store (its ``digest`` knows nothing else)."""
        return save_algorithm() if hasattr(self.store, "put_file_hashed") else SHA256

    def _put(self, base: str, name: str, data: Any, algo: str) -> tuple[FileEntry, str]:
        """Store one file of a checkpoint: its entry, and the tag the store gave it."""
        key = f"{base}/{name}"
        if isinstance(data, os.PathLike):
            entry = self._put_path(name, key, data, algo)
        else:
            data = bytes(data)
            with writing(self.store):
                self.store.put(key, data)
            entry = FileEntry(digest_bytes(data, algo), len(data), algo)
        size, tag = self.store.stat(key)
        if size != entry.size:
            raise CheckpointError(f"{key}: {size} bytes stored of {entry.size} written")
        return entry, tag

    def _put_path(self, name: str, key: str, path: os.PathLike[str], algo: str) -> FileEntry:
        """Store a local file, hashing it on the way (or first, where the store cannot);
        refused if it changed meanwhile."""
        try:
            before = os.stat(path)
        except FileNotFoundError as e:
            raise CheckpointError(
                f"{name}: {os.fspath(path)} does not exist; write the file before returning "
                "its path to step_done"
            ) from e
        if not stat.S_ISREG(before.st_mode):
            raise CheckpointError(f"{name}: {os.fspath(path)} is not a file")
        with writing(self.store):
            if hasattr(self.store, "put_file_hashed"):
                digest, size = self.store.put_file_hashed(key, path, algo)
            else:
                digest, size = file_digest(path, algo)
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
        return FileEntry(digest, size, algo)

    def manifests(self) -> list[str]:
        """Checkpoint names that have a manifest, newest (highest step) first."""
        return _with_manifest(self.listed())

    def listed(self) -> dict[str, set[str]]:
        """Each checkpoint's files as the store lists them now (its manifest among them)."""
        out: dict[str, set[str]] = {}
        for key in self.store.list("ckpt-"):
            name, _, fname = key.partition("/")
            if fname:
                out.setdefault(name, set()).add(fname)
        return out

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
            # a watcher without the manifest's hash (no blake3 here) goes by the tag alone
            by_tag = self.hash_up_to is not None and (
                entry.size > self.hash_up_to or not available(entry.algo)
            )
            if by_tag:
                size, tag = self.store.stat(key)
                if size != entry.size:
                    raise CheckpointError(f"{key}: size differs from the manifest")
                if tag == m.tags.get(fname):
                    continue  # the very object the save wrote: no need to download it
            if self._digest(key, entry.algo) != (entry.digest, entry.size):
                raise CheckpointError(f"{key}: size or {entry.algo} differs from the manifest")

    def _digest(self, key: str, algo: str) -> tuple[str, int]:
        """A stored file's digest in ``algo`` (sha256 through any store's ``digest``)."""
        if algo == SHA256:
            return self.store.digest(key)
        return self.store.digest(key, algo)  # type: ignore[call-arg]  # a OnePass store

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
            if digest_bytes(data, entry.algo) != entry.digest:
                raise CheckpointError(
                    f"{manifest.name}/{fname}: {entry.algo} differs from the manifest"
                )
            out[fname] = data
        return out

    def load_to(self, manifest: Manifest, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Download a checkpoint's files into ``directory`` (streamed, never whole in memory),
        each checked against the manifest; their local paths by name. The files are
        downloaded and checked in a staging folder first, then moved into place: a checkpoint
        that does not load leaves ``directory`` as it was."""
        return resume.load_to(self.store, manifest, directory)

    def load_latest(self) -> tuple[Manifest, dict[str, bytes]] | None:
        """The newest checkpoint whose files load whole, with its files (read once)."""
        return self._first_loadable(self.load)

    def load_latest_to(
        self, directory: str | os.PathLike[str]
    ) -> tuple[Manifest, dict[str, Path]] | None:
        """The newest checkpoint whose files download whole into ``directory``, with their
        paths: the files the listing shows are downloaded while the manifest is read
        (:func:`.resume.load_listed_to`)."""
        listed, algo = self.listed(), self._save_algorithm()
        for name in _with_manifest(listed):
            try:
                found = resume.load_listed_to(
                    self.store, name, listed[name] - {MANIFEST}, self.read_manifest, algo, directory
                )
            except CheckpointError as e:
                log.warning("Skipping checkpoint %s: %s; trying the one before it.", name, e)
                continue
            self._verified.add(name)
            return found
        return None

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
