"""``SpotTrainingOperator``: one task instance runs a whole training job on spot capacity.

``decide -> launch -> defer (trigger) -> wake on a typed event -> record -> decide again``,
until the work is done. The same :meth:`Policy.decide` as the simulator picks spot,
on-demand or wait at every wake. Preemptions spend the preemption budget, application
failures the failure budget; Airflow's ``retries`` stay for failures of the orchestration
itself. State lives in the task instance's ``task_state_store``, so it survives deferrals,
a killed worker and retries: a new try re-attaches to a live attempt and never adopts a
dead one.

Importing this module is cheap (no trigger, numpy, Kubernetes or boto3): Airflow parses DAG
files constantly.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import numbers
import os
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_spot.checkpoint.stores import validate_uri
from airflow_spot.exceptions import (
    BackendError,
    BudgetExhausted,
    ConfigError,
    finite_number,
)
from airflow_spot.operators.links import SpotTimelineLink
from airflow_spot.policy import get_policy
from airflow_spot.policy.model import REFERENCE_ON_DEMAND_PRICE, REFERENCE_SPOT_PRICE

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_spot.backends.local.backend import LocalBackend
    from airflow_spot.jobstate import JobState

log = logging.getLogger(__name__)
STATE_KEY = "airflow_spot_job"
TRIGGER_FAIL = "__fail__"  # Airflow's next_method when a trigger failed or timed out
PREEMPTION_ACTIONS = ("on_demand", "fail")


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
    :param backend: ``"local"`` (the embedded default) or a backend object such as
        :class:`airflow_spot.backends.local.LocalBackend`.
    :param decision_interval: how often to decide again when nothing happens.
    :param poll_interval: seconds between looks at the attempt (in the trigger while deferred,
        in the worker otherwise), and before looking again while a reclaim verdict is due.
    :param deferrable: wait in the triggerer (default) or in the worker.
    :param min_deferral: waits shorter than this are spent in the worker even when
        ``deferrable``, and a deferred task resumes no sooner than ``min(10 s, min_deferral /
        3)`` after deferring. Airflow (3.3, apache/airflow#71580 and #72716) may fail a task
        whose trigger fires within seconds of deferring: the worker's exit is reported late,
        as a success of the same try. ``timedelta(0)`` turns both off.
    :param aws_conn_id: the Airflow AWS connection the operator reads an ``s3://``
        ``checkpoint_uri`` with (``None``: boto3's own environment of the worker). The training
        process writes with its own credentials: the worker's environment for the local
        backend, the pod's (a service-account role, ``env_from_secrets``) on Kubernetes.
    """

    template_fields: Sequence[str] = ("command", "checkpoint_uri", "deadline")
    ui_color = "#ffd8a8"
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
        backend: str | LocalBackend = "local",
        decision_interval: timedelta = timedelta(seconds=60),
        poll_interval: float = 5.0,
        deferrable: bool = True,
        min_deferral: timedelta = timedelta(seconds=30),
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if "retry_policy" not in kwargs:
            kwargs["retry_policy"] = default_retry_policy()
        super().__init__(**kwargs)
        self.command = _argv(command)
        self.checkpoint_uri = (
            os.fspath(checkpoint_uri) if isinstance(checkpoint_uri, os.PathLike) else checkpoint_uri
        )
        self.expected_compute = expected_compute
        self.total_steps = total_steps
        self.deadline = deadline
        self.changeover = changeover
        self.policy = policy
        # the reference prices when not given (kept apart: a Kubernetes job warns of them)
        self.prices_given = tuple(
            name
            for name, v in (("spot_price", spot_price), ("on_demand_price", on_demand_price))
            if v is not None
        )
        self.spot_price = REFERENCE_SPOT_PRICE if spot_price is None else spot_price
        self.on_demand_price = (
            REFERENCE_ON_DEMAND_PRICE if on_demand_price is None else on_demand_price
        )
        self.max_preemptions = max_preemptions
        self.on_preemption_budget = on_preemption_budget
        self.max_failures = max_failures
        self.backend = backend
        self.decision_interval = decision_interval
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.min_deferral = min_deferral
        self.aws_conn_id = aws_conn_id
        self._validate_static()

    # -- validation -------------------------------------------------------------------------
    def _validate_static(self) -> None:
        """Everything checkable when the DAG is parsed, without disk, network or clock."""
        check_arguments({name: getattr(self, name) for name in ARGUMENTS})

    def _check_rendered(self) -> None:
        """The templated fields once rendered (or resolved from XCom), checked as at parse
        time: a native-rendered command's numbers become strings; a number or None as the
        deadline, a blank command or a relative path for Kubernetes fail here, naming them."""
        self.command = _argv(self.command)
        if isinstance(self.checkpoint_uri, os.PathLike):
            self.checkpoint_uri = os.fspath(self.checkpoint_uri)
        names = (*self.template_fields, "expected_compute", "changeover", "backend")
        check_arguments({name: getattr(self, name) for name in names}, partial=True)

    def _check_deadline_span(self, span: timedelta) -> None:
        """When the task starts: the deadline must leave room for the work; a decision
        interval too coarse for the slack left only costs money, so it is a warning here (a
        deadline known at parse time was checked then)."""
        assert self.expected_compute is not None  # validated before
        check_span(span, self.expected_compute, self.changeover)
        try:
            check_decision_interval(
                self.decision_interval, span - self.expected_compute - self.changeover
            )
        except ConfigError as e:
            self.log.warning("%s", e)

    def _resolve_deadline(self, started_at: float) -> float:
        """The deadline as wall-clock seconds, once templates are rendered (task start)."""
        dl = self.deadline
        if isinstance(dl, str):
            dl = _parse_deadline(dl)
        if isinstance(dl, timedelta):
            self._check_deadline_span(dl)
            return started_at + dl.total_seconds()
        assert isinstance(dl, datetime)
        at = dl.timestamp()
        if at <= started_at:
            raise ConfigError(
                "deadline", f"{dl.isoformat()} is already in the past; give a later deadline"
            )
        self._check_deadline_span(timedelta(seconds=at - started_at))
        return at

    # -- Airflow entry points ---------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        self._check_rendered()
        store = context["task_state_store"]
        raw: Any = store.get(STATE_KEY)
        from airflow_spot.jobstate import JobState

        if raw and not raw.get("finished") and not raw.get("failed"):
            state = JobState.from_dict(raw)
            state.infra_base = state.infra_disruptions  # the limit is per try
            state.try_started_at = time.time()
            self.log.info(
                "Resuming job state from try %s: %d attempts so far.",
                context["ti"].try_number,
                len(state.attempts),
            )
        elif raw and raw.get("finished"):
            # this task instance already finished its job (retried or cleared after success):
            # the checkpoint holds all the work, so report that job again rather than a new
            # one that "trains" nothing at 100 % savings
            self.log.info(
                "This task instance already finished its job (checkpoint %s); returning its "
                "summary. To train again, delete the checkpoints under %s or template "
                "checkpoint_uri per run.",
                (raw["finished"].get("final_checkpoint") or {}).get("uri"),
                self.checkpoint_uri,
            )
            from airflow_spot.operators.controller import xcom_summary

            return xcom_summary(
                {
                    **raw["finished"],
                    "decisions": raw.get("decisions") or [],
                    "decisions_dropped": raw.get("decisions_dropped", 0),
                }
            )
        else:
            if raw and raw.get("failed"):  # cleared after failing for good: a new job
                self._retire(store, JobState.from_dict(raw))
            else:
                self._check_earlier_checkpoints(context)
            state = self._new_state(time.time())
        return self._step(context, state, None)

    def _check_earlier_checkpoints(self, context: Context) -> None:
        """A new job whose checkpoint_uri already holds work from before it (a URI not
        templated per run): complete work is an error (nothing would be trained, and the run
        would report 100 % savings); partial work is resumed, with a warning. Another map
        index of this task in this run training into the same location is an error (each
        would resume from the other's checkpoints)."""
        from airflow_spot.checkpoint.manifest import Checkpoints

        ti = context["ti"]
        me = {k: getattr(ti, k, None) for k in ("dag_id", "task_id", "run_id", "map_index")}
        mapped = isinstance(me["map_index"], int) and me["map_index"] >= 0
        fix = (
            "template it per map index, e.g. '.../{{ run_id }}/{{ ti.map_index }}'"
            if mapped
            else "template it per run (e.g. '.../{{ ds }}' or '.../{{ run_id }}')"
        )
        ckpts = Checkpoints.watching(self.checkpoint_store())
        # one record per task and run, claimed in one conditional write: of two map indexes
        # starting together exactly one gets it, whatever earlier runs left here
        run = hashlib.sha1(f"{me['dag_id']}/{me['task_id']}/{me['run_id']}".encode())
        claim = f"job-owner-{run.hexdigest()[:16]}.json"
        first = ckpts.claim(me, claim)
        if first is not None and first.get("map_index") != me["map_index"]:
            raise ConfigError(
                "checkpoint_uri",
                f"{self.checkpoint_uri} is already used by map index {first.get('map_index')} "
                f"of this task in this run; mapped instances each need their own location: "
                f"{fix}",
            )
        # the last task instance that trained here (recorded in one conditional write: of two
        # jobs starting together, the second sees the first)
        prev = ckpts.claim(me)
        theirs = {k: (prev or {}).get(k) for k in me}
        other = prev is not None and theirs != me
        if other and (theirs["dag_id"], theirs["task_id"]) != (me["dag_id"], me["task_id"]):
            fix = "give each task its own location, e.g. '.../{{ ti.task_id }}/{{ run_id }}'"
        who = _ti_name(theirs)
        live = _ti_state(ti, theirs) if other else None
        if live in LIVE_TI_STATES:
            if first is None:  # this run's claim, just made: take it back
                ckpts.store.delete(claim)
            raise ConfigError(
                "checkpoint_uri",
                f"{self.checkpoint_uri} is in use by {who}, which is {live}: two jobs would "
                f"train into and resume from each other's checkpoints; {fix}, or start this one "
                "after that task instance ends (nothing was changed)",
            )
        m = ckpts.latest_manifest()
        if m is not None and (self.total_steps or m.total_steps or 0) <= m.step:
            m = ckpts.latest_valid()  # complete work counts only if its files are whole
        if m is not None:
            total = self.total_steps or m.total_steps
            saved = datetime.fromtimestamp(m.created, UTC).isoformat(timespec="seconds")
            by = f" by {who}" if other else ""
            if total and m.step >= total:
                raise ConfigError(
                    "checkpoint_uri",
                    f"{self.checkpoint_uri} already holds a complete checkpoint (step {m.step} "
                    f"of {total}, saved {saved}{by}) from before this task instance started, so "
                    f"there is nothing to train; {fix} or delete those checkpoints to train "
                    "again (nothing was deleted)",
                )
            self.log.warning(
                "checkpoint_uri %s already holds step %d of %s (saved %s%s) from before this "
                "task instance started: resuming from it. To start afresh, %s.",
                self.checkpoint_uri,
                m.step,
                total,
                saved,
                by,
                fix,
            )
        if other:
            ckpts.set_owner(me)

    def checkpoint_store(self) -> Any:
        """The store of the rendered ``checkpoint_uri``, through ``aws_conn_id`` for S3."""
        from airflow_spot.checkpoint.stores import open_store

        uri = str(self.checkpoint_uri)
        client = None
        if uri.startswith("s3://") and self.aws_conn_id:
            from airflow_spot.hooks.aws import SpotMarketHook

            client = SpotMarketHook(aws_conn_id=self.aws_conn_id).s3_client()
        return open_store(uri, s3_client=client)

    def _retire(self, store: Any, old: JobState) -> None:
        """Before a new job replaces one that failed for good: stop any attempt it left
        running (or fail this try) and keep its record under ``<key>.previous``."""
        live = old.live
        if live is not None:
            from airflow_spot.backends.base import stop

            status = stop(self._backend(), live.handle)
            if not status.terminal:
                raise BackendError(
                    f"attempt {live.attempt} of the failed job still runs and could not be "
                    "stopped; stop it by hand or retry"
                )
        store.set(f"{STATE_KEY}.previous", old.to_dict())
        self.log.info(
            "The previous job failed for good (%s: %s); its record is kept under %s.previous. "
            "Starting afresh from the newest checkpoint with this task's current arguments.",
            (old.failed or {}).get("error"),
            (old.failed or {}).get("message"),
            STATE_KEY,
        )

    def resume(self, context: Context, event: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        from airflow_spot.jobstate import JobState
        from airflow_spot.triggers.events import SpotEvent

        parsed = SpotEvent.from_payload(event)
        raw: Any = context["task_state_store"].get(STATE_KEY)
        if not raw:
            raise BackendError(
                "the job's state is missing from the task state store; cannot resume safely"
            )
        return self._step(context, JobState.from_dict(raw), parsed)

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
                    return self._step(context, state, SpotEvent(EventKind.TICK, time.time()))
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
        from airflow_spot.operators.controller import Controller

        store = context["task_state_store"]
        if not isinstance(error, (ConfigError, BudgetExhausted)) and _tries_left(context):
            store.set(STATE_KEY, state.to_dict())
            return
        ctl = Controller(self, state, context)
        try:
            ctl.abandon()
        except Exception as stop:  # noqa: BLE001 - the original error is the one to raise
            self.log.error("Could not stop the live attempt: %s", stop)
        state.failed = {"error": type(error).__name__, "message": str(error)}
        ctl.failed_for_good(time.time())
        store.set(STATE_KEY, state.to_dict())

    def on_kill(self) -> None:
        """Stop the live attempt (runs when the worker is told to kill the task)."""
        handle = getattr(self, "_live_handle", None)
        if handle is not None:
            self.log.warning("Task killed: cancelling attempt at %s.", handle.get("run_dir"))
            from airflow_spot.backends.base import stop

            stop(self._backend(), handle)

    # -- the loop ---------------------------------------------------------------------------
    def _new_state(self, now: float) -> JobState:
        from airflow_spot.jobstate import JobState

        deadline_at = self._resolve_deadline(now)
        backend = self._backend()
        market = backend.market_spec(now)  # None where the real market is not replayed
        if market is None:  # real capacity: reference prices would make up the costs
            pools = getattr(backend, "pools", ())
            priced = bool(pools) and all(p.spot_price is not None or p.price_from for p in pools)
            missing = [
                f"{name} (${getattr(self, name)}/h)"
                for name in ("spot_price", "on_demand_price")
                if name not in self.prices_given and not (name == "spot_price" and priced)
            ]
            if missing:
                self.log.warning(
                    "%s not given: costs, savings and the policy's price ratio use the "
                    "reference p3.2xlarge prices, not your nodes'. Give the prices of your "
                    "instance type (or pools with spot_price / price_from).",
                    " and ".join(missing),
                )
        if self.execution_timeout is not None and self.execution_timeout.total_seconds() < (
            deadline_at - now
        ):
            self.log.warning(
                "execution_timeout (%s) is shorter than the time to the deadline (%s): Airflow "
                "stops each try after it (the attempt too). With retries left the next try "
                "resumes the job from its checkpoint; the deadline still bounds the whole job.",
                self.execution_timeout,
                timedelta(seconds=round(deadline_at - now)),
            )
        return JobState(
            started_at=now,
            deadline_at=deadline_at,
            time_scale=backend.time_scale,
            total_steps=self.total_steps,
            market=market.to_dict() if market is not None else None,
            try_started_at=now,
        )

    def _backend(self) -> Any:
        from airflow_spot.backends.local.backend import LocalBackend

        return LocalBackend() if isinstance(self.backend, str) else self.backend

    def _step(self, context: Context, state: JobState, event: Any) -> Any:
        from airflow.sdk.exceptions import AirflowTaskTimeout

        from airflow_spot.operators.controller import Controller, xcom_summary

        ctl = Controller(self, state, context)
        store = context["task_state_store"]
        while True:
            try:  # (TaskDeferred is a BaseException: deferring passes through)
                result = ctl.advance(event)
                store.set(STATE_KEY, state.to_dict())
                if result.done:
                    return xcom_summary(result.summary or {})
                self._live_handle = state.live.handle if state.live else None
                now = time.time()
                if self.deferrable and result.wake_at - now >= self.min_deferral.total_seconds():
                    hold = min(MAX_HOLD_S, self.min_deferral.total_seconds() / 3)
                    self.defer(
                        trigger=self._trigger(
                            state, result.wake_at, ctl.cooling_until(now), hold_until=now + hold
                        ),
                        method_name="resume",
                        timeout=timedelta(seconds=self._defer_timeout(state, now)),
                    )
                event = ctl.wait_here(result.wake_at)
            except (Exception, AirflowTaskTimeout) as e:  # the timeout is a BaseException
                self._fail_try(context, state, e)
                raise

    def _defer_timeout(self, state: JobState, now: float) -> float:
        """How long a deferral may last: an hour past the deadline, and no later than this
        try's ``execution_timeout`` (Airflow does not apply it while a task is deferred)."""
        from airflow.sdk.exceptions import AirflowTaskTimeout

        timeout = max(60.0, state.deadline_at - now + 3600)
        if self.execution_timeout is not None and state.try_started_at is not None:
            left = state.try_started_at + self.execution_timeout.total_seconds() - now
            if left <= 0:
                raise AirflowTaskTimeout(f"execution_timeout ({self.execution_timeout}) reached")
            timeout = min(timeout, left)
        return timeout

    def _trigger(
        self,
        state: JobState,
        wake_at: float,
        cooling: dict[str, float] | None = None,
        hold_until: float | None = None,
    ):
        backend = self._backend()
        handle = state.live.handle if state.live else None
        if getattr(backend, "name", "") == "kubernetes":
            from airflow_spot.triggers.local import KubernetesAttemptTrigger

            return KubernetesAttemptTrigger(
                handle=handle,
                backend=backend.to_dict(),
                wake_at=wake_at,
                poll_interval=self.poll_interval,
                hold_until=hold_until,
            )
        from airflow_spot.triggers.local import LocalAttemptTrigger

        return LocalAttemptTrigger(
            handle=handle,
            market=state.market,
            spot_was=state.spot_last,
            wake_at=wake_at,
            poll_interval=self.poll_interval,
            cooling=cooling or None,
            hold_until=hold_until,
        )


# the arguments checked at parse time (and, for partial(), those given to it)
ARGUMENTS = (
    "command",
    "checkpoint_uri",
    "expected_compute",
    "total_steps",
    "deadline",
    "changeover",
    "policy",
    "spot_price",
    "on_demand_price",
    "max_preemptions",
    "on_preemption_budget",
    "max_failures",
    "backend",
    "decision_interval",
    "poll_interval",
    "min_deferral",
    "aws_conn_id",
)
REQUIRED = {
    "command": "give the training command, e.g. ['python', 'train.py'] or 'python train.py'",
    "checkpoint_uri": "give where checkpoints live: a path, file:///path or s3://bucket/prefix",
    "deadline": "give a deadline: a datetime, a timedelta from the task's start, or '6h'",
}
BACKEND_METHODS = ("launch", "status", "cancel", "market_spec", "to_dict")
MIN_DECISION_INTERVAL = timedelta(seconds=0.1)
MIN_POLL_INTERVAL = 0.01
MAX_HOLD_S = 10.0  # a deferred task resumes no sooner (see min_deferral)


def check_arguments(values: dict[str, Any], *, partial: bool = False) -> None:
    """Check the operator's arguments that are present in ``values``, each naming its field.

    Values resolved later (a Jinja template, an ``XComArg``) are checked when the task starts.
    With ``partial`` (``SpotTrainingOperator.partial(...)``), a missing argument may still come
    from ``expand()`` and is not an error.
    """
    v = {k: x for k, x in values.items() if not _later(k, x)}
    for name, fix in REQUIRED.items():
        if name in values and not values[name] and not _later(name, values[name]):
            raise ConfigError(name, fix)
        if not partial and name not in values:
            raise ConfigError(name, fix)
    if "command" in v:
        _check_command(v["command"])
    uri = v.get("checkpoint_uri")
    if uri is not None:
        if not isinstance(uri, str):
            raise ConfigError(
                "checkpoint_uri", f"must be a string (path or URI), got {type(uri).__name__}"
            )
        validate_uri(uri)
    if "expected_compute" in v and not _positive_td(v["expected_compute"]):
        raise ConfigError(
            "expected_compute",
            f"must be a positive timedelta (compute the whole job needs), got {v['expected_compute']!r}",
        )
    steps = v.get("total_steps")
    if steps is not None and (not _integer(steps) or steps < 1):
        raise ConfigError("total_steps", f"must be a positive integer or None, got {steps!r}")
    if "changeover" in v and not (
        isinstance(v["changeover"], timedelta) and v["changeover"] >= timedelta(0)
    ):
        raise ConfigError("changeover", f"must be a timedelta >= 0, got {v['changeover']!r}")
    if "policy" in v:
        if not isinstance(v["policy"], str):
            raise ConfigError(
                "policy",
                f"must be a policy name such as 'deadline_aware', got {v['policy']!r}",
            )
        get_policy(v["policy"])
    for name in ("max_preemptions", "max_failures"):
        n = v.get(name)
        if n is not None and (not _integer(n) or n < 0):
            raise ConfigError(
                name,
                f"must be an integer >= 0{' or None' if name == 'max_preemptions' else ''}, got {n!r}",
            )
        if name == "max_failures" and name in v and n is None:
            raise ConfigError(name, "must be an integer >= 0, got None")
    if "on_preemption_budget" in v and v["on_preemption_budget"] not in PREEMPTION_ACTIONS:
        raise ConfigError(
            "on_preemption_budget",
            f"must be one of {PREEMPTION_ACTIONS}, got {v['on_preemption_budget']!r}",
        )
    for name in ("spot_price", "on_demand_price"):
        if name not in v:
            continue
        price = v[name]
        if not finite_number(price) or price < 0 or (name == "on_demand_price" and price == 0):
            raise ConfigError(
                name,
                f"must be a price per hour {'> 0' if name == 'on_demand_price' else '>= 0'}, got {price!r}",
            )
    if "decision_interval" in v:
        di = v["decision_interval"]
        if not isinstance(di, timedelta) or di < MIN_DECISION_INTERVAL:
            raise ConfigError(
                "decision_interval",
                f"must be a timedelta of at least {MIN_DECISION_INTERVAL.total_seconds():g} s "
                f"(how often to decide again), got {di!r}",
            )
    if "poll_interval" in v:
        pi = v["poll_interval"]
        if not finite_number(pi) or pi < MIN_POLL_INTERVAL:
            raise ConfigError(
                "poll_interval",
                f"must be a number of seconds >= {MIN_POLL_INTERVAL:g}, got {pi!r}",
            )
    if "min_deferral" in v:
        md = v["min_deferral"]
        if not isinstance(md, timedelta) or md < timedelta(0):
            raise ConfigError(
                "min_deferral",
                f"must be a timedelta >= 0 (shorter waits stay in the worker), got {md!r}",
            )
    conn = v.get("aws_conn_id")
    if conn is not None and (not isinstance(conn, str) or not conn.strip()):
        raise ConfigError(
            "aws_conn_id", f"must be an Airflow connection id (a string) or None, got {conn!r}"
        )
    if "backend" in v:
        _check_backend(v["backend"])
        raw_uri = values.get("checkpoint_uri")
        if getattr(v["backend"], "name", "") == "kubernetes" and isinstance(raw_uri, str):
            literal = re.split(r"\{[{%#]", raw_uri, maxsplit=1)[0]  # before any template
            if literal and "://" not in raw_uri and not literal.startswith("/"):
                raise ConfigError(
                    "checkpoint_uri",
                    f"{raw_uri!r} is a relative path: the worker and the pod would read "
                    "different places; use s3://bucket/prefix, or an absolute path on a volume "
                    "both mount",
                )
    if "deadline" in v:
        _check_deadline(v["deadline"], v.get("expected_compute"), v.get("changeover"), v)


def _check_command(cmd: Any) -> None:
    if isinstance(cmd, str):
        import shlex

        try:
            parts = shlex.split(cmd)
        except ValueError as e:
            raise ConfigError(
                "command", f"cannot be split like a shell would ({e}): {cmd!r}"
            ) from None
        if not parts:
            raise ConfigError("command", f"is blank; {REQUIRED['command']}")
        return
    if not isinstance(cmd, (list, tuple)):
        raise ConfigError(
            "command", f"must be a list of strings or a string, got {type(cmd).__name__}"
        )
    for i, part in enumerate(cmd):
        if not isinstance(part, str) or not part:
            raise ConfigError(
                "command",
                f"item {i} is {part!r} ({type(part).__name__}); every item must be a non-empty "
                "string or a number",
            )


def _argv(command: Any) -> Any:
    """A command list with its numbers as strings (``--steps 100`` rendered natively, or
    built in Python, gives an int); anything else is left for the checks."""
    if isinstance(command, (list, tuple)):
        return [
            str(c) if isinstance(c, numbers.Real) and not isinstance(c, bool) else c
            for c in command
        ]
    return command


def _check_backend(backend: Any) -> None:
    if isinstance(backend, str):
        if backend != "local":
            raise ConfigError(
                "backend",
                f"unknown backend {backend!r}; use 'local', LocalBackend(...) or KubernetesBackend(image=...)",
            )
        return
    if isinstance(backend, type):
        raise ConfigError(
            "backend",
            f"{backend.__name__} is a class: give an instance, e.g. {backend.__name__}(...)",
        )
    missing = [m for m in BACKEND_METHODS if not callable(getattr(backend, m, None))]
    if missing or not finite_number(getattr(backend, "time_scale", None)):
        raise ConfigError(
            "backend",
            f"{type(backend).__name__} is not a backend (no {', '.join(missing) or 'time_scale'}); "
            "use 'local', LocalBackend(...) or KubernetesBackend(image=...)",
        )


def _check_deadline(dl: Any, work: Any, changeover: Any, given: dict[str, Any]) -> None:
    """A deadline's type, and its span where it does not depend on the start (parse time)."""
    if isinstance(dl, str):
        dl = _parse_deadline(dl)
    if isinstance(dl, datetime):
        if dl.tzinfo is None:
            raise ConfigError(
                "deadline",
                "a datetime deadline must be timezone-aware (e.g. pendulum or tzinfo=timezone.utc)",
            )
        return
    if not isinstance(dl, timedelta):
        raise ConfigError(
            "deadline",
            f"must be a datetime, a timedelta or a string, got {type(dl).__name__}",
        )
    if _positive_td(work) and isinstance(changeover, timedelta):
        check_span(dl, work, changeover)
        if "decision_interval" in given:
            check_decision_interval(given["decision_interval"], dl - work - changeover)


def check_span(span: timedelta, work: timedelta, changeover: timedelta) -> None:
    """The deadline leaves room for the work and one changeover."""
    if span <= timedelta(0) or span < work + changeover:
        raise ConfigError(
            "deadline",
            f"{_h(span)} from the start is shorter than the work ({_h(work)}) plus one "
            f"changeover ({_h(changeover)}); move the deadline later or cut the work",
        )


def check_decision_interval(interval: timedelta, slack: timedelta) -> None:
    """Decide often enough to use the slack: the policy keeps a look's worth of margin, so an
    interval near the slack sends the whole job to on-demand (no error when the slack is 0:
    on-demand is then the only way anyway)."""
    if slack > timedelta(0) and interval > slack / 4:
        raise ConfigError(
            "decision_interval",
            f"{_h(interval)} is more than a quarter of the slack ({_h(slack)} between the work "
            f"plus one changeover and the deadline): the policy could not wait for spot and "
            f"would run on-demand; use at most {(slack / 4).total_seconds():.0f} s (intervals are wall-clock, "
            "also on a LocalBackend with a time_scale)",
        )


def _later(name: str, value: Any) -> bool:
    """Resolved when the task starts: a Jinja template or an XComArg in a templated field
    (Airflow resolves nothing else; an XComArg anywhere else is checked, and refused, now)."""
    from airflow.sdk.definitions._internal.mixins import ResolveMixin

    if name not in SpotTrainingOperator.template_fields:
        return False
    return _templated(value) or isinstance(value, ResolveMixin)


def _integer(n: Any) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def _positive_td(td: Any) -> bool:
    return isinstance(td, timedelta) and td > timedelta(0)


def _checked_partial(cls: type[SpotTrainingOperator], **kwargs: Any) -> Any:
    """As ``BaseOperator.partial``, but the arguments given here are checked now (at parse
    time), not first when a mapped instance runs."""
    from airflow.sdk.bases.operator import partial

    uri = kwargs.get("checkpoint_uri")
    if isinstance(uri, os.PathLike):
        kwargs["checkpoint_uri"] = os.fspath(uri)
    check_arguments(_partial_given(kwargs), partial=True)
    made = partial(cls, **kwargs)
    made._expand_called = True  # replaced by the checked one below (no "never mapped" warning)
    return _checked_expand_class()(
        operator_class=made.operator_class, kwargs=made.kwargs, params=made.params
    )


def _partial_given(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The operator's arguments among ``partial()``'s, as checked at parse time: a deadline
    shorter than the work alone is wrong whatever changeover ``expand()`` may bring."""
    given = {k: v for k, v in kwargs.items() if k in ARGUMENTS}
    given.setdefault("changeover", timedelta(0))
    return given


@functools.cache
def _checked_expand_class() -> type:
    """``OperatorPartial`` whose ``expand()`` checks literal values (each list item) at parse
    time as well, with what ``partial()`` was given (a mapped instance is only built when it
    runs). XComArgs and templates are checked when the task starts."""
    import attrs
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    @attrs.define(kw_only=True, repr=False)
    class CheckedPartial(OperatorPartial):
        def expand(self, **mapped: Any) -> Any:
            given = _partial_given(self.kwargs)
            for name, values in mapped.items():
                if name not in ARGUMENTS or not isinstance(values, (list, tuple)):
                    continue
                for i, value in enumerate(values):
                    try:
                        check_arguments({**given, name: value}, partial=True)
                    except ConfigError as e:
                        self._expand_called = True  # refused, not forgotten
                        msg = str(e).partition(": ")[2]
                        raise ConfigError(e.field, f"expand() item {i}: {msg}") from None
            return super().expand(**mapped)

    return CheckedPartial


class _Partial:
    """``SpotTrainingOperator.partial``: checked, and refused on a task (as Airflow's is)."""

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is not None:

            def partial(**kwargs: Any) -> Any:
                raise TypeError(
                    "partial can only be called on Operator classes, not Tasks themselves"
                )

            return partial
        return functools.partial(_checked_partial, cls)


SpotTrainingOperator.partial = _Partial()  # type: ignore[assignment,method-assign]


def _tries_left(context: Context) -> bool:
    """Whether Airflow will run this task again after this try fails."""
    ti = context["ti"]
    return int(getattr(ti, "try_number", 1)) <= int(getattr(ti, "max_tries", 0) or 0)


def default_retry_policy():
    """Fail fast on configuration errors and spent budgets; retry the orchestration's own errors."""
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule

    return ExceptionRetryPolicy(
        rules=[
            RetryRule(
                exception=[ConfigError, BudgetExhausted],
                action=RetryAction.FAIL,
                reason="configuration error or spent budget: retrying cannot help",
            ),
            RetryRule(
                exception=BackendError,
                action=RetryAction.RETRY,  # after the task's own retry_delay / backoff
                reason="backend error: retry and re-attach",
            ),
        ]
    )


def _templated(value: Any) -> bool:
    return isinstance(value, str) and any(m in value for m in ("{{", "{%", "{#"))


def _h(td: timedelta) -> str:
    secs = td.total_seconds()
    return f"{secs / 3600:.2f} h" if secs >= 360 else f"{secs:g} s"


def _parse_deadline(text: str) -> datetime | timedelta:
    from airflow_spot.cli import parse_hours

    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        if dt.tzinfo is None:  # as for a datetime given directly: never guess the zone
            raise ConfigError(
                "deadline",
                f"{text.strip()!r} has no timezone; add one, e.g. '{dt.isoformat()}+00:00'",
            )
        return dt
    if re.fullmatch(r"\s*[0-9.]+\s*", text):  # the CLI reads a bare number as hours; a DAG
        raise ConfigError(  # author may mean seconds: make them say
            "deadline",
            f"{text.strip()!r} has no unit; write e.g. '{text.strip()}h' or '{text.strip()}s'",
        )
    try:
        return timedelta(hours=parse_hours(text, "deadline"))
    except ConfigError:
        raise ConfigError(
            "deadline", f"{text!r} is neither an ISO datetime nor a duration like '6h'"
        ) from None


# task instance states in which a job may still train (or will again, on retry)
LIVE_TI_STATES = frozenset(
    {
        "running",
        "deferred",
        "queued",
        "scheduled",
        "up_for_retry",
        "up_for_reschedule",
        "restarting",
    }
)


def _ti_name(ti: dict[str, Any]) -> str:
    index = ti.get("map_index")
    mapped = f" [map index {index}]" if isinstance(index, int) and index >= 0 else ""
    return f"task {ti.get('dag_id')}.{ti.get('task_id')}{mapped} of run {ti.get('run_id')}"


def _ti_state(ti: Any, other: dict[str, Any]) -> str | None:
    """The state of another task instance, asked of Airflow (None when it cannot say: an old
    Airflow, a deleted run or DAG, no API server)."""
    get = getattr(ti, "get_task_states", None)
    if get is None or not other.get("dag_id") or not other.get("run_id"):
        return None
    index = other.get("map_index")
    try:
        states = get(dag_id=other["dag_id"], task_ids=[other["task_id"]], run_ids=[other["run_id"]])
    except Exception as e:  # noqa: BLE001 - unknown is not an error: the check is best effort
        log.debug("could not read the state of %s: %s", _ti_name(other), e)
        return None
    name = (
        other["task_id"]
        if not isinstance(index, int) or index < 0
        else f"{other['task_id']}_{index}"
    )
    state = (states or {}).get(other["run_id"], {}).get(name)
    return str(getattr(state, "value", state)) if state is not None else None
