"""What an S3 save holds in memory (issue 38): the files of a save share the store's part
slots, and no more part buffers are alive at once than there are slots, however many files
go up together; the bytes sent are still the file's, in order. A stub client stands in for
S3 here: it keeps nothing it is sent, so what is traced is the save's own memory."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_spot.checkpoint.hashing import SHA256, file_digest
from airflow_spot.checkpoint.s3parts import Parts, Tuning, upload

PART = 1 << 20


class _Sink:
    """The calls of a multipart upload; each part's digest kept, its bytes not."""

    meta = SimpleNamespace(config=SimpleNamespace())  # no CRC32 part checksums

    def __init__(self) -> None:
        self.parts: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def create_multipart_upload(self, Key: str, **kw: Any) -> dict[str, str]:
        return {"UploadId": Key}

    def upload_part(self, Key: str, PartNumber: int, Body: bytearray, **kw: Any) -> dict:
        time.sleep(0.002)  # in flight a while: the other files read meanwhile
        with self._lock:
            self.parts[(Key, PartNumber)] = hashlib.sha256(Body).hexdigest()
        return {"ETag": f"{Key}-{PartNumber}"}

    def complete_multipart_upload(self, **kw: Any) -> None:
        pass

    def abort_multipart_upload(self, **kw: Any) -> None:
        pass


def test_eight_files_going_up_at_once_hold_no_more_parts_than_the_slots(
    tmp_path: Path,
) -> None:
    """Eight files of two whole parts and a short one, four at a time, through 3 slots
    (2 in flight and 1 being read): at most 3 parts' worth of memory at once, and each file
    arrives as its parts in order with the digest of its bytes."""
    files = []
    for i in range(8):
        path = tmp_path / f"shard{i}.bin"
        path.write_bytes(os.urandom(2 * PART + 1000 * (i + 1)))
        files.append(path)
    sink, parts = _Sink(), Parts(Tuning(part=PART, concurrency=2))

    def up(path: Path) -> tuple[str, int]:
        return upload(sink, "b", path.name, str(path), SHA256, parts)

    tracemalloc.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(up, files))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * PART + PART // 2, f"{peak / PART:.2f} parts' worth held at once"
    for path, (digest, size) in zip(files, got, strict=True):
        assert (digest, size) == file_digest(path, SHA256)
        data = path.read_bytes()
        for number, start in enumerate(range(0, size, PART), 1):
            want = hashlib.sha256(data[start : start + PART]).hexdigest()
            assert sink.parts[(path.name, number)] == want
        assert (path.name, number + 1) not in sink.parts


@pytest.mark.parametrize("left", [PART, PART + 1000])
def test_a_file_that_shrinks_as_it_goes_up_is_sent_as_far_as_it_goes(
    tmp_path: Path, left: int
) -> None:
    """Cut after the upload began (at a part's end, or within one): what is left goes up,
    no empty part, and the size returned is short, which the save refuses (changed file)."""
    path = tmp_path / "model.pt"
    path.write_bytes(os.urandom(3 * PART))

    class Cut(_Sink):
        def create_multipart_upload(self, Key: str, **kw: Any) -> dict[str, str]:
            os.truncate(path, left)
            return super().create_multipart_upload(Key=Key, **kw)

    sink = Cut()
    digest, size = upload(sink, "b", "k", str(path), SHA256, Parts(Tuning(PART, 2)))
    assert (digest, size) == file_digest(path, SHA256) and size == left
    assert sorted(sink.parts) == [("k", n) for n in range(1, -(-left // PART) + 1)]


def test_small_files_go_up_in_one_put_from_the_shared_buffers(tmp_path: Path) -> None:
    """Files of one part or less go up in one PUT each, from the store's part buffers: a
    ``bytearray`` (botocore glues a ``bytes`` body to the request's headers, a copy of the
    whole file) reused from file to file (buffers taken anew for every file scatter over the
    threads' heaps: an 8 x 8 MiB save peaked at 50 MB of RSS, 26 MB so), never more than the
    slots at once; each PUT carries its file's bytes."""
    seen: list[tuple[type, int, str]] = []

    class Puts(_Sink):
        def put_object(self, Key: str, Body: Any, **kw: Any) -> dict:
            time.sleep(0.002)
            with self._lock:
                seen.append((type(Body), id(Body), hashlib.sha256(Body).hexdigest()))
                self.parts[(Key, 1)] = seen[-1][2]
            return {"ETag": Key}

    files = []
    for i in range(8):
        path = tmp_path / f"shard{i}.bin"
        path.write_bytes(os.urandom(PART // 2))
        files.append(path)
    sink, parts = Puts(), Parts(Tuning(part=PART, concurrency=2))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda p: upload(sink, "b", p.name, str(p), SHA256, parts), files))
    assert {t for t, _, _ in seen} == {bytearray}
    assert len({i for _, i, _ in seen}) <= 3  # the slots' buffers, reused
    for path, (digest, size) in zip(files, got, strict=True):
        assert (digest, size) == file_digest(path, SHA256)
        assert sink.parts[(path.name, 1)] == hashlib.sha256(path.read_bytes()).hexdigest()
