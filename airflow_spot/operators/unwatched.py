"""Stopping a job's attempts when Airflow ended its task instance without the operator.

The operator stops its live attempt whenever a try of its own fails for good. But Airflow can
end a task instance where no operator code runs: the scheduler fails a try that could not
start (the api-server or the broker was down when the trigger fired), a heartbeat timeout
fails a try whose worker died, a user marks the task failed or succeeded. Without this, the
attempt would train on unwatched until its lease ran out, billed and in no ledger.

:func:`stop_unwatched` runs where the task state store is, with the job's saved state and not
the operator: the plugin's listener calls it in the scheduler and the api-server. It stops
the live attempt (and a spot attempt launching beside it), closes their records with what ran
(the ledger bills them to the stop), marks the job failed with why, and renews the UI's
snapshot. It is idempotent: a job already finished or failed is left alone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_spot.backends.base import AttemptStatus, Backend, Outcome
from airflow_spot.backends.registry import load_backend
from airflow_spot.jobstate import AttemptRecord, JobState
from airflow_spot.operators.job import JobArgs, TaskIdentity
from airflow_spot.operators.summary import Report

log = logging.getLogger(__name__)
ERROR = "TaskEndedWithoutOperator"  # the ``failed`` error the UI shows for such a job


def stop_unwatched(
    raw: dict[str, Any] | None,
    ident: TaskIdentity,
    why: str,
    now: float | None = None,
    backend: Backend | None = None,
) -> dict[str, Any] | None:
    """The job's state after stopping what still runs of it, or None where there is nothing to
    do (no state, a job finished or failed already). ``why``: how the task instance ended, for
    the record and the UI; ``backend``: the one to stop through (default: the state's own)."""
    if not raw or raw.get("finished") or raw.get("failed"):
        return None
    state = JobState.from_dict(raw)
    running = [rec for rec in (state.coming, state.live) if rec is not None]
    if backend is None:
        backend = load_backend(state.backend or {"kind": "local"})
    when = time.time() if now is None else now
    for rec in running:
        log.warning(
            "Task %s ended without its operator (%s): stopping attempt %d on %s.",
            ident.task_id,
            why,
            rec.attempt,
            rec.capacity,
        )
        _close(rec, backend.cancel(rec.handle), backend, why, when)
    state.current = state.incoming = None
    stopped = ", ".join(f"attempt {r.attempt} on {r.capacity}" for r in running) or "nothing ran"
    state.failed = {"error": ERROR, "message": f"{why}; stopped: {stopped}"}
    if state.args is not None:
        try:
            Report(JobArgs.from_dict(state.args), ident, state).failed_for_good(when)
        except Exception as e:  # noqa: BLE001 - the stop and the record matter more
            log.warning("Could not renew the job's summary: %s", e)
    return state.to_dict()


def _close(
    rec: AttemptRecord, status: AttemptStatus, backend: Backend, why: str, now: float
) -> None:
    """Record what the stopped attempt did: its times (the ledger bills it to its end), the
    steps it reported and checkpointed, and why it stopped."""
    rec.granted_at = status.granted_at or rec.granted_at
    rec.started_at = status.started_at or rec.started_at
    prog = backend.progress(rec.handle)
    if prog is not None:
        rec.step_end = int(prog.get("step", rec.step_end or rec.step_start))
        if prog.get("checkpoint_step") is not None:
            rec.ckpt_step_end = int(prog["checkpoint_step"])
    if rec.step_end is None:
        rec.step_end = rec.step_start
    rec.ended_at = status.ended_at or now
    rec.outcome = (status.outcome or Outcome.CANCELLED).value
    rec.reason = f"stopped: the task ended without its operator ({why})"
    rec.exit_code = status.exit_code
    backend.release(rec.handle, rec.outcome)
