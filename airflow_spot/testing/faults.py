"""A fault-injecting HTTP/1.1 proxy for tests and chaos runs, in front of any HTTP server (a
moto S3 server, a Kubernetes API server), on 127.0.0.1. Standard library only.

    with FaultProxy(("127.0.0.1", moto_port), answers=S3_ANSWERS) as proxy:
        env["AWS_ENDPOINT_URL"] = proxy.url
        proxy.set(Mode.THROTTLE, rate=0.7)   # 7 new requests in 10 get 503 SlowDown
        proxy.set(Mode.PASS)

Each request gets a connection of its own (the proxy says ``Connection: close`` both ways),
so each request meets the mode in force when it arrives:

* ``PASS``: forwarded, the answer relayed;
* ``HTTP_500`` / ``THROTTLE``: answered by the proxy, never forwarded (``answers`` gives the
  server's dialect: S3's ``InternalError`` and ``503 SlowDown``, or Kubernetes' ``Status``
  500 and ``429 TooManyRequests``);
* ``DROP_REQUEST``: the server gets the head and half the body (half its method if there
  is no body), then both connections are reset;
* ``DROP_RESPONSE``: the server gets the whole request and answers; the client gets the
  answer's head and half its body (half its status line if there is no body), then a reset.

``rate`` is the share of new requests that meet the mode (the rest pass), ``count`` how many
meet it before the proxy passes everything again. :meth:`cut_open`
resets every connection in flight (a load balancer going away mid-download or mid-watch).
:meth:`hold` stops the next request that matches before anything of it is forwarded, for a
test to act while a client is blocked in that call (kill a process in the middle of a
write), then forwards or drops it. ``server_ssl``/``upstream_ssl`` terminate TLS (the
Kubernetes API) so that HTTP faults work there too. One request, then one answer, per
connection: upgrades (``101``: exec, port-forward) are relayed but not faulted mid-stream.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import ssl
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

HEAD_MAX = 1 << 16  # bytes: a longer request or response head is refused
CHUNK = 1 << 16


class Mode(str, Enum):
    PASS = "pass"
    HTTP_500 = "http_500"
    THROTTLE = "throttle"
    DROP_REQUEST = "drop_request"
    DROP_RESPONSE = "drop_response"


@dataclass(frozen=True)
class Answer:
    """An answer the proxy gives itself, in place of the server's."""

    status: int
    reason: str
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self, method: str) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {self.reason}", f"Content-Type: {self.content_type}"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        lines += [f"Content-Length: {len(self.body)}", "Connection: close", "", ""]
        head = "\r\n".join(lines).encode()
        return head if method == "HEAD" else head + self.body


def _s3_error(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>FAULTPROXY</RequestId><HostId>faultproxy</HostId></Error>"
    ).encode()


def _kube_status(code: int, reason: str, message: str) -> bytes:
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return json.dumps({**doc, "message": message, "reason": reason, "code": code}).encode()


S3_ANSWERS: dict[Mode, Answer] = {
    Mode.HTTP_500: Answer(
        500,
        "Internal Server Error",
        "application/xml",
        _s3_error("InternalError", "We encountered an internal error. Please try again."),
    ),
    Mode.THROTTLE: Answer(
        503,
        "Slow Down",
        "application/xml",
        _s3_error("SlowDown", "Please reduce your request rate."),
    ),
}
KUBERNETES_ANSWERS: dict[Mode, Answer] = {
    Mode.HTTP_500: Answer(
        500,
        "Internal Server Error",
        "application/json",
        _kube_status(500, "InternalError", "faultproxy: an injected internal error"),
    ),
    Mode.THROTTLE: Answer(
        429,
        "Too Many Requests",
        "application/json",
        _kube_status(429, "TooManyRequests", "faultproxy: too many requests, try again later"),
        (("Retry-After", "1"),),
    ),
}


