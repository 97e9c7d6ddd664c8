"""What every checkpoint store shares: the :class:`Store` protocol, the key rule (relative
paths of plain parts, never escaping the prefix), temporary names for unfinished writes,
a missing key as a CheckpointError, and the files of a checkpoint moved a few at a time
(:func:`each_at_once`, for saves and resumes alike). No Airflow import, no boto3.

A store maps keys (``/``-separated relative paths) to bytes. Keys never escape the
configured prefix: absolute keys, ``..`` and empty parts are refused. Large checkpoint files
go through files, never whole in memory: ``put_file``/``get_file`` stream, ``stat`` reads
only metadata, and ``digest`` hashes in chunks. A store may also offer the one-pass
transfers (:class:`OnePass`): ``put_file_hashed``/``get_file_hashed`` hash the bytes as they
cross, and return the digest, so a save or a resume reads each byte once.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from airflow_spot.checkpoint.hashing import CHUNK, file_digest
from airflow_spot.exceptions import CheckpointError

_PART = re.compile(r"^[A-Za-z0-9._-]+$")
TMP_PREFIX = ".airflow-spot-tmp."  # unfinished writes: never listed, swept by retention
FILES_AT_ONCE = 4  # files of a checkpoint written (or read back) at the same time
T = TypeVar("T")
__all__ = [
    "CHUNK",
    "FILES_AT_ONCE",
    "TMP_PREFIX",
    "OnePass",
    "Store",
    "each_at_once",
    "error_code",
    "file_digest",
    "must_exist",
    "safe_key",
    "tmp_beside",
]


def safe_key(key: str) -> str:
    """``key`` if it is a relative path of plain parts; raises CheckpointError otherwise."""
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(p in ("", ".", "..") or not _PART.match(p) for p in parts)
    ):
        raise CheckpointError(
            f"unsafe checkpoint key {key!r}: only relative paths of [A-Za-z0-9._-] parts"
        )
    return key


class Store(Protocol):
    uri: str

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def create(self, key: str, data: bytes) -> bool: ...
    def put_file(self, key: str, path: str | os.PathLike[str]) -> None: ...
    def get_file(self, key: str, path: str | os.PathLike[str]) -> None: ...
    def stat(self, key: str) -> tuple[int, str]: ...
    def digest(self, key: str) -> tuple[str, int]: ...
    def discard_partial(self, prefix: str, below: str) -> None: ...


class OnePass(Protocol):
    """What a store that hashes on the way offers (the local and S3 stores): the bytes are
    read once, hashed in ``algo`` as they are written, and the digest and size returned."""

    def put_file_hashed(
        self, key: str, path: str | os.PathLike[str], algo: str
    ) -> tuple[str, int]: ...
    def get_file_hashed(
        self, key: str, path: str | os.PathLike[str], algo: str
    ) -> tuple[str, int]: ...
    def digest(self, key: str, algo: str = ...) -> tuple[str, int]: ...


def tmp_beside(path: Path) -> Path:
    """A temporary name beside ``path``, unique per writer (two containers on shared storage
    may both be pid 1); ``list()`` never shows it and retention sweeps leftovers."""
    return path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{secrets.token_hex(4)}")


def error_code(e: BaseException) -> str | None:
    """The error code of a botocore ClientError (None for anything else)."""
    return (getattr(e, "response", None) or {}).get("Error", {}).get("Code")


@contextlib.contextmanager
def must_exist(uri: str, key: str) -> Iterator[None]:
    """A missing key (a missing file, S3's 404/NoSuchKey) as a CheckpointError naming it."""
    try:
        yield
    except FileNotFoundError as e:
        raise CheckpointError(f"{uri}/{key} does not exist") from e
    except Exception as e:
        if error_code(e) in ("404", "NoSuchKey"):
            raise CheckpointError(f"{uri}/{key} does not exist") from e
        raise


def each_at_once(names: Iterable[str], work: Callable[[str], T]) -> dict[str, T]:
    """``work`` on every name, ``FILES_AT_ONCE`` at a time: the answers by name, or the
    first name's error (in the given order) once all have stopped (none is left writing)."""
    names = list(names)
    if len(names) == 1:
        return {names[0]: work(names[0])}
    with ThreadPoolExecutor(min(len(names), FILES_AT_ONCE), "checkpoint-file") as pool:
        futures = {name: pool.submit(work, name) for name in names}
        for f in futures.values():
            if f.exception() is not None:
                for other in futures.values():
                    other.cancel()
                break
    return {name: f.result() for name, f in futures.items()}
