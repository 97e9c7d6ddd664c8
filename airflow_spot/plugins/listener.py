"""The plugin's listener: a task instance Airflow ended without its operator stops its attempt.

Airflow calls ``on_task_instance_failed`` where it fails a task instance: in the scheduler
when it fails a try that never ran operator code (the executor reported the try failed while
it was still queued, as when the api-server or the broker was down when the trigger fired;
a heartbeat timeout), and in the api-server when a user marks it failed; ``success`` the same
way for a task marked succeeded. Both processes hold the task state store, so the job's
saved state is read there and :func:`~airflow_spot.operators.unwatched.stop_unwatched` stops
and records what still runs. A try that failed with tries left is left alone (the next try
re-attaches); in a worker (where the operator itself ran and stopped what it had to) the
hook does nothing.

The stop runs in a thread of its own: cancelling an attempt waits for its verdict (seconds),
and the scheduler's loop must not. Importing this module is cheap (every Airflow process loads
the plugin): only ``pluggy``.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from pluggy import HookimplMarker

hookimpl = HookimplMarker("airflow")
log = logging.getLogger(__name__)
SERVER_TI = "airflow.models.taskinstance"  # the module of the task instances a server holds


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    if str(getattr(task_instance, "state", "")) != "failed":  # up_for_retry: the next try
        return  # re-attaches to the attempt
    detail = f": {error}" if error else ""
    ended(task_instance, f"Airflow failed try {task_instance.try_number}{detail}")


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    ended(task_instance, "the task was marked success")


def ended(ti: Any, why: str, wait: bool = False) -> threading.Thread | None:
    """Stop what still runs of ``ti``'s job, in a thread (``wait``: and join it); None in a
    worker, where the operator handles its own end."""
    if type(ti).__module__ != SERVER_TI:
        return None
    key = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)
    t = threading.Thread(target=_stop, args=(key, why), name="airflow-spot-unwatched", daemon=True)
    t.start()
    if wait:
        t.join()
    return t


def _stop(key: tuple[str, str, str, int, int], why: str) -> None:
    from airflow.state import TaskScope, get_state_backend

    from airflow_spot.operators.job import TaskIdentity
    from airflow_spot.operators.spot_training import STATE_KEY
    from airflow_spot.operators.unwatched import stop_unwatched

    dag_id, run_id, task_id, map_index, try_number = key
    scope = TaskScope(dag_id, run_id, task_id, map_index)
    try:
        store = get_state_backend()
        raw = store.get(scope, STATE_KEY)
        if raw is None:
            return  # not a spot training task
        state = stop_unwatched(
            json.loads(raw), TaskIdentity(dag_id, task_id, run_id, map_index, try_number), why
        )
        if state is not None:
            store.set(scope, STATE_KEY, json.dumps(state))
    except Exception:  # a listener must never break the process that calls it
        log.exception("Could not stop what still runs of %s/%s/%s.", dag_id, run_id, task_id)
