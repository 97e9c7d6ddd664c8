"""S3 transfers in concurrent parts that hash the bytes as they cross, for the S3 store.

An upload reads the file once, in order, into part buffers; each part is hashed, then sent
by one of ``concurrency`` threads while the next ones are read. A download is one streamed
GET, read from its connection into one reused buffer and written and hashed from there as it
arrives (:func:`_direct`); or, ``ranged``, asks for ranges concurrently, writes
each where it belongs, and hashes them in order as they arrive. So a save or a resume moves
each byte through memory once, with at most a few parts held: the parts in flight are
bounded per store (:class:`Parts`), across every file it moves at once.

Defaults (measured against gofakes3 and moto on 127.0.0.1, ``benchmarks/checkpoint_io.py``):
8 MiB parts, 2 at a time, and one streamed GET per file, which beat every ranged download
there and costs a server whose ranged GETs read the whole object (moto does) nothing extra.
``$AIRFLOW_SPOT_S3_PART_MB``, ``$AIRFLOW_SPOT_S3_CONCURRENCY`` and
``$AIRFLOW_SPOT_S3_DOWNLOAD`` (``stream`` or ``ranged``) change them: where one connection
is the limit (real S3 serves ~100 MB/s a connection) more concurrency and ranged downloads
pay. Called through :class:`~.s3.S3Store`, which retries and names errors; boto3 is the
caller's client.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_spot.checkpoint.base import error_code
from airflow_spot.checkpoint.hashing import CHUNK, new_hasher
from airflow_spot.exceptions import CheckpointError, ConfigError

PART_ENV = "AIRFLOW_SPOT_S3_PART_MB"
CONCURRENCY_ENV = "AIRFLOW_SPOT_S3_CONCURRENCY"
DOWNLOAD_ENV = "AIRFLOW_SPOT_S3_DOWNLOAD"
PART_MB = 8
CONCURRENCY = 2
DOWNLOADS = ("stream", "ranged")  # the first is the default
MAX_PARTS = 10_000  # S3's limit per upload: a bigger file gets bigger parts
MIN_PART_MB, MAX_PART_MB = 5, 5 * 1024  # S3's bounds on a part (but the last)


def _env_int(name: str, default: int, low: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ConfigError(name, f"{raw!r}: give a whole number from {low} to {high} (or unset it)")
    return value


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip()
    if raw and raw not in choices:
        raise ConfigError(name, f"{raw!r}: give {' or '.join(choices)} (or unset it)")
    return raw or choices[0]


@dataclass(frozen=True)
class Tuning:
    part: int  # bytes
    concurrency: int
    ranged: bool = False  # a download in concurrent ranges (else one streamed GET)

    @classmethod
    def from_env(cls) -> Tuning:
        mb = _env_int(PART_ENV, PART_MB, MIN_PART_MB, MAX_PART_MB)
        concurrency = _env_int(CONCURRENCY_ENV, CONCURRENCY, 1, 64)
        ranged = _env_choice(DOWNLOAD_ENV, DOWNLOADS) == "ranged"
        return cls(mb << 20, concurrency, ranged and concurrency > 1)

    def part_for(self, size: int) -> int:
        """The part size for a ``size``-byte file: at most 10,000 parts, in whole MiB."""
        least = -(-size // MAX_PARTS)
        return max(self.part, -(-least // (1 << 20)) << 20)


class Parts:
    """The parts a store holds in memory at once, shared by every file it moves: each part
    takes a slot from being read (or asked for) until it is sent (or hashed). One slot more
    than the concurrency: the next part is read while the others are in flight."""

    def __init__(self, tuning: Tuning) -> None:
        self.tuning = tuning
        self.slots = threading.BoundedSemaphore(tuning.concurrency + 1)
        self._spare: list[bytearray] = []  # buffers of parts sent, to read the next ones into
        self._uploads = 0  # files going up in parts now
        self._lock = threading.Lock()

    def buffer(self, size: int) -> bytearray:
        """A part buffer of ``size`` bytes (taken with a slot: never more than the slots)."""
        with self._lock:
            while self._spare:
                buf = self._spare.pop()
                if len(buf) == size:
                    return buf
        return bytearray(size)

    def give_back(self, buf: bytearray) -> None:
        with self._lock:
            self._spare.append(buf)

    @contextlib.contextmanager
    def uploading(self) -> Iterator[None]:
        """One file's upload in parts. The files of a save reuse each other's buffers, and
        the last one to end frees them: a trainer holds no part between saves (and buffers
        freed and taken anew for every file scatter over the threads' heaps)."""
        with self._lock:
            self._uploads += 1
        try:
            yield
        finally:
            with self._lock:
                self._uploads -= 1
                if not self._uploads:
                    self._spare.clear()

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self.slots:
            yield


def upload(
    client: Any, bucket: str, key: str, path: str, algo: str, parts: Parts
) -> tuple[str, int]:
    """Upload ``path`` (in parts above the part size), hashing what is sent: (digest, size)."""
    h = new_hasher(algo)
    with open(path, "rb", buffering=0) as src:
        size = os.fstat(src.fileno()).st_size
        part = parts.tuning.part_for(size)
        if size <= part:  # one PUT, holding a part's slot like any part
            # read to its known length into a shared buffer (the caller refuses a file whose
            # size changed meanwhile): botocore glues a ``bytes`` body to the request's
            # headers before sending it (a copy of the whole file), never a bytearray, and
            # buffers taken anew for every file scatter over the threads' heaps (an 8 x 8 MiB
            # save peaked at 50 MB)
            with parts.uploading(), parts.slot():
                data = parts.buffer(size)
                got = _read_full(src, data)
                body = data if got == size else data[:got]  # a file that shrank: what there was
                h.update(body)
                client.put_object(Bucket=bucket, Key=key, Body=body)
                parts.give_back(data)
            return h.hexdigest(), got
        extra = _checksum_args(client)
        up = client.create_multipart_upload(Bucket=bucket, Key=key, **extra)["UploadId"]
        try:
            with parts.uploading():
                call = dict(Bucket=bucket, Key=key, UploadId=up, **extra)
                sent, n = _send_parts(client, src, size, part, h, parts, call)
            client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": sent}
            )
        except BaseException:
            with contextlib.suppress(Exception):  # else retention aborts it later
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=up)
            raise
    return h.hexdigest(), n


