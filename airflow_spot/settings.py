"""The provider's own settings: ``[spot_training]`` in ``airflow.cfg``, or the environment
variables ``AIRFLOW__SPOT_TRAINING__<NAME>``, as for any Airflow setting.

They are declared in the provider info's ``config`` section (built from :data:`SETTINGS`), so
``airflow config list`` shows them with their defaults and descriptions. Each is read when it
is needed, through Airflow's configuration, imported then and never at import time (the
operator's module stays cheap to import, and a DAG parse reads no setting it does not use).

Who reads them: the Airflow processes (the worker running the operator, the triggerer, the
scheduler's listener). The training process runs in the user's image, where Airflow and its
configuration may be absent: what it needs reaches it as ``AIRFLOW_SPOT_*`` environment
variables set by the operator at launch (the S3 retry budget among them; see
:func:`s3_retry_s`).

Earlier names. Before these settings, three budgets were environment variables of their own
(``AIRFLOW_SPOT_PLAN_CACHE``, ``AIRFLOW_SPOT_KUBE_RETRY_S``, ``AIRFLOW_SPOT_S3_RETRY_S``).
Where one of them is set it still wins over the setting, so a deployment that set it keeps
its value; the log says once which setting replaces it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_spot.exceptions import ConfigError, finite_number

log = logging.getLogger(__name__)
CONFIG_SECTION = "spot_training"
LOCAL_ROOTS_OPTION = "allowed_local_checkpoint_roots"
LOCAL_ROOTS_DEFAULT = "{AIRFLOW_HOME}/spot_checkpoints"
VERSION_ADDED = "0.1.0"  # every option so far came with the first release
S3_RETRY_ENV = "AIRFLOW_SPOT_S3_RETRY_S"  # also how the training process gets the budget
S3_RETRY_DEFAULT_S = 60.0


@dataclass(frozen=True)
class Setting:
    """One option of the ``[spot_training]`` section."""

    name: str
    type: str  # Airflow's option types: "string", "float", "integer", "boolean"
    default: str
    description: str
    example: str | None = None
    earlier_env: str | None = None  # the environment variable it replaces (still honoured)

    @property
    def label(self) -> str:
        return f"[{CONFIG_SECTION}] {self.name}"

    @property
    def env(self) -> str:
        return f"AIRFLOW__{CONFIG_SECTION}__{self.name}".upper()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "default_backend",
        "string",
        "local",
        "The backend of a task that names none: ``local`` (attempts run on the worker), or "
        "a JSON object of a backend's settings as ``Backend.to_dict()`` gives them, e.g. "
        '``{"kind": "kubernetes", "image": "ghcr.io/me/train:1", "namespace": "ml"}``. Read '
        "when the DAG is parsed.",
        '{"kind": "kubernetes", "image": "ghcr.io/me/train:1"}',
    ),
    Setting(
        "plan_cache",
        "string",
        "",
        "Folder where the deadline_aware policy keeps the plans it solved (a resumed task "
        "reuses them instead of solving again). Empty: ``$XDG_CACHE_HOME/airflow-spot/plans`` "
        "(``~/.cache`` without it). Replaces AIRFLOW_SPOT_PLAN_CACHE.",
        "/var/cache/airflow-spot/plans",
        earlier_env="AIRFLOW_SPOT_PLAN_CACHE",
    ),
    Setting(
        LOCAL_ROOTS_OPTION,
        "string",
        LOCAL_ROOTS_DEFAULT,
        "Comma-separated absolute folders that a local (path or file://) ``checkpoint_uri`` "
        "must lie inside once rendered, symlinks followed; checked when the task starts. "
        "Anyone who may trigger a DAG could otherwise choose, through a templated URI, where "
        "the worker writes and deletes checkpoints. ``{AIRFLOW_HOME}`` is replaced by "
        "Airflow's home. Empty: no local location at all (s3:// only). S3 URIs are not "
        "affected.",
        "/data/spot-checkpoints,/mnt/shared/ckpt",
    ),
    Setting(
        "kube_api_retry_s",
        "float",
        "30",
        "Seconds a Kubernetes API call that fails transiently (429, 5xx, a connection cut) "
        "is retried with backoff, from its first failure; 0: never. Replaces "
        "AIRFLOW_SPOT_KUBE_RETRY_S.",
        "60",
        earlier_env="AIRFLOW_SPOT_KUBE_RETRY_S",
    ),
    Setting(
        "s3_retry_s",
        "float",
        "60",
        "Seconds an S3 call that fails transiently (5xx, throttling, a connection cut) is "
        "retried, in the worker and the triggerer and, handed over as AIRFLOW_SPOT_S3_RETRY_S "
        "at launch, in the training process; 0: never.",
        "120",
        earlier_env=S3_RETRY_ENV,
    ),
    Setting(
        "default_lease",
        "string",
        "",
        "The lease of a task that gives none: how long an attempt trains on with nobody "
        "renewing it (a failed try, a dead triggerer) before it checkpoints and stops by "
        "itself; a duration such as ``10m`` or ``600s``. Empty: three decision intervals, at "
        "least 5 minutes.",
        "15m",
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
_warned: set[str] = set()


def provider_config() -> dict[str, Any]:
    """The provider info's ``config`` entry (what ``airflow config list`` shows)."""
    options = {
        s.name: {
            "description": s.description,
            "version_added": VERSION_ADDED,
            "type": s.type,
            "example": s.example,
            "default": s.default,
        }
        for s in SETTINGS
    }
    return {
        CONFIG_SECTION: {
            "description": "Settings of the spot training provider (airflow-spot).",
            "options": options,
        }
    }


