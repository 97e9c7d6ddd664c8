"""Whether a checkpoint location takes writes: what a failed write says about the location
(full, read-only, permission denied: the environment's trouble, not the training code's), its
free space where that is known (a local folder), and the probe write the operator makes before
it launches into a location that an attempt could not write.

::

    with writing(store):          # an OSError(ENOSPC) becomes LocationUnwritable
        store.put(key, data)
    problem = probe(store, need_bytes=2 << 20)   # None: it takes writes (and has the room)

No Airflow import; boto3 only through a store that is used.
"""

from __future__ import annotations

import contextlib
import errno
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow_spot.checkpoint.base import TMP_PREFIX, Store, error_code
from airflow_spot.exceptions import CheckpointError

# what a write into the location may fail with when the location, not the data, is at fault
UNWRITABLE_ERRNOS = frozenset(
    {
        errno.ENOSPC,  # the disk is full
        errno.EDQUOT,  # the user's quota is spent
        errno.EFBIG,  # a file grew past what the file system (or the process) allows
        errno.EROFS,  # mounted read-only
        errno.EACCES,  # permission denied
        errno.EPERM,
        errno.ENOTDIR,  # a part of the path is a file, not a folder
    }
)
DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled"})  # S3's "permission denied"
PROBE_KEY = TMP_PREFIX + "write-probe"  # a temporary name: never listed, never a checkpoint
# the training process's reason for exit STORAGE_EXIT, written beside its progress file
REASON_FILE = "checkpoint-unwritable.json"


class LocationUnwritable(CheckpointError):
    """The checkpoint location cannot be written (full, read-only, permission denied): the
    location, the error, and the free space where it is known."""

    def __init__(self, uri: str, error: str, free_bytes: int | None) -> None:
        self.uri, self.error, self.free_bytes = uri, error, free_bytes
        super().__init__(describe(uri, error, free_bytes))

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.uri, "error": self.error, "free_bytes": self.free_bytes}


def describe(uri: str, error: str, free_bytes: int | None) -> str:
    """``checkpoint location file:///x cannot be written: No space left on device (ENOSPC);
    12.0 KB free``: the words every report of an unwritable location uses."""
    return f"checkpoint location {uri} cannot be written: {error}; {free_text(free_bytes)}"


def free_text(free_bytes: int | None) -> str:
    if free_bytes is None:
        return "free space unknown"
    size = float(free_bytes)
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit} free" if unit == "bytes" else f"{size:.1f} {unit} free"
        size /= 1024
    raise AssertionError("unreachable")


def free_bytes(store: Store) -> int | None:
    """Free space where a local store's folder is (or would be created); None for S3."""
    root = getattr(store, "root", None)
    if not isinstance(root, Path):
        return None
    where = root
    while not where.is_dir() and where != where.parent:  # not made yet, or a file stands there
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def error_text(e: BaseException) -> str:
    """``No space left on device (ENOSPC)``: the error without the temporary file's name."""
    if isinstance(e, OSError) and e.errno is not None and e.strerror:
        return f"{e.strerror} ({errno.errorcode.get(e.errno, e.errno)})"
    code = error_code(e)
    return f"{code}: {e}" if code else f"{type(e).__name__}: {e}"


def unwritable(store: Store, e: BaseException) -> LocationUnwritable | None:
    """``e``, raised by a write into ``store``, as the location's trouble (None: another
    error, such as a passing S3 outage that the store already retried)."""
    if isinstance(e, LocationUnwritable):
        return e
    if (isinstance(e, OSError) and e.errno in UNWRITABLE_ERRNOS) or error_code(e) in DENIED_CODES:
        return LocationUnwritable(store.uri, error_text(e), free_bytes(store))
    return None


@contextlib.contextmanager
def writing(store: Store) -> Iterator[None]:
    """Around a write into ``store``: the location's trouble raises :class:`LocationUnwritable`
    (from the original error); any other error passes as it is."""
    try:
        yield
    except Exception as e:
        found = unwritable(store, e)
        if found is None or found is e:
            raise
        raise found from e


def probe(store: Store, need_bytes: int = 0) -> LocationUnwritable | None:
    """Write a small temporary object into ``store`` and delete it again: None if that worked
    and, where the free space is known, ``need_bytes`` fit; else what stands in the way. Any
    OSError counts (the probe is nothing but a write); a passing S3 error is raised."""
    key = f"{PROBE_KEY}.{secrets.token_hex(4)}"
    try:
        store.put(key, b"airflow-spot: can this location be written?\n")
    except Exception as e:
        found = unwritable(store, e)
        if found is None and not isinstance(e, OSError):
            raise
        return found or LocationUnwritable(store.uri, error_text(e), free_bytes(store))
    with contextlib.suppress(Exception):  # a probe left behind is a temporary file: harmless
        store.delete(key)
    free = free_bytes(store)
    if free is not None and free < need_bytes:
        return LocationUnwritable(
            store.uri,
            f"too little room for a checkpoint (the newest took {need_bytes} bytes)",
            free,
        )
    return None
