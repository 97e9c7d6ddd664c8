"""A checkpoint store in a local directory (or a shared file system mounted as one): writes
go to a temporary file renamed into place, so readers see a file whole or not at all."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from airflow_spot.checkpoint.base import (
    CHUNK,
    TMP_PREFIX,
    file_digest,
    must_exist,
    safe_key,
    tmp_beside,
)
from airflow_spot.exceptions import CheckpointError


def _write_atomically(dest: Path, fill: Callable[[BinaryIO], object], *, sync: bool) -> None:
    """Write ``dest`` through a temporary file renamed into place: readers see it whole or not."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_beside(dest)
    try:
        with open(tmp, "xb") as fh:
            fill(fh)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


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

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy ``key`` to a local file (streamed; written beside it, then renamed)."""
        with must_exist(self.uri, key), open(self._path(key), "rb") as src:
            _write_atomically(Path(path), lambda fh: shutil.copyfileobj(src, fh, CHUNK), sync=False)

    def stat(self, key: str) -> tuple[int, str]:
        """Size, and a tag that changes whenever the file is written again (inode, mtime)."""
        with must_exist(self.uri, key):
            st = self._path(key).stat()
        return st.st_size, f"{st.st_ino}:{st.st_mtime_ns}"

    def digest(self, key: str) -> tuple[str, int]:
        with must_exist(self.uri, key):
            return file_digest(self._path(key))

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
