"""The local store's one-pass copy (issue 38): the kernel copies the next step of a file
while the step before is hashed, the digest is still that of the bytes written, and where
the kernel stops copying or the page cache cannot be mapped part way, the rest goes through a
buffer and the digest is still right."""

from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path
from typing import Any

from airflow_spot.checkpoint import LocalStore, local
from airflow_spot.checkpoint.hashing import BLAKE3, file_digest

SIZE = 2 * (8 << 20) + 4097  # two whole copy steps and a short one


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    path.write_bytes(os.urandom(SIZE))
    return path


def _round_trip(tmp_path: Path, model: Path) -> None:
    """Saved and resumed whole, each with the digest of the file."""
    store = LocalStore(tmp_path / "store")
    assert store.put_file_hashed("k/model.pt", model, BLAKE3) == file_digest(model, BLAKE3)
    got = store.get_file_hashed("k/model.pt", tmp_path / "in" / "model.pt", BLAKE3)
    assert got == file_digest(model, BLAKE3)
    assert (tmp_path / "in" / "model.pt").read_bytes() == model.read_bytes()


def test_the_next_step_is_copied_while_the_one_before_is_hashed(
    tmp_path: Path, monkeypatch
) -> None:
    """The first step's hash waits for the second step's copy to start: a copy that hashed
    each step before copying the next would never start it (the wait would time out)."""
    model = _model(tmp_path)
    next_copy = threading.Event()
    real_copy = os.copy_file_range

    def copy(src: int, dst: int, count: int, at_src: int, at_dst: int) -> int:
        if at_src > 0:
            next_copy.set()
        return real_copy(src, dst, count, at_src, at_dst)

    overlapped: list[bool] = []
    real_hash = local._hash_range

    def hash_range(h: Any, fd: int, offset: int, length: int, *rest: Any) -> None:
        if offset == 0:
            overlapped.append(next_copy.wait(timeout=2))
        real_hash(h, fd, offset, length, *rest)

    monkeypatch.setattr(os, "copy_file_range", copy)
    monkeypatch.setattr(local, "_hash_range", hash_range)
    store = LocalStore(tmp_path / "store")
    assert store.put_file_hashed("k/model.pt", model, BLAKE3) == file_digest(model, BLAKE3)
    assert overlapped == [True]


def test_a_kernel_that_stops_copying_part_way_leaves_the_rest_to_a_buffer(
    tmp_path: Path, monkeypatch
) -> None:
    model = _model(tmp_path)
    real_copy = os.copy_file_range

    def copy(src: int, dst: int, count: int, at_src: int, at_dst: int) -> int:
        if at_src >= 8 << 20:  # from the second step on: another file system, say
            raise OSError(errno.EXDEV, "cross-device")
        return real_copy(src, dst, count, at_src, at_dst)

    monkeypatch.setattr(os, "copy_file_range", copy)
    _round_trip(tmp_path, model)


def test_a_page_cache_that_cannot_be_mapped_part_way_is_read_back(
    tmp_path: Path, monkeypatch
) -> None:
    model = _model(tmp_path)
    real_map = mmap.mmap

    def mapping(fd: int, length: int, **kw: Any) -> mmap.mmap:
        if kw.get("offset", 0) >= 3 << 20:  # a few chunks in
            raise OSError(errno.ENODEV, "no mapping here")
        return real_map(fd, length, **kw)

    monkeypatch.setattr(local.mmap, "mmap", mapping)
    _round_trip(tmp_path, model)
