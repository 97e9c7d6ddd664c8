"""Transient Kubernetes API failures are retried with backoff for a bounded time; anything
else, and a server never reached, fails at once (``backends/kubernetes/retry.py``).

The client's ``call_api`` is replaced by a function that fails as told; the clock and the
sleeps are the test's own, so the backoff is checked to the second without waiting."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError

from airflow_spot.backends.kubernetes import retry
from airflow_spot.exceptions import ConfigError


class Client:
    """An ApiClient whose ``call_api`` fails with each of ``failures`` in turn, then answers."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    def call_api(self, path: str, method: str, **kw: Any) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return f"{method} {path}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


def api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.headers = headers or {}
    return e


def refused() -> MaxRetryError:
    return MaxRetryError(None, "/api", NewConnectionError(None, "Connection refused"))  # type: ignore[arg-type]


def dropped() -> MaxRetryError:
    return MaxRetryError(None, "/api", ProtocolError("Connection broken: IncompleteRead"))  # type: ignore[arg-type]


def wrapped(c: Client, clock: Clock) -> Client:
    return retry.install(c, sleep=clock.sleep, clock=clock)


@pytest.mark.parametrize(
    "failure", [api_error(500), api_error(503), api_error(502), api_error(504), dropped()]
)
def test_a_transient_failure_is_retried_until_the_call_answers(failure) -> None:
    c, clock = Client(failure, failure), Clock()
    assert wrapped(c, clock).call_api("/api/v1/pods", "GET") == "GET /api/v1/pods"
    assert c.calls == 3 and clock.slept == [0.2, 0.4]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_any_other_status_is_the_callers_answer_at_once(status) -> None:
    c, clock = Client(api_error(status)), Clock()
    with pytest.raises(ApiException) as e:
        wrapped(c, clock).call_api("/api/v1/pods", "GET")
    assert e.value.status == status and c.calls == 1 and clock.slept == []


def test_a_server_never_reached_fails_at_once_and_is_retried_once_it_answered() -> None:
    c, clock = Client(refused()), Clock()
    client = wrapped(c, clock)
    with pytest.raises(MaxRetryError):
        client.call_api("/api/v1/pods", "GET")
    assert c.calls == 1 and clock.slept == []  # a setting to fix: told at once
    client.call_api("/api/v1/pods", "GET")  # it answers now
    c.failures = [refused()]  # then restarts: a connection refused is now transient
    assert client.call_api("/api/v1/pods", "GET") == "GET /api/v1/pods"
    assert clock.slept == [0.2]


def test_a_connection_cut_midway_is_retried_even_on_the_first_call() -> None:
    """A new try of the task, in a new process, meets the blip that failed the last one."""
    c, clock = Client(dropped()), Clock()
    assert wrapped(c, clock).call_api("/api/v1/pods", "GET") == "GET /api/v1/pods"


def test_the_backoff_doubles_to_2_s_and_gives_up_after_the_budget(monkeypatch) -> None:
    monkeypatch.setenv(retry.RETRY_ENV, "10")
    c, clock = Client(*[api_error(500)] * 50), Clock()
    with pytest.raises(ApiException) as e:
        wrapped(c, clock).call_api("/api/v1/pods", "GET")
    assert e.value.status == 500
    assert clock.slept[:5] == [0.2, 0.4, 0.8, 1.6, 2.0] and max(clock.slept) == 2.0
    assert 8.0 <= sum(clock.slept) <= 10.0, clock.slept  # within the 10 s budget, no more


def test_retry_after_is_honoured() -> None:
    c, clock = Client(api_error(429, {"Retry-After": "3"})), Clock()
    wrapped(c, clock).call_api("/api/v1/pods", "GET")
    assert clock.slept == [3.0]


def test_zero_turns_retries_off(monkeypatch) -> None:
    monkeypatch.setenv(retry.RETRY_ENV, "0")
    c, clock = Client(api_error(500)), Clock()
    with pytest.raises(ApiException):
        wrapped(c, clock).call_api("/api/v1/pods", "GET")
    assert c.calls == 1


@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "inf"])
def test_a_bad_budget_names_the_variable_and_the_fix(monkeypatch, raw) -> None:
    monkeypatch.setenv(retry.RETRY_ENV, raw)
    with pytest.raises(ConfigError) as e:
        retry.retry_s()
    assert e.value.field == retry.RETRY_ENV and "seconds >= 0" in str(e.value)


def test_installing_twice_wraps_once() -> None:
    c, clock = Client(api_error(500), api_error(500)), Clock()
    client = retry.install(wrapped(c, clock), sleep=clock.sleep, clock=clock)
    client.call_api("/api/v1/pods", "GET")
    assert clock.slept == [0.2, 0.4]  # one wrapper's backoff, not two nested ones


def test_a_create_that_met_itself_is_told_from_another_by_its_stamp() -> None:
    from kubernetes.client import V1ObjectMeta, V1Pod

    key = "airflow-spot/launched-at"
    mine = V1Pod(metadata=V1ObjectMeta(name="p-a1", annotations={key: "1796422140.123456"}))
    assert retry.created_by_us(mine, "p-a1", key, "1796422140.123456")
    assert not retry.created_by_us(mine, "p-a1", key, "1796422140.999999")  # an older one
    assert not retry.created_by_us(mine, "p-a2", key, "1796422140.123456")
    assert not retry.created_by_us(None, "p-a1", key, "1796422140.123456")  # gone since