@dataclass(frozen=True)
class Request:
    """A request's head as the proxy read it; ``client`` is the peer's (host, port)."""

    method: str
    target: str
    headers: dict[str, str]
    client: tuple[str, int]

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class Held:
    """A request stopped by :meth:`FaultProxy.hold` until :meth:`release`."""

    match: Callable[[Request], bool]
    request: Request | None = None
    _arrived: threading.Event = field(default_factory=threading.Event)
    _go: threading.Event = field(default_factory=threading.Event)
    _forward: bool = True

    def wait(self, timeout: float) -> Request | None:
        """The held request, once one matched (None if none did within ``timeout`` s)."""
        return self.request if self._arrived.wait(timeout) else None

    def release(self, *, forward: bool = True) -> None:
        """Let the request go on (``forward``) or reset its connection; a hold that matched
        nothing yet is withdrawn."""
        self._forward = forward
        self._go.set()


class FaultProxy:
    """The proxy (see the module docstring); :meth:`start` it, or use it as a context manager."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        answers: dict[Mode, Answer] | None = None,
        server_ssl: ssl.SSLContext | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
        seed: int | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.upstream = upstream
        self.answers = S3_ANSWERS if answers is None else answers
        self.server_ssl = server_ssl
        self.upstream_ssl = upstream_ssl
        self.timeout = timeout  # seconds a side may stay silent before the proxy gives up
        self.hits: Counter[Mode] = Counter()  # requests that met each mode
        self._mode, self._rate = Mode.PASS, 1.0
        self._left: int | None = None  # requests left to meet the mode (None: no end)
        self._only: Callable[[Request], bool] | None = None  # the requests the mode is for
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._holds: list[Held] = []
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.server_ssl is not None else "http"
        return f"{scheme}://{self.address[0]}:{self.address[1]}"

    @property
    def mode(self) -> Mode:
        return self._mode

    def set(
        self,
        mode: Mode,
        rate: float = 1.0,
        count: int | None = None,
        only: Callable[[Request], bool] | None = None,
    ) -> None:
        """The mode new requests meet; ``rate``: the share of them that do (the rest pass);
        ``count``: after that many have met it, back to ``PASS``; ``only``: the requests it
        applies to (the others pass, and do not count)."""
        if mode in (Mode.HTTP_500, Mode.THROTTLE) and mode not in self.answers:
            raise ValueError(f"no answer for {mode.value} in this proxy's answers")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], got {rate}")
        with self._lock:
            self._mode, self._rate, self._left, self._only = Mode(mode), rate, count, only

    def hold(self, match: Callable[[Request], bool]) -> Held:
        """Stop the next request for which ``match`` is true, before any of it is forwarded."""
        held = Held(match)
        with self._lock:
            self._holds.append(held)
        return held

    def cut_open(self) -> int:
        """Reset every connection in flight (both sides); how many sockets were cut."""
        with self._lock:
            socks = list(self._open)
        for s in socks:
            _reset(s)
        return len(socks)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            holds, self._holds = self._holds, []
        for held in holds:
            held.release(forward=False)
        self.cut_open()
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one connection ---------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        socks: list[socket.socket] = [conn]
        self._track(conn)
        try:
            conn.settimeout(self.timeout)
            client: Any = conn
            if self.server_ssl is not None:
                # the wrapped socket takes over the file descriptor (``conn`` is detached):
                # it is the one to track, cut and close
                client = self.server_ssl.wrap_socket(conn, server_side=True)
                self._untrack(conn)
                self._track(client)
                socks.append(client)
            head, rest = _read_head(client, b"")
            if head is None:
                return
            req = _parse_request(head, peer)
            if not self._pass_hold(req):
                _reset(client)
                return
            mode = self._draw(req)
            if mode in (Mode.HTTP_500, Mode.THROTTLE):
                if "100-continue" not in req.headers.get("expect", "").lower():
                    _read_body(client, req.headers, rest, None)  # the client then reads us
                client.sendall(self.answers[mode].encode(req.method))
                return
            up = self._connect()
            socks.append(up)
            if "100-continue" in req.headers.get("expect", "").lower():
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # then the body comes
            head = _rewrite(head, drop={"connection", "expect", "keep-alive"})
            if mode is Mode.DROP_REQUEST:
                _drop_request(client, up, head, req.headers, rest)
                _reset(up)
                _reset(client)
                return
            up.sendall(head)
            _read_body(client, req.headers, rest, up.sendall)
            self._relay_answer(up, client, client, req.method, mode is Mode.DROP_RESPONSE)
        except (OSError, ValueError):
            return  # a side went away, or sent something that is not HTTP/1.1
        finally:
            for s in socks:
                self._untrack(s)
                with contextlib.suppress(OSError):
                    s.close()

    def _relay_answer(
        self, up: Any, client: Any, raw: socket.socket, method: str, drop: bool
    ) -> None:
        """Interim answers as they come; the final one with ``Connection: close``, whole or
        (``drop``) cut after its head and half its body, or in its status line if it has none."""
        rest = b""
        while True:
            head, rest = _read_head(up, rest)
            if head is None:
                return
            status = int(head.split(b" ", 2)[1])
            if status < 100 or status >= 200 or status == 101:
                break
            client.sendall(head)  # 100 Continue, 103 Early Hints
        final = _rewrite(head, drop={"connection", "keep-alive"})
        length = _content_length(_headers(head))
        bodiless = method == "HEAD" or status in (204, 304) or length == 0
        if drop:
            if bodiless:  # within the status line: a cut between header lines would
                # pass for a whole head in lenient clients (http.client reads EOF as its end)
                client.sendall(final[: final.index(b"\r\n") // 2])
            else:
                want = max(1, (length if length is not None else len(rest) or 2) // 2)
                while len(rest) < want:
                    chunk = up.recv(CHUNK)
                    if not chunk:
                        break
                    rest += chunk
                client.sendall(final + rest[:want])
            _reset(raw)
            return
        client.sendall(final + rest)
        while chunk := up.recv(CHUNK):
            client.sendall(chunk)

    def _pass_hold(self, req: Request) -> bool:
        """Whether ``req`` goes on: a hold that matches it keeps it until released."""
        with self._lock:
            held = next((h for h in self._holds if not h._go.is_set() and h.match(req)), None)
            if held is not None:
                self._holds.remove(held)
                held.request = req
        if held is None:
            return True
        held._arrived.set()
        held._go.wait()
        return held._forward

    def _draw(self, req: Request) -> Mode:
        with self._lock:
            mode = self._mode
            if mode is not Mode.PASS and self._only is not None and not self._only(req):
                mode = Mode.PASS
            if mode is not Mode.PASS and self._rng.random() >= self._rate:
                mode = Mode.PASS
            if mode is not Mode.PASS and self._left is not None:
                self._left -= 1
                if self._left <= 0:
                    self._mode = Mode.PASS
            self.hits[mode] += 1
        return mode

    def _connect(self) -> Any:
        up = socket.create_connection(self.upstream, timeout=self.timeout)
        self._track(up)
        if self.upstream_ssl is None:
            return up
        try:
            wrapped = self.upstream_ssl.wrap_socket(up, server_hostname=self.upstream[0])
        except BaseException:
            self._untrack(up)
            up.close()
            raise
        self._untrack(up)  # detached: the wrapped socket holds the connection now
        self._track(wrapped)
        return wrapped

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._open.add(s)

    def _untrack(self, s: socket.socket) -> None:
        with self._lock:
            self._open.discard(s)


def _reset(s: socket.socket) -> None:
    """Close ``s`` with a TCP reset (SO_LINGER 0), as a dead peer or a middlebox does."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()


