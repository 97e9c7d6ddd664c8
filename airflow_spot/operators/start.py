"""How a try begins: a job in progress is resumed, a job finished already is reported again, one
that failed for good is set aside, and a new one gets its state."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow_spot.backends.base import Backend, stop_and_release
from airflow_spot.exceptions import BackendError
from airflow_spot.jobstate import JobState
from airflow_spot.operators.arguments import warn_of_reference_prices
from airflow_spot.operators.summary import xcom_summary


def finished_again(raw: dict[str, Any], checkpoint_uri: str, log: Any) -> Any:
    """This task instance already finished its job (retried or cleared after success): the
    checkpoint holds all the work, so report that job again rather than a new one that
    "trains" nothing at 100 % savings."""
    log.info(
        "This task instance already finished its job (checkpoint %s); returning its "
        "summary. To train again, delete the checkpoints under %s or template "
        "checkpoint_uri per run.",
        (raw["finished"].get("final_checkpoint") or {}).get("uri"),
        checkpoint_uri,
    )
    return xcom_summary(
        {
            **raw["finished"],
            "decisions": raw.get("decisions") or [],
            "decisions_dropped": raw.get("decisions_dropped", 0),
        }
    )


def resumed_state(raw: dict[str, Any], try_number: int, now: float, log: Any) -> JobState:
    """The saved state of a job that a new try (``try_number``) resumes at ``now``."""
    state = JobState.from_dict(raw)
    state.infra_base = state.infra_disruptions  # the limit is per try
    state.try_started_at = now
    log.info("Resuming job state from try %s: %d attempts so far.", try_number, len(state.attempts))
    return state


def set_aside_failed_job(store: Any, key: str, old: JobState, backend: Backend, log: Any) -> None:
    """Before a new job replaces one that failed for good: stop any attempt it left
    running (or fail this try) and keep its record under ``<key>.previous``."""
    live = old.live
    if live is not None:
        status = stop_and_release(backend, live.handle)
        if not status.terminal:
            raise BackendError(
                f"attempt {live.attempt} of the failed job still runs and could not be "
                "stopped; stop it by hand or retry"
            )
    store.set(f"{key}.previous", old.to_dict())
    log.info(
        "The previous job failed for good (%s: %s); its record is kept under %s.previous. "
        "Starting afresh from the newest checkpoint with this task's current arguments.",
        (old.failed or {}).get("error"),
        (old.failed or {}).get("message"),
        key,
    )


def new_state(
    backend: Backend,
    now: float,
    deadline_at: float,
    total_steps: int | None,
    execution_timeout: timedelta | None,
    prices: dict[str, float],
    prices_given: tuple[str, ...],
    log: Any,
) -> JobState:
    """A new job's state, with the replayed market from now (where there is one)."""
    market = backend.market_spec(now)  # None where the real market is not replayed
    if market is None:  # real capacity: reference prices would make up the costs
        warn_of_reference_prices(backend.node_pools, prices_given, prices, log)
    if execution_timeout is not None and execution_timeout.total_seconds() < deadline_at - now:
        log.warning(
            "execution_timeout (%s) is shorter than the time to the deadline (%s): Airflow "
            "stops each try after it (the attempt too). With retries left the next try "
            "resumes the job from its checkpoint; the deadline still bounds the whole job.",
            execution_timeout,
            timedelta(seconds=round(deadline_at - now)),
        )
    return JobState(
        started_at=now,
        deadline_at=deadline_at,
        time_scale=backend.time_scale,
        total_steps=total_steps,
        market=market.to_dict() if market is not None else None,
        try_started_at=now,
        # a replayed market read directly only where the backend asks for the paper's oracle
        observe="oracle"
        if market is not None and backend.to_dict().get("observe") == "oracle"
        else "cluster",
    )


def defer_timeout(state: JobState, now: float, execution_timeout: timedelta | None) -> float:
    """How long a deferral may last: an hour past the deadline, and no later than this try's
    ``execution_timeout`` (Airflow does not apply it while a task is deferred)."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    timeout = max(60.0, state.deadline_at - now + 3600)
    if execution_timeout is not None and state.try_started_at is not None:
        left = state.try_started_at + execution_timeout.total_seconds() - now
        if left <= 0:
            raise AirflowTaskTimeout(f"execution_timeout ({execution_timeout}) reached")
        timeout = min(timeout, left)
    return timeout
