"""Settings for a production deployment that rides out an api-server or broker restart.

With Airflow's defaults, a restart of the api-server or of Redis costs every deferred task
whose trigger fires meanwhile a try (issue 34, finding 1). The resumed try never reaches
operator code, so no retry policy of the operator can save it:

    api-server down: the worker's Task SDK client retries ``PATCH task-instances/{id}/run``
      ([workers] execution_api_retries=5, waits 1-8 s: gives up after 4 to 15 s), then kills the
      task process -> the executor reports the try failed while it is queued -> the scheduler
      fails it ("executor reported ... failed, but the task instance's state attribute is
      queued"): one try spent
    Redis down: the scheduler's ``apply_async`` fails in ~0.7 s (kombu's own policy: 3 quick
      retries, then OperationalError) -> the CeleryExecutor marks the send failed: one try
      spent. Its ``[celery] task_publish_max_retries`` re-sends only after a *timeout*
      (``[celery] operation_timeout``), never after an error

What :data:`WORKER_SETTINGS` changes (environment variables; the same keys work in
``airflow.cfg``; each component reads its own and ignores the others, so set them all on every
component, as one ``airflow.cfg`` would):

* read by the workers (:data:`EXECUTION_API_SETTINGS`): 31 tries of every execution API call,
  10 to 20 s apart. A worker waits out an api-server outage of **at least 300 s** (30 waits of
  at least 10 s), gives up after at most ~560 s (~710 s if each call also hangs for its 5 s
  timeout), and calls again no later than 20 s after the api-server is back. 300 s matches the
  scheduler's ``[scheduler] task_instance_heartbeat_timeout``: a try that is *running* (not
  deferred) through a longer outage is failed for its missing heartbeats anyway.
* read by the scheduler (:data:`BROKER_SETTINGS`): the Celery app of :data:`CELERY_CONFIG`
  retries a publish over a broken connection until ``operation_timeout`` (2 s) ends it, and the
  executor sends it again on each of its next 150 loops: a Redis outage of **at least 302 s**
  (151 sends of 2 s) costs no try. The cost: while the broker is down, every scheduler loop
  spends 2 s on each task waiting to be sent (sent one after the other on a 2-core scheduler:
  ``[celery] sync_parallelism`` defaults to the cores less one).

The Celery workers need nothing: they reconnect by themselves (Celery retries every 2, 4, ...
up to 30 s, for ~46 min), so a try sent after the outage reaches its worker within 30 s of the
broker's return. A Redis restart without persistence loses the messages it held, though: a try
sent before the outage and not yet taken by a worker stays queued until ``[scheduler]
task_queued_timeout`` (600 s by default) requeues it. Run Redis with ``appendonly yes``.

Use::

    AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=airflow_spot.production.CELERY_CONFIG
    (and the rest of WORKER_SETTINGS; `python -m airflow_spot.production` prints them)

:data:`CELERY_CONFIG` is Airflow's own default Celery configuration (``DEFAULT_CELERY_CONFIG``)
plus :data:`PUBLISH_RETRY_POLICY`; it is built on first use, so importing this module imports
nothing but the standard library. A deployment with its own Celery config module adds
``task_publish_retry_policy=PUBLISH_RETRY_POLICY`` there instead (or puts it in ``[celery]
extra_celery_config`` as JSON).
"""

from __future__ import annotations

from typing import Any

# kombu retries a publish over a broken connection this way (0.5 s, then every 1 s). The
# executor's operation_timeout (2 s) ends it first, as an AirflowTaskTimeout, which the executor
# sends again: never kombu's OperationalError, which fails the try. The bound of ~30 s holds
# only where there is no such timeout (a publish outside the main thread has none).
PUBLISH_RETRY_POLICY: dict[str, float | int] = {
    "max_retries": 30,
    "interval_start": 0.5,
    "interval_step": 0.5,
    "interval_max": 1.0,
}

EXECUTION_API_RETRIES = 31
EXECUTION_API_RETRY_WAIT_MIN_S = 10.0
EXECUTION_API_RETRY_WAIT_MAX_S = 20.0
OPERATION_TIMEOUT_S = 2.0
TASK_PUBLISH_MAX_RETRIES = 150

EXECUTION_API_SETTINGS: dict[str, str] = {
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": str(EXECUTION_API_RETRIES),
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": str(EXECUTION_API_RETRY_WAIT_MIN_S),
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": str(EXECUTION_API_RETRY_WAIT_MAX_S),
}
BROKER_SETTINGS: dict[str, str] = {
    "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "airflow_spot.production.CELERY_CONFIG",
    "AIRFLOW__CELERY__OPERATION_TIMEOUT": str(OPERATION_TIMEOUT_S),
    "AIRFLOW__CELERY__TASK_PUBLISH_MAX_RETRIES": str(TASK_PUBLISH_MAX_RETRIES),
}
WORKER_SETTINGS: dict[str, str] = {**EXECUTION_API_SETTINGS, **BROKER_SETTINGS}


def api_outage_survived_s(retries: int, wait_min: float) -> float:
    """The shortest api-server outage after which a worker has given up: ``retries`` calls
    with ``retries - 1`` waits between them, each at least ``wait_min`` (tenacity's
    ``wait_random_exponential`` draws between ``wait_min`` and a bound that doubles from 1 s).
    Airflow's defaults (5, 1 s): 4 s."""
    return (retries - 1) * wait_min


def broker_outage_survived_s(publish_max_retries: int, operation_timeout: float) -> float:
    """The shortest broker outage after which the scheduler has given up a publish: each of
    the ``publish_max_retries + 1`` sends lasts ``operation_timeout`` (kombu retries until it
    ends). Airflow's defaults fail the first send in ~0.7 s: 0."""
    return (publish_max_retries + 1) * operation_timeout


def celery_config() -> dict[str, Any]:
    """Airflow's default Celery configuration with :data:`PUBLISH_RETRY_POLICY` (a policy
    that ``[celery] extra_celery_config`` already sets is kept)."""
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    config = dict(DEFAULT_CELERY_CONFIG)
    config.setdefault("task_publish_retry_policy", dict(PUBLISH_RETRY_POLICY))
    return config


def __getattr__(name: str) -> Any:
    """``CELERY_CONFIG``, built on first use: Airflow reads it when it builds its Celery app
    (``[celery] celery_config_options``), after its configuration is loaded."""
    if name == "CELERY_CONFIG":
        globals()[name] = config = celery_config()
        return config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    for key, value in WORKER_SETTINGS.items():
        print(f"{key}={value}")
