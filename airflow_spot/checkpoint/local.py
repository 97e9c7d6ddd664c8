"""A checkpoint store in a local directory (or a shared file system mounted as one): writes
go to a temporary file renamed into place, so readers see a file whole or not at all.

A save from a path copies and hashes in one pass (:meth:`LocalStore.put_file_hashed`): the
kernel copies each 8 MiB step while the step before is hashed where it lies in the page
cache, and every 16 MiB the disk is told to start writing (``posix_fadvise``), so the
closing fsync finds little left to do. A resume copies the same way, without the sync."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TypeVar

from airflow_spot.checkpoint.base import (
    CHUNK,
    TMP_PREFIX,
    file_digest,
    must_exist,
    safe_key,
    tmp_beside,
)
from airflow_spot.checkpoint.hashing import SHA256, Hasher, new_hasher
from airflow_spot.exceptions import CheckpointError

T = TypeVar("T")
# what copy_file_range answers where the kernel cannot copy these two files (another file
# system, an old kernel, a special file): the copy goes through a buffer instead
_NO_KERNEL_COPY = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.ETXTBSY}
)
WRITE_BEHIND = 16 << 20  # a save starts the disk writing each time this much more is written
STEP = 8 << 20  # a local copy's step: the kernel copies one while the one before is hashed
_MAP = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # (MAP_POPULATE: Linux only)


def _write_atomically(dest: Path, fill: Callable[[BinaryIO], T], *, sync: bool) -> T:
    """Write ``dest`` through a temporary file renamed into place: readers see it whole or
    not; ``fill``'s answer is returned."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_beside(dest)
    try:
        with open(tmp, "x+b") as fh:  # readable too: a copy hashes what it wrote
            out = fill(fh)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _copy_hashed(src: int, dst: int, algo: str, *, write_behind: bool) -> tuple[str, int]:
    """Copy file ``src`` to file ``dst`` (descriptors; ``dst`` open for reading too) in one
    pass: (digest, size). The kernel copies each step (``copy_file_range``: no trip through
    this process, no copy at all where the file system shares blocks) in a helper thread
    while this one hashes the step before as it now stands in ``dst``, read where it lies in
    the page cache (a mapping, no copy): so the digest is of the bytes written, and the hash
    (~0.2 s a GiB) runs beside the copy, not after it (both let go of the GIL).
    ``write_behind``: start the disk writing as the copy goes (a save, synced at its end).
    Where the kernel cannot copy (another file system, an old kernel), the rest goes through
    a buffer that is hashed and written."""
    h, n, started = new_hasher(algo), 0, 0
    if not hasattr(os, "copy_file_range"):
        return _copy_buffered(src, dst, h, 0)
    with ThreadPoolExecutor(1, thread_name_prefix="checkpoint-copy") as kernel:
        copying = kernel.submit(_kernel_copy, src, dst, 0)
        while True:
            got = copying.result()
            if got is None:  # the kernel cannot copy these two files
                return _copy_buffered(src, dst, h, n)
            if not got:
                return h.hexdigest(), n
            copying = kernel.submit(_kernel_copy, src, dst, n + got)
            _hash_range(h, dst, n, got)
            n += got
            if write_behind and n - started >= WRITE_BEHIND:
                _start_writing(dst, started, n - started)
                started = n


def _kernel_copy(src: int, dst: int, offset: int) -> int | None:
    """One step of ``src`` copied by the kernel to ``dst`` at ``offset``: the bytes copied
    (0 at the end), or None where the kernel cannot copy these files."""
    try:
        return os.copy_file_range(src, dst, STEP, offset, offset)
    except OSError as e:
        if e.errno not in _NO_KERNEL_COPY:
            raise
        return None


def _copy_buffered(src: int, dst: int, h: Hasher, offset: int) -> tuple[str, int]:
    """The rest of ``src`` from ``offset`` through a buffer, hashed and written to ``dst``."""
    buf = bytearray(CHUNK)
    while got := _copy_chunk(src, dst, offset, buf):
        h.update(memoryview(buf)[:got])
        offset += got
    return h.hexdigest(), offset