def _checksum_args(client: Any) -> dict[str, str]:
    """CRC32 part checksums where botocore computes them (as boto3's own upload does), so
    that S3 checks each part and the completion names them."""
    if getattr(client.meta.config, "request_checksum_calculation", None) == "when_supported":
        return {"ChecksumAlgorithm": "CRC32"}
    return {}


def _send_parts(
    client: Any, src: Any, size: int, part: int, h: Any, parts: Parts, call: dict[str, Any]
) -> tuple[list[dict[str, Any]], int]:
    """Read ``src`` in order into part buffers (hashing each), and send them concurrently.
    Each part is read to its known length (the file's size when the upload began): no read
    past the end takes a buffer out of the shared ones, and the last, shorter part is read
    into a buffer of its own size, not copied out of a full one. A file that ends early is
    sent as far as it goes (the caller refuses a file whose size changed)."""
    done: list[Future[dict[str, Any]]] = []
    n = 0

    def send(number: int, body: bytearray) -> dict[str, Any]:
        try:
            got = client.upload_part(PartNumber=number, Body=body, **call)
        finally:
            if len(body) == part:
                parts.give_back(body)  # before the slot: the buffer goes with it
            parts.slots.release()
        out = {"PartNumber": number, "ETag": got["ETag"]}
        if "ChecksumCRC32" in got:
            out["ChecksumCRC32"] = got["ChecksumCRC32"]
        return out

    with ThreadPoolExecutor(parts.tuning.concurrency, thread_name_prefix="s3-put") as pool:
        for number, start in enumerate(range(0, size, part), 1):
            parts.slots.acquire()
            if any(f.done() and f.exception() for f in done):
                parts.slots.release()
                break  # a part failed: read no more (its error is raised below)
            length = min(part, size - start)
            buf = parts.buffer(part) if length == part else bytearray(length)
            got = _read_full(src, buf)
            if not got:  # the file shrank meanwhile, to here: no empty part
                parts.slots.release()
                break
            if got < length:  # ... or within this part: what was read, then stop
                buf = buf[:got]
            h.update(buf)
            n += got
            done.append(pool.submit(send, number, buf))
            if got < length:
                break
    return [f.result() for f in done], n


