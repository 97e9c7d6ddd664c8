"""A local checkpoint store whose disk fills up on demand, for tests of what happens when a
checkpoint location cannot be written: while ``full``, every write first goes to ``/dev/full``,
where the kernel fails it with ENOSPC exactly as a full disk does (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_spot.checkpoint.local import LocalStore


class FullDisk(LocalStore):
    """A :class:`LocalStore` that raises the kernel's own ENOSPC on every write while ``full``."""

    def __init__(self, root: str | os.PathLike[str], full: bool = False) -> None:
        super().__init__(os.fspath(root))
        self.full = full

    def put(self, key: str, data: bytes) -> None:
        if self.full:
            with open("/dev/full", "wb", buffering=0) as fh:
                fh.write(data)
        super().put(key, data)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        if self.full:
            self.put(key, Path(path).read_bytes())
        super().put_file(key, path)

    def put_file_hashed(self, key: str, path: str | os.PathLike[str], algo: str) -> tuple[str, int]:
        if self.full:  # the one-pass save writes too: it fails as the disk would
            self.put(key, Path(path).read_bytes())
        return super().put_file_hashed(key, path, algo)