def _start_writing(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing a range to disk now, not at the fsync (Linux: DONTNEED
    starts writeback of dirty pages, and drops those already clean). Advice: never fails."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _copy_chunk(src: int, dst: int, offset: int, buf: bytearray) -> int:
    """Read a chunk of ``src`` at ``offset`` into ``buf`` and write it to ``dst`` there."""
    got = os.preadv(src, [buf], offset)
    view = memoryview(buf)[:got]
    while view:
        wrote = os.pwrite(dst, view, offset)
        view, offset = view[wrote:], offset + wrote
    return got


def _hash_range(h: Hasher, fd: int, offset: int, length: int) -> None:
    """Hash ``length`` bytes of file ``fd`` at ``offset`` (a multiple of the page size)
    through mappings of a chunk at a time (little of the page cache mapped at once), each
    mapped in one call (``MAP_POPULATE``: not a fault per page), else read through a buffer."""
    end = offset + length
    try:
        for at in range(offset, end, CHUNK):
            size = min(CHUNK, end - at)
            with mmap.mmap(fd, size, flags=_MAP, prot=mmap.PROT_READ, offset=at) as m:
                h.update(m)
            offset = at + size
    except (OSError, ValueError):  # a file system that maps nothing: read it back
        buf = bytearray(CHUNK)
        while offset < end and (got := os.preadv(fd, [memoryview(buf)[: end - offset]], offset)):
            h.update(memoryview(buf)[:got])
            offset += got


def _is_partial(name: str) -> bool:
    """A temporary file of an unfinished write (also the older ``.<name>.tmp-<pid>`` form)."""
    return name.startswith(TMP_PREFIX) or bool(re.fullmatch(r"\..+\.tmp-\d+", name))


def _not_ours(name: str) -> bool:
    """What ``list()`` leaves out: unfinished writes, and NFS's ``.nfsXXXX`` stand-ins for
    deleted files still open somewhere (busy until closed; NFS removes them itself)."""
    return _is_partial(name) or name.startswith(".nfs")


class LocalStore:
    """A directory; writes go to a temporary file renamed into place (atomic on POSIX)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / safe_key(key)

    def put(self, key: str, data: bytes) -> None:
        _write_atomically(self._path(key), lambda fh: fh.write(data), sync=True)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy a local file in (streamed), visible only once whole."""
        with open(path, "rb") as src:
            _write_atomically(
                self._path(key), lambda fh: shutil.copyfileobj(src, fh, CHUNK), sync=True
            )

    def put_file_hashed(self, key: str, path: str | os.PathLike[str], algo: str) -> tuple[str, int]:
        """Copy a local file in, hashing it on the way (one pass); visible only once whole."""
        with open(path, "rb", buffering=0) as src:
            return _write_atomically(
                self._path(key),
                lambda fh: _copy_hashed(src.fileno(), fh.fileno(), algo, write_behind=True),
                sync=True,
            )

    def get_file_hashed(self, key: str, path: str | os.PathLike[str], algo: str) -> tuple[str, int]:
        """Copy ``key`` to a local file, hashing it on the way (written beside it, renamed)."""
        with must_exist(self.uri, key), open(self._path(key), "rb", buffering=0) as src:
            return _write_atomically(
                Path(path),
                lambda fh: _copy_hashed(src.fileno(), fh.fileno(), algo, write_behind=False),
                sync=False,
            )

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy ``key`` to a local file (streamed; written beside it, then renamed)."""
        with must_exist(self.uri, key), open(self._path(key), "rb") as src:
            _write_atomically(Path(path), lambda fh: shutil.copyfileobj(src, fh, CHUNK), sync=False)

    def stat(self, key: str) -> tuple[int, str]:
        """Size, and a tag that changes whenever the file is written again (inode, mtime)."""
        with must_exist(self.uri, key):
            st = self._path(key).stat()
        return st.st_size, f"{st.st_ino}:{st.st_mtime_ns}"

    def digest(self, key: str, algo: str = SHA256) -> tuple[str, int]:
        with must_exist(self.uri, key):
            return file_digest(self._path(key), algo)

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist (atomically); False if it already did."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_beside(path)
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)  # fails if path exists, whoever wrote it first
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def discard_partial(self, prefix: str, below: str) -> None:
        """Delete what unfinished writes (a writer killed mid-save) left under top-level
        folders starting with ``prefix`` that sort below ``below``."""
        for folder in self.root.glob(prefix + "*"):
            # a symbolic link is not a folder of ours: walking it would delete elsewhere
            if folder.is_symlink() or not folder.is_dir() or folder.name >= below:
                continue
            for sub, _dirs, files in os.walk(folder):
                for name in files:
                    if _is_partial(name):
                        path = Path(sub) / name
                        path.unlink(missing_ok=True)
                        self._prune(path.parent)

    def get(self, key: str) -> bytes:
        with must_exist(self.uri, key):
            return self._path(key).read_bytes()

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix``; safe while a writer adds and retention deletes (os.walk skips
        folders that vanish mid-walk)."""
        out = []
        for folder, _dirs, files in os.walk(self.root):
            rel = Path(folder).relative_to(self.root)
            for name in files:
                if _not_ours(name):
                    continue
                key = (rel / name).as_posix() if rel.parts else name
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def delete(self, key: str) -> None:
        """Delete ``key``; never through a folder that leads out of the root (a symbolic link
        planted there): retention deletes only inside the location it was given."""
        path = self._path(key)
        if not path.parent.resolve().is_relative_to(self.root):
            raise CheckpointError(
                f"{self.uri}/{key}: its folder leads outside {self.root} (a symbolic link); "
                "not deleted"
            )
        path.unlink(missing_ok=True)
        self._prune(path.parent)

    def _prune(self, folder: Path) -> None:
        """Remove ``folder`` and its parents up to the root while they are empty."""
        with contextlib.suppress(OSError):  # another writer may be adding to it
            while folder != self.root and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
