"""An in-memory checkpoint store, for tests of code that saves or reads checkpoints: the
interface of :class:`~airflow_spot.checkpoint.base.Store` and the semantics of the local and S3
stores, with the bytes kept in a dict.

    store = MemoryStore()
    ckpts = Checkpoints(store, keep=2)
    ckpts.save(10, {"model.pt": b"..."}, now=0.0)
    assert store.list() == ["ckpt-000000000010/MANIFEST.json", "ckpt-000000000010/model.pt"]

As in the real stores, a key is a relative path of plain parts (anything else is a
CheckpointError), a missing key read is a CheckpointError naming it, ``create`` writes only a
key that does not exist (the exclusive write behind ``job-owner.json``), and ``stat``'s tag
changes whenever a key is written again. Every write is whole at once, so nothing is ever
partial (``discard_partial`` has nothing to do). Safe to share between threads; not between
processes (use a ``LocalStore`` in a temporary folder for that).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from pathlib import Path

from airflow_spot.checkpoint.base import safe_key, tmp_beside
from airflow_spot.exceptions import CheckpointError


class MemoryStore:
    """A checkpoint store in memory: ``{key: bytes}`` behind a lock."""

    def __init__(self, name: str = "store") -> None:
        self.uri = f"memory://{name}"
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}
        self._tags: dict[str, int] = {}  # key -> the write that made it (stat's tag)
        self._writes = itertools.count(1)

    def _read(self, key: str) -> bytes:
        with self._lock:
            data = self._data.get(safe_key(key))
        if data is None:
            raise CheckpointError(f"{self.uri}/{key} does not exist")
        return data

    def _write(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; the caller holds the lock."""
        self._data[key] = bytes(data)
        self._tags[key] = next(self._writes)

    def put(self, key: str, data: bytes) -> None:
        safe_key(key)
        with self._lock:
            self._write(key, data)

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist; False if it already did."""
        safe_key(key)
        with self._lock:
            if key in self._data:
                return False
            self._write(key, data)
            return True

    def get(self, key: str) -> bytes:
        return self._read(key)

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self._data if k.startswith(prefix))

    def delete(self, key: str) -> None:
        safe_key(key)
        with self._lock:
            self._data.pop(key, None)
            self._tags.pop(key, None)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy a local file in (read whole: a test's files are small)."""
        self.put(key, Path(path).read_bytes())

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy ``key`` to a local file (written beside it, then renamed, as the real stores do)."""
        data = self._read(key)
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_beside(dest)
        try:
            tmp.write_bytes(data)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def stat(self, key: str) -> tuple[int, str]:
        """Size, and a tag that changes whenever the key is written again."""
        with self._lock:
            data, tag = self._data.get(safe_key(key)), self._tags.get(key)
        if data is None:
            raise CheckpointError(f"{self.uri}/{key} does not exist")
        return len(data), str(tag)

    def digest(self, key: str) -> tuple[str, int]:
        data = self._read(key)
        return hashlib.sha256(data).hexdigest(), len(data)

    def discard_partial(self, prefix: str, below: str) -> None:  # noqa: ARG002 - the protocol's
        """Nothing to do: a write here is whole at once, so none is ever left partial."""
