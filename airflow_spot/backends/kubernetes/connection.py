"""How the backend reaches the Kubernetes API, and what a user reads when it cannot.

Two failures used to surface as another library's traceback:

* the configuration cannot be loaded (no such kubeconfig, not YAML, an Airflow connection
  that does not exist, ``in_cluster`` outside a pod): a :class:`ConfigError` naming the
  setting it came from and the fix, as the task starts (retrying cannot help);
* the API server does not answer (refused, unresolvable, timed out): a :class:`BackendError`
  naming the server and the setting, so the try is retried (a server may come back) and the
  log says what to check, instead of urllib3's ``MaxRetryError``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_spot.exceptions import BackendError, ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def source(backend: Any) -> tuple[str, str]:
    """(the field the connection comes from, how to fix it) for ``backend``'s settings."""
    if backend.kubernetes_conn_id:
        return (
            "backend.kubernetes_conn_id",
            "create that Airflow connection (type Kubernetes) or fix the id",
        )
    if backend.config_file:
        return "backend.config_file", "give the path of a kubeconfig the worker can read"
    if backend.in_cluster:
        return (
            "backend.in_cluster",
            "run the worker in a pod with a service account, or give config_file or "
            "kubernetes_conn_id",
        )
    return (
        "backend.config_file",
        "none given, so the worker's default kubeconfig ($KUBECONFIG or ~/.kube/config) was "
        "used; give config_file or kubernetes_conn_id",
    )


def _setting(settings: Any) -> str:
    """``field=value`` of the setting the configuration came from (a field, not a probe)."""
    name, _ = source(settings)
    value = getattr(settings, name.removeprefix("backend."))
    return f"{name}={value!r}" if value else f"{name} (not set: the default kubeconfig)"


def settings_error(backend: Any, e: BaseException) -> ConfigError | None:
    """A :class:`ConfigError` for a configuration that cannot be loaded, or None when ``e``
    is something else (left to propagate)."""
    import yaml
    from kubernetes.config import ConfigException

    from airflow_spot.exceptions import SpotError

    if isinstance(e, SpotError):
        return None
    not_found = type(e).__name__ == "AirflowNotFoundException"
    if not (not_found or isinstance(e, (ConfigException, yaml.YAMLError, OSError))):
        return None
    name, fix = source(backend)
    first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
    return ConfigError(
        name, f"cannot load the Kubernetes configuration ({_setting(backend)}): {first}; {fix}"
    )


def unreachable(backend: Any, e: BaseException) -> BackendError:
    """The API server did not answer: name it, the setting it came from, and what to check."""
    try:
        host = backend.api.core.api_client.configuration.host
    except Exception:  # noqa: BLE001 - the message must not fail
        host = "?"
    # urllib3 says "HTTPSConnection(host=..., port=...): Failed to establish a new
    # connection: [Errno 111] Connection refused": the server is named below, keep the cause
    reason = str(getattr(e, "reason", None) or e).rsplit("): ", 1)[-1]
    if reason.startswith("Failed to establish a new connection: "):
        reason = reason.removeprefix("Failed to establish a new connection: ")
    name, _ = source(backend)
    return BackendError(
        f"cannot reach the Kubernetes API server at {host} ({reason}), from "
        f"{_setting(backend)}: check that the API server is up and that the worker can "
        f"reach it, or fix {name}"
    )


def reaching_server(method: F) -> F:
    """Turn urllib3's errors (the API server not answering) into :func:`unreachable`."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        from urllib3.exceptions import HTTPError

        try:
            return method(self, *args, **kwargs)
        except HTTPError as e:
            raise unreachable(self, e) from e

    return call  # type: ignore[return-value]