def _read_full(src: Any, buf: bytearray) -> int:
    """Fill ``buf`` from ``src``, short only at the end of the file (one read stops at 2 GiB)."""
    view, n = memoryview(buf), 0
    while n < len(buf) and (got := src.readinto(view[n:])):
        n += got
    return n


def download(
    client: Any, bucket: str, key: str, fd: int, algo: str, parts: Parts
) -> tuple[str, int]:
    """Download ``key`` into the open file ``fd``, hashing it as it arrives: (digest, size).
    One streamed GET, or (``ranged``) concurrent ranges hashed in order."""
    h = new_hasher(algo)
    part = parts.tuning.part
    if not parts.tuning.ranged:
        return _stream(client.get_object(Bucket=bucket, Key=key)["Body"], fd, h)  # no part
    try:
        first = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{part - 1}")
    except Exception as e:
        if error_code(e) not in ("InvalidRange", "416"):
            raise
        return _stream(client.get_object(Bucket=bucket, Key=key)["Body"], fd, h)  # empty
    size, got = _total_size(first), int(first["ContentLength"])  # all, if the range was ignored
    for chunk in _write_body(first["Body"], fd, 0, got):
        h.update(chunk)
    if size > got:

        def fetch(start: int) -> list[bytes]:
            end = min(start + part, size) - 1
            try:
                body = client.get_object(
                    Bucket=bucket, Key=key, Range=f"bytes={start}-{end}", IfMatch=first["ETag"]
                )["Body"]
            except Exception as e:
                if error_code(e) in ("PreconditionFailed", "412"):
                    raise CheckpointError(f"{key}: written again while it was read") from e
                raise
            return _write_body(body, fd, start, end - start + 1)

        _in_order(fetch, range(got, size, part), h, parts)
    return h.hexdigest(), size


def _write_body(body: Any, fd: int, start: int, length: int) -> list[bytes]:
    """A range's body written at ``start`` as it arrives; its chunks, to hash in order."""
    chunks, at = [], start
    for chunk in body.iter_chunks(CHUNK):
        _pwrite(fd, chunk, at)
        chunks.append(chunk)
        at += len(chunk)
    if at - start != length:
        raise CheckpointError(f"{at - start} bytes came where the range has {length}")
    return chunks


def _in_order(fetch: Callable[[int], list[bytes]], starts: range, h: Any, parts: Parts) -> None:
    """Run ``fetch`` on every start concurrently and hash the results in order; a slot per
    part until it is hashed (blocking only while this file holds none: no deadlock between
    files that share the slots)."""
    pending: collections.deque[Future[list[bytes]]] = collections.deque()
    todo = iter(starts)
    more = True
    with ThreadPoolExecutor(parts.tuning.concurrency, thread_name_prefix="s3-get") as pool:
        try:
            while more or pending:
                while more and len(pending) < 2 * parts.tuning.concurrency:
                    if not parts.slots.acquire(blocking=not pending):
                        break
                    start = next(todo, None)
                    if start is None:
                        parts.slots.release()
                        more = False
                        break
                    pending.append(pool.submit(fetch, start))
                if not pending:
                    continue  # nothing was left to ask for
                oldest = pending.popleft()
                try:
                    for chunk in oldest.result():
                        h.update(chunk)
                finally:
                    parts.slots.release()
        finally:
            for f in pending:  # an error: the rest are not waited for, their slots returned
                f.cancel()
                with contextlib.suppress(Exception):
                    f.result()
                parts.slots.release()