def _read_head(sock: Any, buf: bytes) -> tuple[bytes | None, bytes]:
    """(a message head ending in a blank line, the bytes after it); (None, b"") at EOF."""
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEAD_MAX:
            raise ValueError("message head too long")
        chunk = sock.recv(CHUNK)
        if not chunk:
            return None, b""
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def _parse_request(head: bytes, peer: tuple[str, int]) -> Request:
    method, target, _version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    return Request(method, target, _headers(head), (peer[0], peer[1]))


def _content_length(headers: dict[str, str]) -> int | None:
    """The body's length; None when it is chunked (or, in an answer, runs to the close)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return None
    return int(headers["content-length"]) if "content-length" in headers else None


def _rewrite(head: bytes, drop: set[str]) -> bytes:
    """``head`` without the headers named in ``drop``, with ``Connection: close``."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept = [lines[0]] + [
        ln for ln in lines[1:] if ln.split(b":", 1)[0].strip().decode("latin-1").lower() not in drop
    ]
    return b"\r\n".join([*kept, b"Connection: close", b"", b""])


def _read_body(
    sock: Any, headers: dict[str, str], rest: bytes, out: Callable[[bytes], Any] | None
) -> None:
    """Read a request's body (by Content-Length, or chunked) after ``rest``, passing it on to
    ``out`` as it comes (or discarding it)."""
    send = out or (lambda _b: None)
    length = _content_length(headers)
    if length is None and "chunked" not in headers.get("transfer-encoding", "").lower():
        length = 0  # a request without either header has no body
    if length is not None:
        send(rest[:length])
        left = length - len(rest)
        while left > 0:
            chunk = sock.recv(min(CHUNK, left))
            if not chunk:
                raise ConnectionError("the client went away mid-body")
            send(chunk)
            left -= len(chunk)
        return
    buf = rest
    while True:  # chunked: size line, data, CRLF ... 0, trailers, blank line
        while b"\r\n" not in buf:
            buf += _recv(sock)
        line, _, buf = buf.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:  # then trailers, if any, and a blank line
            while (end := (b"\r\n" + buf).find(b"\r\n\r\n")) < 0:
                buf += _recv(sock)
            send(line + b"\r\n" + buf[: end + 2])
            return
        while len(buf) < size + 2:
            buf += _recv(sock)
        send(line + b"\r\n" + buf[: size + 2])
        buf = buf[size + 2 :]


