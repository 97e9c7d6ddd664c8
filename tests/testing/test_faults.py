"""The fault proxy against a real HTTP server on 127.0.0.1, with a real HTTP client."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from airflow_spot.testing.faults import KUBERNETES_ANSWERS, FaultProxy, Mode

BODY = b"0123456789" * 100


class Upstream(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.done: list[str] = []  # "METHOD path" of each request answered in full


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.server.done.append(f"{self.command} {self.path}")  # acted on, before answering
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(BODY)

    def do_HEAD(self) -> None:
        self._answer(b"")

    def do_PUT(self) -> None:
        n = int(self.headers["Content-Length"])
        got = self.rfile.read(n)
        if len(got) < n:
            return  # cut off: nothing stored, nothing answered
        self.server.done.append(f"PUT {self.path} {len(got)}")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    with FaultProxy(upstream.server_address[:2], seed=1) as p:
        yield p


def call(proxy: FaultProxy, method: str, path: str, body: bytes | None = None):
    conn = http.client.HTTPConnection(*proxy.address, timeout=10)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_pass_forwards_and_closes_after_each_answer(proxy: FaultProxy, upstream: Upstream) -> None:
    """A passed request reaches the server and its answer comes back whole, with
    ``Connection: close`` so that the next request meets the mode then in force."""
    status, headers, body = call(proxy, "GET", "/a")
    assert (status, body) == (200, BODY) and headers["Connection"] == "close"
    assert call(proxy, "PUT", "/b", b"x" * 300)[0] == 200
    assert upstream.done == ["GET /a", "PUT /b 300"]
    assert proxy.hits == {Mode.PASS: 2}


def test_errors_are_answered_by_the_proxy_in_the_servers_dialect(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    """HTTP_500 and THROTTLE never reach the server: S3's XML errors by default, the
    Kubernetes Status (429 with Retry-After) when asked; a HEAD gets no body."""
    proxy.set(Mode.HTTP_500)
    status, _, body = call(proxy, "PUT", "/k", b"x" * 100)
    assert status == 500 and b"<Code>InternalError</Code>" in body
    proxy.set(Mode.THROTTLE)
    status, _, body = call(proxy, "GET", "/k")
    assert status == 503 and b"<Code>SlowDown</Code>" in body
    assert call(proxy, "HEAD", "/k")[0] == 503
    proxy.answers = KUBERNETES_ANSWERS
    status, headers, body = call(proxy, "GET", "/api/v1/pods")
    assert status == 429 and headers["Retry-After"] == "1" and b'"TooManyRequests"' in body
    assert upstream.done == []


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_drop_request_never_lets_a_whole_request_through(
    proxy: FaultProxy, upstream: Upstream, method: str
) -> None:
    """DROP_REQUEST resets the client's connection; the server gets half the body (half the
    method without one) and so never answers or stores anything."""
    proxy.set(Mode.DROP_REQUEST)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        call(proxy, method, "/k", b"x" * 1000 if method == "PUT" else None)
    proxy.set(Mode.PASS)
    call(proxy, "GET", "/after")
    assert upstream.done == ["GET /after"]


@pytest.mark.parametrize(("method", "error"), [("GET", http.client.IncompleteRead), ("HEAD", None)])
def test_drop_response_cuts_the_answer_after_the_server_acted(
    proxy: FaultProxy, upstream: Upstream, method: str, error: type | None
) -> None:
    """DROP_RESPONSE forwards the whole request (the server acts on it) and cuts the answer:
    inside the body when there is one, inside the status line when there is none."""
    proxy.set(Mode.DROP_RESPONSE)
    with pytest.raises(error or (ConnectionError, http.client.HTTPException)):
        call(proxy, method, "/k")
    assert upstream.done == [f"{method} /k"]


def test_rate_and_count_bound_a_fault(proxy: FaultProxy) -> None:
    """``count`` faults then pass again; ``rate`` 0 passes everything."""
    proxy.set(Mode.HTTP_500, count=2)
    assert [call(proxy, "GET", "/k")[0] for _ in range(3)] == [500, 500, 200]
    assert proxy.mode is Mode.PASS
    proxy.set(Mode.THROTTLE, rate=0.0)
    assert call(proxy, "GET", "/k")[0] == 200
    with pytest.raises(ValueError, match="rate"):
        proxy.set(Mode.THROTTLE, rate=2.0)


def test_a_held_request_waits_then_goes_on_or_is_dropped(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    """``hold`` stops the matching request before any of it reaches the server; released, it
    goes on, or its connection is reset; other requests pass meanwhile."""
    results: list = []

    def put(path: str) -> None:
        try:
            results.append(call(proxy, "PUT", path, b"w" * 10)[0])
        except (ConnectionError, http.client.HTTPException) as e:
            results.append(type(e).__name__)

    for forward in (True, False):
        held = proxy.hold(lambda r: r.method == "PUT" and r.path.endswith("/weights"))
        t = threading.Thread(target=put, args=(f"/{forward}/weights",))
        t.start()
        req = held.wait(5)
        assert req is not None and req.path == f"/{forward}/weights"
        assert req.client[0] == "127.0.0.1"
        assert call(proxy, "GET", "/meanwhile")[0] == 200
        held.release(forward=forward)
        t.join(10)
    assert results[0] == 200 and results[1] != 200
    assert upstream.done == ["GET /meanwhile", "PUT /True/weights 10", "GET /meanwhile"]
    assert proxy.hold(lambda r: False).wait(0.1) is None


def test_cut_open_resets_a_connection_in_flight(proxy: FaultProxy) -> None:
    """``cut_open`` resets a connection the proxy holds open (here: a held request)."""
    held = proxy.hold(lambda r: True)
    failed: list = []

    def get() -> None:
        try:
            call(proxy, "GET", "/slow")
        except (ConnectionError, http.client.HTTPException) as e:
            failed.append(e)

    t = threading.Thread(target=get)
    t.start()
    assert held.wait(5) is not None
    assert proxy.cut_open() == 1
    held.release(forward=True)
    t.join(10)
    assert len(failed) == 1
