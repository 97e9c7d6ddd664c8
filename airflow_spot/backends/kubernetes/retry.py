"""Transient Kubernetes API failures, retried where the backend's client calls the server.

An API server that answered before and now answers ``429``, ``500``, ``502``, ``503`` or
``504``, or drops the connection (a rolling restart of the control plane, a load balancer
going away, etcd leader election), is retried with backoff (0.2 s, doubling to 2 s, a 429's
``Retry-After`` honoured) for up to the provider setting ``[spot_training] kube_api_retry_s``
seconds (default 30; the earlier ``AIRFLOW_SPOT_KUBE_RETRY_S`` still wins where set) from the
first failure of that call, each retry logged. Without it a few seconds of API trouble
failed the task's try, and a second blip within the retry delay failed the next one too
(found by ``benchmarks/chaos.py``: four tries spent by three 2-6 s fault windows).

Not retried: any other status (403, 404, 409, 422: the caller's answer to read), and a
connection never made (refused, no such host, TLS refused) by a client whose server never
answered it: that is a setting to fix, told at once by
:func:`~airflow_spot.backends.kubernetes.connection.unreachable`. A connection cut after it
was made (mid-request, mid-response) is retried even on a client's first call: a new try of
the task, in a new process, meets the same blip as the last one did.

A create whose answer was lost may have been carried out: retried, it meets ``409
AlreadyExists``. The backend's creates tell their own object from another by its name and
its launch stamp (:func:`created_by_us`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from airflow_spot.settings import BY_NAME, kube_api_retry_s

log = logging.getLogger(__name__)

RETRY_ENV = BY_NAME["kube_api_retry_s"].earlier_env  # AIRFLOW_SPOT_KUBE_RETRY_S
DEFAULT_RETRY_S = float(BY_NAME["kube_api_retry_s"].default)
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
FIRST_DELAY_S = 0.2
MAX_DELAY_S = 2.0
MAX_RETRY_AFTER_S = 10.0  # the longest server-asked wait (Retry-After) honoured


def retry_s() -> float:
    """How long a failing call is retried (``[spot_training] kube_api_retry_s``; 0 turns it
    off): read at a call's first failure, so a healthy API never reads the setting."""
    return kube_api_retry_s()


def transient(e: BaseException) -> bool:
    """A failure worth retrying: a transient status, or a connection lost on the way."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(e, ApiException):
        return e.status in TRANSIENT_STATUS
    return isinstance(e, HTTPError)


def never_connected(e: BaseException) -> bool:
    """No connection was made (refused, no such host, a TLS handshake refused, timed out
    connecting): a setting to fix unless the server answered this client before."""
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, SSLError

    reason = e.reason if isinstance(e, MaxRetryError) and e.reason is not None else e
    return isinstance(reason, (ConnectTimeoutError, SSLError))


def _retry_after(e: BaseException) -> float | None:
    headers = getattr(e, "headers", None) or {}
    try:
        return float(headers.get("Retry-After"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def install(
    api_client: Any,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Wrap ``api_client.call_api`` (every typed API of the client goes through it) with the
    retries of this module's notes; returns ``api_client``. Installing twice is a no-op."""
    from kubernetes.client.exceptions import ApiException

    call = api_client.call_api
    if getattr(call, "airflow_spot_retry", False):
        return api_client
    reached = [False]  # the server answered this client once

    def call_api(*args: Any, **kwargs: Any) -> Any:
        give_up: float | None = None
        delay = FIRST_DELAY_S
        while True:
            try:
                out = call(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - re-raised unless transient
                if isinstance(e, ApiException):
                    reached[0] = True
                if not transient(e) or (never_connected(e) and not reached[0]):
                    raise
                now = clock()
                if give_up is None:
                    give_up = now + retry_s()
                wait = max(delay, min(_retry_after(e) or 0.0, MAX_RETRY_AFTER_S))
                if now + wait > give_up:
                    raise
                what = f"{e.status} {e.reason}" if isinstance(e, ApiException) else type(e).__name__
                log.warning(
                    "Kubernetes API %s %s: %s; retrying in %.1f s (for up to %.0f s more).",
                    args[1] if len(args) > 1 else "",
                    _path(args, kwargs),
                    what,
                    wait,
                    give_up - now,
                )
                sleep(wait)
                delay = min(delay * 2, MAX_DELAY_S)
            else:
                reached[0] = True
                return out

    call_api.airflow_spot_retry = True  # type: ignore[attr-defined]
    api_client.call_api = call_api
    return api_client


def _path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``call_api``'s resource path with its path parameters filled in (for the log)."""
    path = str(args[0]) if args else str(kwargs.get("resource_path", ""))
    params = args[2] if len(args) > 2 else kwargs.get("path_params")
    try:
        return path.format(**dict(params or {}))
    except (KeyError, IndexError, ValueError, TypeError):
        return path


def created_by_us(existing: Any, name: str, stamp_key: str, stamp: str) -> bool:
    """Whether ``existing`` (the object a create met as ``409 AlreadyExists``) is the one
    this create made before its answer was lost: the same name and launch stamp."""
    meta = getattr(existing, "metadata", None)
    if meta is None or meta.name != name:
        return False
    return (meta.annotations or {}).get(stamp_key) == stamp
