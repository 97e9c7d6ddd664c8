"""A backend from its settings (``Backend.to_dict()``), in a watcher's process: the one place a
backend's kind picks its class. Apart from ``base.py`` so that the protocol's module imports no
backend (they import it)."""

from __future__ import annotations

from typing import Any

from airflow_spot.backends.base import Backend
from airflow_spot.exceptions import ConfigError


def load_backend(settings: dict[str, Any]) -> Backend:
    """The backend ``settings`` describe (``kind`` "local" when absent)."""
    kind = settings.get("kind", "local")
    if kind == "kubernetes":
        from airflow_spot.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend.from_dict(settings)
    if kind == "local":
        from airflow_spot.backends.local.backend import LocalBackend

        return LocalBackend.from_dict(settings)
    raise ConfigError("backend", f"unknown backend kind {kind!r} in a stored attempt")
