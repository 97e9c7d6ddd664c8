"""What an operator argument left out becomes, from the provider's settings
(:mod:`airflow_spot.settings`): the backend (``[spot_training] default_backend``, read when the
operator is built, as a DAG's own backend object is) and the lease (``default_lease``, read when
the task starts). A bad setting is a ConfigError naming the setting, not the task's argument.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from airflow_spot.exceptions import ConfigError
from airflow_spot.settings import BY_NAME, default_backend, default_lease


def backend_or_default(backend: Any) -> Any:
    """``backend`` as given, else the setting's: ``"local"`` or the backend its JSON builds."""
    if backend is not None:
        return backend
    text = default_backend()
    if text == "local":
        return text
    s = BY_NAME["default_backend"]
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    if not isinstance(settings, dict) or not isinstance(settings.get("kind"), str):
        raise ConfigError(
            s.label,
            f"{text!r} is neither 'local' nor a JSON object of a backend's settings with its "
            'kind, e.g. {"kind": "kubernetes", "image": "ghcr.io/me/train:1"}; fix it in '
            f"airflow.cfg or {s.env}, or give the task a backend",
        )
    from airflow_spot.backends.registry import load_backend

    try:
        return load_backend(settings)
    except (TypeError, ValueError) as e:
        raise ConfigError(s.label, f"cannot build that backend: {e}") from None


def lease_s(lease: timedelta | None, decision_interval: timedelta, poll_interval: float) -> float:
    """Each attempt's lease in seconds: the task's ``lease``, else the setting's, else three
    decision intervals (at least 5 minutes). The setting must leave 3 polls, as ``lease`` must."""
    from airflow_spot.operators.arguments import default_lease as three_intervals

    if lease is not None:
        return lease.total_seconds()
    given = default_lease()
    if given is None:
        return three_intervals(decision_interval).total_seconds()
    floor = max(1.0, 3 * poll_interval)
    if given.total_seconds() < floor:
        s = BY_NAME["default_lease"]
        raise ConfigError(
            s.label,
            f"{given.total_seconds():g} s is shorter than 3 poll_intervals ({floor:g} s) of "
            f"this task: lengthen it ({s.env}), or give the task its own lease",
        )
    return given.total_seconds()
