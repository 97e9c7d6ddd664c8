"""A resume reads each S3 body from its connection into one reused buffer (issue 38: no 1 MiB
object made and copied per chunk), and keeps what botocore's own reads guarantee: a body cut
short is an error the store retries (``http.client`` alone lets it end quietly), a body read
whole gives its connection back for the next GET, one cut never does, and a body that is
encoded or already read goes the ordinary way. A socket server on 127.0.0.1 answers."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import urllib3
from botocore.exceptions import IncompleteReadError, ResponseStreamingError
from botocore.response import StreamingBody

from airflow_spot.checkpoint import s3parts
from airflow_spot.checkpoint.hashing import XXH3, digest_bytes, new_hasher
from airflow_spot.checkpoint.s3 import _transient

BODY = os.urandom(3 * (1 << 20) + 123)


@contextmanager
def _server(answers: list[bytes]) -> Iterator[str]:
    """Answers each request on one kept-alive connection with the next of ``answers`` (a
    connection closed after a short one); its URL."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    todo, lock = list(answers), threading.Lock()

    def answer(conn: socket.socket) -> None:  # one connection, until its client leaves
        with conn:
            conn.settimeout(10)
            while True:
                try:
                    if not conn.recv(65536):
                        return
                except OSError:
                    return
                with lock:
                    if not todo:
                        return
                    reply = todo.pop(0)
                try:
                    conn.sendall(reply.removesuffix(b"<cut>"))
                except OSError:
                    return  # the client left without reading it all
                if reply.endswith(b"<cut>"):
                    return  # the FIN after a short body

    def serve() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/k"
    finally:
        with contextlib.suppress(OSError):
            lsock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        lsock.close()
        thread.join(5)


def _answer(body: bytes, length: int | None = None, encoding: str = "") -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body) if length is None else length}\r\n"
    if encoding:
        head += f"Content-Encoding: {encoding}\r\n"
    return head.encode() + b"\r\n" + body


@pytest.fixture
def pool() -> Iterator[urllib3.PoolManager]:
    """A connection pool closed after the test (no socket left for the collector to warn of)."""
    manager = urllib3.PoolManager(timeout=10)
    yield manager
    manager.clear()


def _get(pool: urllib3.PoolManager, url: str) -> StreamingBody:
    raw = pool.request("GET", url, preload_content=False)
    return StreamingBody(raw, raw.headers.get("content-length"))


def test_a_body_is_read_straight_and_its_connection_reused(
    tmp_path: Path, monkeypatch, pool: urllib3.PoolManager
) -> None:
    """Two GETs on one connection: each read through one buffer, whole and hashed, and the
    second finds the first's connection back in the pool."""
    direct: list[int] = []
    real = s3parts._stream_direct
    monkeypatch.setattr(s3parts, "_stream_direct", lambda *a: direct.append(1) or real(*a))
    with _server([_answer(BODY), _answer(BODY[:1000])]) as url:
        for want in (BODY, BODY[:1000]):
            with open(tmp_path / "out", "wb") as fh:
                got = s3parts._stream(_get(pool, url), fh.fileno(), new_hasher(XXH3))
            assert (
                got == (digest_bytes(want, XXH3), len(want))
                and (tmp_path / "out").read_bytes() == want
            )
        assert direct == [1, 1]
        assert pool.connection_from_url(url).num_connections == 1  # the first one, reused


def test_a_body_cut_short_is_a_passing_error(tmp_path: Path, pool: urllib3.PoolManager) -> None:
    """A body that ends before its Content-Length (the server closed the connection) is
    botocore's IncompleteReadError, which the store retries; its connection is closed."""
    with _server([_answer(BODY[:5000], length=len(BODY)) + b"<cut>"]) as url:
        body = _get(pool, url)
        with open(tmp_path / "out", "wb") as fh, pytest.raises(IncompleteReadError) as got:
            s3parts._stream(body, fh.fileno(), new_hasher(XXH3))
    assert _transient(got.value)
    conn = body._raw_stream._connection  # closed, and never back in the pool (which unsets it)
    assert conn is not None and conn.sock is None


def test_a_read_error_is_botocore_s_streaming_error(
    tmp_path: Path, pool: urllib3.PoolManager
) -> None:
    """A connection that fails mid-body (here, closed under the reader) is
    ResponseStreamingError, as botocore's own reads raise it: retried."""
    with _server([_answer(BODY)]) as url:
        body = _get(pool, url)
        body._raw_stream._fp.fp.close()  # the socket file under http.client: reads fail
        with open(tmp_path / "out", "wb") as fh, pytest.raises(ResponseStreamingError) as got:
            s3parts._stream(body, fh.fileno(), new_hasher(XXH3))
    assert _transient(got.value)


def test_an_encoded_or_started_body_goes_the_ordinary_way(
    tmp_path: Path, pool: urllib3.PoolManager
) -> None:
    """A body with a Content-Encoding (urllib3 decodes it) or one read from already is not
    read from its connection: botocore's chunks, as before."""
    with _server([_answer(BODY, encoding="identity"), _answer(BODY, encoding="x-custom")]) as url:
        assert s3parts._direct(_get(pool, url)) is not None
        assert s3parts._direct(_get(pool, url)) is None
    with _server([_answer(BODY)]) as url:
        body = _get(pool, url)
        first = body.read(10)
        assert s3parts._direct(body) is None
        with open(tmp_path / "out", "wb") as fh:
            _, n = s3parts._stream(body, fh.fileno(), new_hasher(XXH3))
        assert first + (tmp_path / "out").read_bytes()[:n] == BODY


def test_a_stored_files_digest_reads_its_body_straight_and_writes_nothing(
    monkeypatch, pool: urllib3.PoolManager
) -> None:
    """``S3Store.digest`` (a watcher's verify) hashes a body through the same one buffer, and
    a body cut short is the same passing error, never a digest of part of the file."""
    from botocore.exceptions import IncompleteReadError

    direct: list[int] = []
    real = s3parts._stream_direct
    monkeypatch.setattr(s3parts, "_stream_direct", lambda *a: direct.append(1) or real(*a))
    monkeypatch.setattr(s3parts, "_pwrite", lambda *a: pytest.fail("a digest writes nothing"))
    with _server([_answer(BODY), _answer(BODY[:1000], length=2000) + b"<cut>"]) as url:
        assert s3parts.hash_body(_get(pool, url), new_hasher(XXH3)) == (
            digest_bytes(BODY, XXH3),
            len(BODY),
        )
        with pytest.raises(IncompleteReadError):
            s3parts.hash_body(_get(pool, url), new_hasher(XXH3))
    assert direct == [1, 1]