def hash_body(body: Any, h: Any) -> tuple[str, int]:
    """A GET's whole body hashed, nothing written: (digest, size), read as a resume reads."""
    return _stream(body, None, h)


def _stream(body: Any, fd: int | None, h: Any) -> tuple[str, int]:
    """One GET's body into ``fd`` from its start (None: hashed only), hashed on the way: read
    from the connection into one reused buffer where the body allows it (:func:`_direct`),
    else chunk by chunk."""
    raw = _direct(body)
    if raw is not None:
        return _stream_direct(body, raw, fd, h)
    n = 0
    for chunk in body.iter_chunks(CHUNK):
        if fd is not None:
            _pwrite(fd, chunk, n)
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def _direct(body: Any) -> Any:
    """The urllib3 response under a botocore body, if its bytes can be read straight from
    its connection: nothing decoded (no ``Content-Encoding``) and nothing read or buffered
    yet; else None. A chunk that botocore's ``iter_chunks`` yields is a new 1 MiB object that
    urllib3 filled with one more copy: a 1 GiB GET from gofakes3 took 1.10 s that way and
    0.62 s read into one buffer (medians of 7, one process, hashed and written alike)."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    if fp is None or not hasattr(fp, "readinto") or not hasattr(raw, "release_conn"):
        return None
    headers = getattr(raw, "headers", None) or {}
    if headers.get("content-encoding", "identity").lower() != "identity":
        return None
    if getattr(body, "_amount_read", 0) or len(getattr(raw, "_decoded_buffer", b"")):
        return None
    return raw


def _stream_direct(body: Any, raw: Any, fd: int | None, h: Any) -> tuple[str, int]:
    """:func:`_stream` through one reused buffer, checked against ``Content-Length`` (which
    botocore checks on its own reads, and ``http.client`` does not: a body cut short simply
    ends). A cut or short body is botocore's streaming error, which the store retries; the
    connection goes back to the pool only once its body was read whole."""
    from botocore.exceptions import IncompleteReadError, ResponseStreamingError

    view, n, whole = memoryview(bytearray(CHUNK)), 0, False
    try:
        while True:
            try:
                got = raw._fp.readinto(view)
            except (OSError, ValueError, http.client.HTTPException) as e:
                raise ResponseStreamingError(error=e) from e
            if not got:
                break
            if fd is not None:
                _pwrite(fd, view[:got], n)
            h.update(view[:got])
            n += got
        expected = raw.headers.get("content-length")
        if expected is not None and int(expected) != n:
            raise IncompleteReadError(actual_bytes=n, expected_bytes=int(expected))
        whole = True
    finally:
        if whole:
            raw.release_conn()
        else:  # a connection half read never goes back to the pool
            with contextlib.suppress(Exception):  # (already closed under the reader)
                body.close()
    return h.hexdigest(), n


def _pwrite(fd: int, data: bytes | memoryview, offset: int) -> None:
    """All of ``data`` at ``offset`` (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        wrote = os.pwrite(fd, view, offset)
        view, offset = view[wrote:], offset + wrote


def _total_size(response: dict[str, Any]) -> int:
    """The object's size from a ranged GET's ``Content-Range`` (``bytes 0-9/1234``); a
    server that ignored the range sent it whole."""
    found = re.fullmatch(r"bytes \d+-\d+/(\d+)", response.get("ContentRange") or "")
    return int(found.group(1)) if found else int(response["ContentLength"])
