"""``SpotTrainingOperator``: one task instance runs a whole training job on spot capacity.

``decide -> launch -> defer (trigger) -> wake on a typed event -> record -> decide again``,
until the work is done. The same :meth:`Policy.decide` as the simulator picks spot,
on-demand or wait at every wake. Preemptions spend the preemption budget, application
failures the failure budget; Airflow's ``retries`` stay for failures of the orchestration
itself. State lives in the task instance's ``task_state_store``, so it survives deferrals,
a killed worker and retries: a new try re-attaches to a live attempt and never adopts a
dead one. Importing this module is cheap (no trigger, numpy, Kubernetes or boto3): Airflow
parses DAG files constantly.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_spot.exceptions import BackendError, BudgetExhausted, ConfigError
from airflow_spot.operators.arguments import (
    ARGUMENTS,
    PREEMPTION_ACTIONS,
    TEMPLATE_FIELDS,
    argv_of,
    check_arguments,
    resolve_deadline,
)
from airflow_spot.operators.defaults import backend_or_default
from airflow_spot.operators.job import prices_or_reference
from airflow_spot.operators.links import SpotTimelineLink
from airflow_spot.operators.mapped import CheckedPartialDescriptor
from airflow_spot.operators.retry import DEFAULT_RETRIES, default_retry_policy, tries_left
from airflow_spot.operators.roots import check_local_root

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_spot.backends.base import Backend
    from airflow_spot.jobstate import JobState
    from airflow_spot.operators.job import JobArgs, TaskIdentity
    from airflow_spot.operators.turn import Turn

log = logging.getLogger(__name__)
STATE_KEY = "airflow_spot_job"  # where the job's state lives in the task state store
TRIGGER_FAIL = "__fail__"  # Airflow's next_method when a trigger failed or timed out
MAX_HOLD_S = 10.0  # a deferred task resumes no sooner (see min_deferral)
__all__ = ["PREEMPTION_ACTIONS", "STATE_KEY", "SpotTrainingOperator"]


class SpotTrainingOperator(BaseOperator):
    """Run a training command on spot capacity, resume from checkpoints, and meet the deadline.

    :param command: the training command (a list of arguments, or a string split like a shell
        would). It receives ``AIRFLOW_SPOT_CHECKPOINT_URI``, ``AIRFLOW_SPOT_CAPACITY`` and
        ``AIRFLOW_SPOT_ATTEMPT``; on the local backend also ``AIRFLOW_SPOT_NOTICE_FILE`` and
        ``AIRFLOW_SPOT_PROGRESS_FILE``, on Kubernetes ``AIRFLOW_SPOT_NOTICE_ANNOTATIONS`` (the
        downward-API file carrying the reclaim notice).
        :class:`airflow_spot.checkpoint.training.TrainingSession` reads them. Templated.
    :param checkpoint_uri: where checkpoints live: a path, ``file:///path`` or
        ``s3://bucket/prefix``. Progress is read from its newest checkpoint. Templated.
    :param expected_compute: compute time the whole job needs on the reference capacity
        (first estimate; replaced by the measured throughput once steps are seen).
    :param total_steps: steps of the whole job; required unless ``checkpoint_uri`` already
        holds a checkpoint whose manifest records them.
    :param deadline: when the work must be done: a timezone-aware ``datetime``, a ``timedelta``
        from the start of the task, or a string (an ISO datetime *with* its time zone, or a
        duration such as ``"6h"``). Templated, so a string is checked when the task starts.
    :param changeover: estimated launch + restore time of one attempt (replaced by the measured one).
    :param policy: a policy name (``deadline_aware``, ``uniform_progress``, ``greedy``,
        ``last_attempt_on_demand``, ``on_demand``, ``slack_reserve``), or
        ``deadline_aware@<prior>`` with a shipped prior (``aws-p3``, ``gcp-h100``, ``us-west-2a``).
    :param spot_price: spot price per hour (for the ledger and the policy); default the
        reference p3.2xlarge price of the benchmarks, $0.9731.
    :param on_demand_price: on-demand price per hour; default $3.06 (p3.2xlarge). On
        Kubernetes a job billed at these defaults says so in its log: give your nodes' prices.
    :param max_preemptions: preemptions tolerated (``None`` = unlimited); past it, see
        ``on_preemption_budget``.
    :param on_preemption_budget: ``"on_demand"`` (finish on on-demand) or ``"fail"``.
    :param max_failures: application failures (non-zero exit on healthy capacity) tolerated
        before the task fails; preemptions never count here.
    :param backend: ``"local"`` (the embedded backend) or a backend object such as
        :class:`airflow_spot.backends.local.LocalBackend`; default: the provider setting
        ``[spot_training] default_backend`` (``local`` unless set).
    :param decision_interval: how often to decide again when nothing happens.
    :param poll_interval: seconds between looks at the attempt (in the trigger while deferred,
        in the worker otherwise), and before looking again while a reclaim verdict is due.
    :param deferrable: wait in the triggerer (default) or in the worker.
    :param min_deferral: waits shorter than this are spent in the worker even when
        ``deferrable``, and a deferred task resumes no sooner than ``min(10 s, min_deferral /
        3)`` after deferring. Airflow (3.3, apache/airflow#71580 and #72716) may fail a task
        whose trigger fires within seconds of deferring: the worker's exit is reported late,
        as a success of the same try. ``timedelta(0)`` turns both off.
    :param lease: how long an attempt trains on unwatched (a failed try, a dead triggerer):
        past it, with nobody renewing it, the attempt checkpoints and stops by itself; the
        next try resumes from there. Default: the provider setting ``[spot_training]
        default_lease``, else 3 ``decision_interval``, at least 5 minutes.
    :param aws_conn_id: the Airflow AWS connection the operator reads an ``s3://``
        ``checkpoint_uri`` with (``None``: boto3's own environment of the worker). The training
        process writes with its own credentials: the worker's environment for the local
        backend, the pod's (a service-account role, ``env_from_secrets``) on Kubernetes.
    """

    template_fields: Sequence[str] = TEMPLATE_FIELDS
    ui_color = "#ffd8a8"
    returns_result = False  # the attempt returns a value for the XCom (@task.spot_training)
    operator_extra_links = (SpotTimelineLink(),)

    def __init__(
        self,
        *,
        command: str | list[str] | None = None,
        checkpoint_uri: str | os.PathLike[str] | None = None,
        expected_compute: timedelta | None = None,
        total_steps: int | None = None,
        deadline: datetime | timedelta | str | None = None,
        changeover: timedelta = timedelta(minutes=5),
        policy: str = "deadline_aware",
        spot_price: float | None = None,
        on_demand_price: float | None = None,
        max_preemptions: int | None = None,
        on_preemption_budget: str = "on_demand",
        max_failures: int = 2,
        backend: str | Backend | None = None,
        decision_interval: timedelta = timedelta(seconds=60),
        poll_interval: float = 5.0,
        deferrable: bool = True,
        min_deferral: timedelta = timedelta(seconds=30),
        lease: timedelta | None = None,
        aws_conn_id: str | None = None,
        nodes: int | None = None,
        on_demand_acquire: timedelta = timedelta(0),
        **kwargs: Any,
    ) -> None:
        if kwargs.get("retry_policy") is None:  # (a mapped instance is built with None)
            kwargs["retry_policy"] = default_retry_policy()
        if "retries" not in kwargs and "retries" not in (kwargs.get("default_args") or {}):
            kwargs["retries"] = DEFAULT_RETRIES  # spent on the orchestration's errors only
        super().__init__(**kwargs)
        self.command = argv_of(command)
        self.checkpoint_uri = (
            os.fspath(checkpoint_uri) if isinstance(checkpoint_uri, os.PathLike) else checkpoint_uri
        )
        self.expected_compute = expected_compute
        self.total_steps = total_steps
        self.deadline = deadline
        self.changeover = changeover
        self.policy = policy
        # the reference prices when not given (kept apart: a Kubernetes job warns of them)
        self.spot_price, self.on_demand_price, self.prices_given = prices_or_reference(
            spot_price, on_demand_price
        )
        self.max_preemptions = max_preemptions
        self.on_preemption_budget = on_preemption_budget
        self.max_failures = max_failures
        self.backend = backend_or_default(backend)
        self.decision_interval = decision_interval
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.min_deferral = min_deferral
        self.lease = lease
        self.aws_conn_id = aws_conn_id
        self.nodes = nodes
        self.on_demand_acquire = on_demand_acquire
        self._validate_static()

    # -- validation -------------------------------------------------------------------------
    def _validate_static(self) -> None:
        """Everything checkable when the DAG is parsed, without disk, network or clock."""
        check_arguments({name: getattr(self, name) for name in ARGUMENTS})

    def _check_rendered(self) -> None:
        """The templated fields once rendered (or resolved from XCom), checked as at parse
        time: a native-rendered command's numbers become strings; a number or None as the
        deadline, a blank command or a relative path for Kubernetes fail here, naming them."""
        self.command = argv_of(self.command)
        if isinstance(self.checkpoint_uri, os.PathLike):
            self.checkpoint_uri = os.fspath(self.checkpoint_uri)
        names = (*self.template_fields, "expected_compute", "changeover", "backend")
        check_arguments({name: getattr(self, name) for name in names}, partial=True)
        check_local_root(str(self.checkpoint_uri))  # on every try: a resumed job's too

    def _resolve_deadline(self, started_at: float) -> float:
        """The deadline as wall-clock seconds, once templates are rendered (task start)."""
        assert self.expected_compute is not None  # validated before
        return resolve_deadline(
            self.deadline,
            started_at,
            self.expected_compute,
            self.changeover,
            self.decision_interval,
            self.log,
        )

    # -- Airflow entry points ---------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        self._check_rendered()
        store = context["task_state_store"]
        raw: Any = store.get(STATE_KEY)
        from airflow_spot.jobstate import JobState

        if raw and not raw.get("finished") and not raw.get("failed"):
            from airflow_spot.operators.start import resumed_state

            state = resumed_state(raw, context["ti"].try_number, time.time(), self.log)
        elif raw and raw.get("finished"):  # a later try: the same job (and model event) again
            from airflow_spot.operators.finish import report_again
            from airflow_spot.operators.start import finished_again

            store.set(STATE_KEY, report_again(context, raw, self.checkpoint_store(), self))
            return finished_again(raw, str(self.checkpoint_uri), self.log)
        else:
            # a bad deadline fails before a location is claimed or a failed job set aside
            self._resolve_deadline(time.time())
            if raw and raw.get("failed"):  # cleared after failing for good: a new job
                from airflow_spot.operators.start import set_aside_failed_job

                set_aside_failed_job(
                    store, STATE_KEY, JobState.from_dict(raw), self._backend(), self.log
                )
                state = self._new_state(time.time())
                return self._run_turns(context, state, None, False)
            from airflow_spot.operators.location import claim_store

            claim_store(self.checkpoint_store(), context["ti"], self.checkpoint_uri, self)
            state = self._new_state(time.time())
        return self._run_turns(context, state, None)

    def checkpoint_store(self) -> Any:
        """The store of the rendered ``checkpoint_uri``, through ``aws_conn_id`` for S3."""
        from airflow_spot.checkpoint.stores import open_store
        from airflow_spot.hooks.conditions import s3_client_for

        uri = str(self.checkpoint_uri)
        return open_store(uri, s3_client=s3_client_for(uri, self.aws_conn_id))

    def resume(self, context: Context, event: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        from airflow_spot.jobstate import JobState
        from airflow_spot.triggers.events import SpotEvent

        parsed = SpotEvent.from_payload(event)
        raw: Any = context["task_state_store"].get(STATE_KEY)
        if not raw:
            raise BackendError(
                "the job's state is missing from the task state store; cannot resume safely"
            )
        return self._run_turns(context, JobState.from_dict(raw), parsed)

    def resume_execution(
        self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context
    ) -> Any:
        """A trigger that failed or timed out fails the try the way any error does (the live
        attempt is kept for the next try, or stopped and the job marked failed on the last);
        Airflow's default would leave the attempt running unwatched."""
        if next_method != TRIGGER_FAIL:
            return super().resume_execution(next_method, next_kwargs, context)
        from airflow.sdk.exceptions import AirflowTaskTimeout, TaskDeferralTimeout

        from airflow_spot.jobstate import JobState

        raw: Any = context["task_state_store"].get(STATE_KEY)
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except Exception as e:
            if not raw or raw.get("finished") or raw.get("failed"):
                raise
            state = JobState.from_dict(raw)
            err: BaseException = e
            if isinstance(e, TaskDeferralTimeout):
                if not self._past_execution_timeout(state, time.time()):
                    # the deferral outlived the deadline (was the triggerer down?): look now;
                    # finished work ends the job (late), work left fails it as infeasible
                    from airflow_spot.triggers.events import EventKind, SpotEvent

                    self.log.warning("The trigger timed out: looking at the attempt here.")
                    return self._run_turns(context, state, SpotEvent(EventKind.TICK, time.time()))
                err = AirflowTaskTimeout(
                    f"execution_timeout ({self.execution_timeout}) reached while deferred"
                )
            self._fail_try(context, state, err)
            if err is e:
                raise
            raise err from e

    def _past_execution_timeout(self, state: JobState, now: float) -> bool:
        if self.execution_timeout is None or state.try_started_at is None:
            return False
        return now >= state.try_started_at + self.execution_timeout.total_seconds() - 1.0

    def _fail_try(self, context: Context, state: JobState, error: BaseException) -> None:
        """This try fails with ``error``. A passing error with tries left keeps the live
        attempt for the next try (it re-attaches); otherwise the task fails for good: stop what
        runs and keep the record."""
        store = context["task_state_store"]
        if not isinstance(error, (ConfigError, BudgetExhausted)) and tries_left(context):
            store.set(STATE_KEY, state.to_dict())
            return
        turn = self.turn(state, context)
        try:
            turn.stop_for_good()
        except Exception as stop:  # noqa: BLE001 - the original error is the one to raise
            self.log.error("Could not stop the live attempt: %s", stop)
        state.failed = {"error": type(error).__name__, "message": str(error)}
        turn.report.failed_for_good(time.time())
        store.set(STATE_KEY, state.to_dict())

    def on_kill(self) -> None:
        """Stop the live attempt (runs when the worker is told to kill the task)."""
        handle = getattr(self, "_live_handle", None)
        if handle is not None:
            self.log.warning("Task killed: cancelling attempt at %s.", handle.run_dir or handle.pod)
            from airflow_spot.backends.base import stop_and_release

            stop_and_release(self._backend(), handle)

    # -- the loop ---------------------------------------------------------------------------
    def _new_state(self, now: float) -> JobState:
        """A new job's state, its deadline resolved now."""
        from airflow_spot.operators.start import new_state

        return new_state(
            self._backend(),
            now,
            self._resolve_deadline(now),
            self.total_steps,
            self.execution_timeout,
            {"spot_price": self.spot_price, "on_demand_price": self.on_demand_price},
            self.prices_given,
            self.log,
        )

    def _backend(self) -> Backend:
        from airflow_spot.backends.local.backend import LocalBackend

        if isinstance(self.backend, str):  # "local", checked at parse time
            return LocalBackend()
        return self.backend

    # -- what the loop is handed ------------------------------------------------------------
    def job_args(self) -> JobArgs:
        """The rendered arguments, as values (the loop never sees this operator)."""
        from airflow_spot.operators.job import JobArgs

        return JobArgs.of(self)

    def identity(self, context: Context) -> TaskIdentity:
        from airflow_spot.operators.job import TaskIdentity

        return TaskIdentity.of(context["ti"])

    def turn(self, state: JobState, context: Context) -> Turn:
        """The control loop's turn over ``state``, with this task's arguments and identity."""
        from airflow_spot.checkpoint.checkpoints import Checkpoints
        from airflow_spot.operators.turn import Turn

        return Turn(
            self.job_args(),
            self.identity(context),
            self._backend(),
            state,
            Checkpoints.watching(self.checkpoint_store()),
        )

    # -- the loop ---------------------------------------------------------------------------
    def _run_turns(
        self, context: Context, state: JobState, event: Any, recover: bool = True
    ) -> Any:
        """Turn after turn until the job is done: between turns, defer to the triggerer (a
        long wait) or wait here (a short one, or ``deferrable=False``). A try first adopts
        attempts a dead worker launched unrecorded (not for a job replacing one set aside)."""
        from airflow.sdk.exceptions import AirflowTaskTimeout

        from airflow_spot.operators.finish import job_done
        from airflow_spot.operators.start import defer_timeout
        from airflow_spot.operators.summary import xcom_summary

        turn = self.turn(state, context)
        store = context["task_state_store"]
        # saved before every launch: the next try of a runner killed right after one adopts
        # the attempt (``recover``), its number and the job's clock kept (issue 34, finding 5)
        turn.attempt.before_launch = lambda: store.set(STATE_KEY, state.to_dict())
        if event is None and recover and turn.attempt.recover(time.time()):
            store.set(STATE_KEY, state.to_dict())
        while True:
            try:  # (TaskDeferred is a BaseException: deferring passes through)
                result = turn.advance(time.time(), event)
                if result.done:  # the job's end as Airflow sees it: result, Asset events
                    job_done(context, state, result.summary, turn.checkpoints.store, self)
                store.set(STATE_KEY, state.to_dict())
                if result.done:
                    return xcom_summary(result.summary or {})
                self._live_handle = state.live.handle if state.live else None
                now = time.time()
                trigger = self._trigger(
                    state, result.wake_at, turn.capacity.cooling_until(now), now
                )
                if self.deferrable and result.wake_at - now >= self.min_deferral.total_seconds():
                    self.defer(
                        trigger=trigger,
                        method_name="resume",
                        timeout=timedelta(
                            seconds=defer_timeout(state, now, self.execution_timeout)
                        ),
                    )
                event = self._wait_here(trigger.watch)
            except (Exception, AirflowTaskTimeout) as e:  # the timeout is a BaseException
                self._fail_try(context, state, e)
                raise

    def _wait_here(self, watch: Any) -> Any:
        """Synchronous mode: poll in the worker until something happens."""
        while True:
            ev = watch.poll_once()
            if ev is not None:
                return ev
            time.sleep(self.poll_interval)

    def _trigger(self, state: JobState, wake_at: float, cooling: dict[str, float], now: float):
        """The attempt's trigger (its ``watch`` is what the worker polls when it waits here)."""
        from airflow_spot.triggers.attempt import attempt_trigger

        return attempt_trigger(
            self._backend().to_dict(),
            state.live.handle if state.live else None,
            market=state.market,
            spot_was=state.spot_last if state.observe == "oracle" else None,  # cluster: no peeking
            wake_at=wake_at,
            poll_interval=self.poll_interval,
            cooling=cooling,
            hold_until=now + min(MAX_HOLD_S, self.min_deferral.total_seconds() / 3),
            issued_at=now,  # the times above are on this worker's clock: the trigger keeps to it
        )


SpotTrainingOperator.partial = CheckedPartialDescriptor()  # type: ignore[assignment,method-assign]