def _recv(sock: Any) -> bytes:
    chunk = sock.recv(CHUNK)
    if not chunk:
        raise ConnectionError("the client went away mid-body")
    return chunk


def _drop_request(client: Any, up: Any, head: bytes, headers: dict[str, str], rest: bytes) -> None:
    """Forward the head and half the body, or half the method if there is no body (or a
    chunked one): the server never gets the whole request. The caller then resets both."""
    length = _content_length(headers)
    if not length:  # within the method: lenient servers read EOF as the end of a head, and
        # a request line cut after its target as an HTTP/0.9 request
        up.sendall(head[: head.index(b" ") // 2 + 1])
        return
    up.sendall(head)
    want, body = length // 2, rest
    while len(body) < want:
        chunk = client.recv(CHUNK)
        if not chunk:
            break
        body += chunk
    up.sendall(body[:want])


def kube_fault_proxy(upstream: str, ca: Path, cert: Path, key: Path) -> FaultProxy:
    """A :class:`FaultProxy` in front of the Kubernetes API server at ``upstream``
    (``https://host:port``): TLS terminated with the server's own certificate (``cert``,
    ``key``: the kubeconfig's CA ``ca`` trusts it), re-encrypted towards the server, answers
    as Kubernetes ``Status`` objects. Not started."""
    host, port = upstream.removeprefix("https://").rsplit(":", 1)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(ca))
    return FaultProxy(
        (host, int(port)),
        answers=KUBERNETES_ANSWERS,
        server_ssl=server,
        upstream_ssl=client,
        timeout=30.0,
    )
