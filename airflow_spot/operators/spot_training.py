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

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_spot.checkpoint.stores import validate_uri
from airflow_spot.exceptions import BackendError, BudgetExhausted, ConfigError
from airflow_spot.operators.links import SpotTimelineLink
from airflow_spot.policy import get_policy

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_spot.backends.local.backend import LocalBackend
    from airflow_spot.jobstate import JobState

log = logging.getLogger(__name__)
STATE_KEY = "airflow_spot_job"
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
    :param spot_price: spot price per hour (for the ledger and the policy).
    :param on_demand_price: on-demand price per hour.
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
    """

    template_fields: Sequence[str] = ("command", "checkpoint_uri", "deadline")
    ui_color = "#ffd8a8"
    operator_extra_links = (SpotTimelineLink(),)

    def __init__(
        self,
        *,
        command: str | list[str] | None = None,
        checkpoint_uri: str | None = None,
        expected_compute: timedelta | None = None,
        total_steps: int | None = None,
        deadline: datetime | timedelta | str | None = None,
        changeover: timedelta = timedelta(minutes=5),
        policy: str = "deadline_aware",
        spot_price: float = 0.9731,
        on_demand_price: float = 3.06,
        max_preemptions: int | None = None,
        on_preemption_budget: str = "on_demand",
        max_failures: int = 2,
        backend: str | LocalBackend = "local",
        decision_interval: timedelta = timedelta(seconds=60),
        poll_interval: float = 5.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        if "retry_policy" not in kwargs:
            kwargs["retry_policy"] = default_retry_policy()
        super().__init__(**kwargs)
        self.command = command
        self.checkpoint_uri = checkpoint_uri
        self.expected_compute = expected_compute
        self.total_steps = total_steps
        self.deadline = deadline
        self.changeover = changeover
        self.policy = policy
        self.spot_price = spot_price
        self.on_demand_price = on_demand_price
        self.max_preemptions = max_preemptions
        self.on_preemption_budget = on_preemption_budget
        self.max_failures = max_failures
        self.backend = backend
        self.decision_interval = decision_interval
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self._validate_static()

    # -- validation -------------------------------------------------------------------------
    def _validate_static(self) -> None:
        """Everything checkable when the DAG is parsed, without disk, network or clock."""
        if not self.command or (
            isinstance(self.command, (list, tuple))
            and not all(isinstance(c, str) and c for c in self.command)
        ):
            raise ConfigError(
                "command",
                "give the training command, e.g. ['python', 'train.py'] or 'python train.py'",
            )
        if not self.checkpoint_uri:
            raise ConfigError(
                "checkpoint_uri",
                "give where checkpoints live: a path, file:///path or s3://bucket/prefix",
            )
        if not _templated(self.checkpoint_uri):
            validate_uri(self.checkpoint_uri)
        if not isinstance(self.expected_compute, timedelta) or self.expected_compute <= timedelta(
            0
        ):
            raise ConfigError(
                "expected_compute",
                f"must be a positive timedelta (compute the whole job needs), got {self.expected_compute!r}",
            )
        if self.total_steps is not None and (
            not isinstance(self.total_steps, int) or self.total_steps < 1
        ):
            raise ConfigError(
                "total_steps", f"must be a positive integer or None, got {self.total_steps!r}"
            )
        if not isinstance(self.changeover, timedelta) or self.changeover < timedelta(0):
            raise ConfigError("changeover", f"must be a timedelta >= 0, got {self.changeover!r}")
        get_policy(self.policy)
        for name in ("max_preemptions", "max_failures"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(
                    name,
                    f"must be an integer >= 0{' or None' if name == 'max_preemptions' else ''}, got {v!r}",
                )
        if self.on_preemption_budget not in PREEMPTION_ACTIONS:
            raise ConfigError(
                "on_preemption_budget",
                f"must be one of {PREEMPTION_ACTIONS}, got {self.on_preemption_budget!r}",
            )
        for name in ("spot_price", "on_demand_price"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0 or (name == "on_demand_price" and v == 0):
                raise ConfigError(
                    name,
                    f"must be a price per hour {'> 0' if name == 'on_demand_price' else '>= 0'}, got {v!r}",
                )
        if not isinstance(self.decision_interval, timedelta) or self.decision_interval <= timedelta(
            0
        ):
            raise ConfigError("decision_interval", "must be a positive timedelta")
        if not (isinstance(self.poll_interval, (int, float)) and self.poll_interval > 0):
            raise ConfigError("poll_interval", f"must be > 0 seconds, got {self.poll_interval!r}")
        if isinstance(self.backend, str) and self.backend != "local":
            raise ConfigError(
                "backend",
                f"unknown backend {self.backend!r}; use 'local', LocalBackend(...) or KubernetesBackend(image=...)",
            )
        if self.deadline is None:
            raise ConfigError(
                "deadline",
                "give a deadline: a datetime, a timedelta from the task's start, or '6h'",
            )
        if isinstance(self.deadline, timedelta):
            self._check_deadline_span(self.deadline)
        elif isinstance(self.deadline, datetime) and self.deadline.tzinfo is None:
            raise ConfigError(
                "deadline",
                "a datetime deadline must be timezone-aware (e.g. pendulum or tzinfo=timezone.utc)",
            )
        elif not isinstance(self.deadline, (datetime, str)):
            raise ConfigError(
                "deadline",
                f"must be a datetime, a timedelta or a string, got {type(self.deadline).__name__}",
            )

    def _check_deadline_span(self, span: timedelta) -> None:
        assert self.expected_compute is not None  # validated before
        need = self.expected_compute + self.changeover
        if span <= timedelta(0) or span < need:
            raise ConfigError(
                "deadline",
                f"{_h(span)} from the start is shorter than the work ({_h(self.expected_compute)}) plus one "
                f"changeover ({_h(self.changeover)}); move the deadline later or cut the work",
            )

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
        store = context["task_state_store"]
        raw: Any = store.get(STATE_KEY)
        from airflow_spot.jobstate import JobState

        if raw and not raw.get("finished") and not raw.get("failed"):
            state = JobState.from_dict(raw)
            state.infra_base = state.infra_disruptions  # the limit is per try
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
            return raw["finished"]
        else:
            if raw and raw.get("failed"):  # cleared after failing for good: a new job
                self._retire(store, JobState.from_dict(raw))
            else:
                self._check_earlier_checkpoints()
            state = self._new_state(time.time())
        return self._step(context, state, None)

    def _check_earlier_checkpoints(self) -> None:
        """A new job whose checkpoint_uri already holds work from before it (a URI not
        templated per run): complete work is an error (nothing would be trained, and the run
        would report 100 % savings); partial work is resumed, with a warning."""
        from airflow_spot.checkpoint.manifest import Checkpoints
        from airflow_spot.checkpoint.stores import open_store

        m = Checkpoints(open_store(str(self.checkpoint_uri))).latest_manifest()
        if m is None:
            return
        total = self.total_steps or m.total_steps
        saved = datetime.fromtimestamp(m.created, timezone.utc).isoformat(timespec="seconds")
        if total and m.step >= total:
            raise ConfigError(
                "checkpoint_uri",
                f"{self.checkpoint_uri} already holds a complete checkpoint (step {m.step} of "
                f"{total}, saved {saved}) from before this task instance started, so there is "
                "nothing to train; template it per run (e.g. '.../{{ ds }}' or "
                "'.../{{ run_id }}') or delete those checkpoints to train again (nothing was "
                "deleted)",
            )
        self.log.warning(
            "checkpoint_uri %s already holds step %d of %s (saved %s) from before this task "
            "instance started: resuming from it. Template checkpoint_uri per run to start each "
            "run afresh.",
            self.checkpoint_uri,
            m.step,
            total,
            saved,
        )

    def _retire(self, store: Any, old: JobState) -> None:
        """Before a new job replaces one that failed for good: stop any attempt it left
        running (or fail this try) and keep its record under ``<key>.previous``."""
        live = old.live
        if live is not None:
            status = self._backend().cancel(live.handle)
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

    def on_kill(self) -> None:
        """Stop the live attempt (runs when the worker is told to kill the task)."""
        handle = getattr(self, "_live_handle", None)
        if handle is not None:
            self.log.warning("Task killed: cancelling attempt at %s.", handle.get("run_dir"))
            self._backend().cancel(handle)

    # -- the loop ---------------------------------------------------------------------------
    def _new_state(self, now: float) -> JobState:
        from airflow_spot.jobstate import JobState

        deadline_at = self._resolve_deadline(now)
        backend = self._backend()
        market = backend.market_spec(now)  # None where the real market is not replayed
        return JobState(
            started_at=now,
            deadline_at=deadline_at,
            time_scale=backend.time_scale,
            total_steps=self.total_steps,
            market=market.to_dict() if market is not None else None,
        )

    def _backend(self) -> Any:
        from airflow_spot.backends.local.backend import LocalBackend

        return LocalBackend() if isinstance(self.backend, str) else self.backend

    def _step(self, context: Context, state: JobState, event: Any) -> Any:
        from airflow_spot.operators.controller import Controller

        ctl = Controller(self, state, context)
        store = context["task_state_store"]
        while True:
            try:  # (TaskDeferred is a BaseException: deferring passes through)
                result = ctl.advance(event)
                store.set(STATE_KEY, state.to_dict())
                if result.done:
                    return result.summary
                self._live_handle = state.live.handle if state.live else None
                if self.deferrable:
                    self.defer(
                        trigger=self._trigger(
                            state, result.wake_at, ctl.cooling_until(time.time())
                        ),
                        method_name="resume",
                        timeout=timedelta(
                            seconds=max(60.0, state.deadline_at - time.time() + 3600)
                        ),
                    )
                event = ctl.wait_here(result.wake_at)
            except Exception as e:
                if not isinstance(e, (ConfigError, BudgetExhausted)) and _tries_left(context):
                    # a passing error (backend, store, network): the attempt keeps running and
                    # the next try re-attaches to it
                    store.set(STATE_KEY, state.to_dict())
                    raise
                try:  # the task fails for good: stop what runs, keep the record
                    ctl.abandon()
                except Exception as stop:  # noqa: BLE001 - the original error is the one to raise
                    self.log.error("Could not stop the live attempt: %s", stop)
                state.failed = {"error": type(e).__name__, "message": str(e)}
                ctl.failed_for_good(time.time())
                store.set(STATE_KEY, state.to_dict())
                raise

    def _trigger(self, state: JobState, wake_at: float, cooling: dict[str, float] | None = None):
        backend = self._backend()
        handle = state.live.handle if state.live else None
        if getattr(backend, "name", "") == "kubernetes":
            from airflow_spot.triggers.local import KubernetesAttemptTrigger

            return KubernetesAttemptTrigger(
                handle=handle,
                backend=backend.to_dict(),
                wake_at=wake_at,
                poll_interval=self.poll_interval,
            )
        from airflow_spot.triggers.local import LocalAttemptTrigger

        return LocalAttemptTrigger(
            handle=handle,
            market=state.market,
            spot_was=state.spot_last,
            wake_at=wake_at,
            poll_interval=self.poll_interval,
            cooling=cooling or None,
        )


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
    return isinstance(value, str) and "{{" in value


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
    try:
        return timedelta(hours=parse_hours(text, "deadline"))
    except ConfigError:
        raise ConfigError(
            "deadline", f"{text!r} is neither an ISO datetime nor a duration like '6h'"
        ) from None