def raw(name: str) -> str:
    """The setting's text: its earlier environment variable where that is set, else Airflow's
    configuration (airflow.cfg or ``AIRFLOW__SPOT_TRAINING__*``), else its default."""
    s = BY_NAME[name]
    if s.earlier_env and os.environ.get(s.earlier_env, "").strip():
        if s.earlier_env not in _warned:
            _warned.add(s.earlier_env)
            log.info("%s is set: it wins over %s (%s).", s.earlier_env, s.label, s.env)
        return os.environ[s.earlier_env]
    from airflow.configuration import conf

    value = conf.get(CONFIG_SECTION, name, fallback=s.default)
    return "" if value is None else str(value)


def seconds(name: str, text: str | None = None) -> float:
    """A setting of seconds >= 0 (``text``: a value read elsewhere), or a ConfigError naming
    where it came from and what it must be."""
    s = BY_NAME[name]
    text = raw(name) if text is None else text
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (finite_number(v) and v >= 0):
        from_env = s.earlier_env if os.environ.get(s.earlier_env or "", "").strip() else None
        where = from_env or s.label
        raise ConfigError(
            where,
            f"must be a number of seconds >= 0, got {text!r}; "
            + (f"fix or unset {from_env}" if from_env else f"set it in airflow.cfg or {s.env}"),
        )
    return v


def kube_api_retry_s() -> float:
    """How long a Kubernetes API call failing transiently is retried (0: never)."""
    return seconds("kube_api_retry_s")


def s3_retry_s(*, airflow: bool = True) -> float:
    """How long an S3 call failing transiently is retried. ``airflow``: this is an Airflow
    process (the setting applies); the training process (``airflow=False``) knows only its
    environment: ``AIRFLOW_SPOT_S3_RETRY_S``, which the operator sets at launch, else 60 s."""
    if airflow:
        return seconds("s3_retry_s")
    text = os.environ.get(S3_RETRY_ENV, "").strip()
    return seconds("s3_retry_s", text) if text else S3_RETRY_DEFAULT_S


def plan_cache() -> str:
    """The folder deadline_aware keeps its plans in."""
    return raw("plan_cache").strip() or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "airflow-spot",
        "plans",
    )


def default_lease() -> timedelta | None:
    """The lease of a task that gives none (None: three decision intervals, >= 5 minutes)."""
    from airflow_spot.durations import parse_hours

    text = raw("default_lease").strip()
    if not text:
        return None
    s = BY_NAME["default_lease"]
    try:
        hours = parse_hours(text, s.label)
    except ConfigError as e:
        raise ConfigError(s.label, f"{str(e).partition(': ')[2]} (or {s.env})") from None
    if hours <= 0:
        raise ConfigError(s.label, f"must be a duration > 0 such as 15m, got {text!r}")
    return timedelta(hours=hours)


def default_backend() -> str:
    """The ``default_backend`` setting's text (``local``, or a backend's JSON settings)."""
    return raw("default_backend").strip() or "local"
