"""A gang's attempt on Kubernetes: ``KubernetesBackend(nodes=N)`` with N > 1 launches each
attempt as one indexed Job of N ranks and a headless Service (:mod:`.gang_launch`), a spot
gang behind a capacity gate (:mod:`.gating`), and judges it as one attempt
(:mod:`.gang_verdict`). Each backend method a gang changes is marked :func:`for_gangs` and
handed here.

The attempt's handle names the Job (``pod``); a look records each rank's node in it, so the
verdict stands after nodes and pods are gone. What a look finds due is carried out here: the
gates lifted once N placeholders are placed, a reclaim notice relayed to every rank (the ranks
agree on the stop: any rank's notice stops them all at the same step), a gang given up at
its timeout deleted, the ranks still running once the verdict is in stopped. A held launch
(a make-before-break return) is ready once all N ranks started; its release lets all N train.

While a spot gang waits behind its gate, its capacity is read as an observation ("N seen",
"fewer than N", unknown) into the status's ``evidence["capacity"]``: Karpenter's NodeClaims for
its placeholders (:mod:`.capacity_signals`), or with ``capacity_check="atomic-scale-up"`` (or
``"provisioning-request"``) the ProvisioningRequest that gates it instead of placeholders
(:mod:`.provisioning`), whose ``Provisioned=True`` grants the gang's capacity (the gates lift);
read by :mod:`.gang_capacity`. A "fewer than N" that stands with no launch on its way ends the
gang before its timeout, given up as the timeout gives it up (:func:`.gating.short_of_n`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_spot.backends.base import AttemptStatus, Outcome, State, TaskIdentity, look
from airflow_spot.backends.kubernetes.gang_launch import (
    build_job,
    build_service,
    owner,
    rendezvous_port,
)
from airflow_spot.backends.kubernetes.gang_ranks import GangLook, container_state, rank_nodes
from airflow_spot.backends.kubernetes.gang_verdict import (
    LIFT_GATES,
    STOP_RANKS,
    Timeouts,
    judge_gang,
)
from airflow_spot.backends.kubernetes.gating import (
    GRANTED_ANNOTATION,
    GangCapacity,
    build_placeholders,
)
from airflow_spot.backends.kubernetes.podread import found_attempt, launched_attempt, same_object
from airflow_spot.backends.kubernetes.provisioning import (
    CLASSES,
    build_pod_template,
    build_request,
    check_capacity_check,
    consume,
    request_name,
)
from airflow_spot.backends.kubernetes.verdict import GIVE_UP, OUTCOMES, RELAY_NOTICE
from airflow_spot.backends.kubernetes.vocabulary import (
    HOLD_ANNOTATION,
    LAUNCHED_ANNOTATION,
    LEASE_ANNOTATION,
    NOTICE_ANNOTATION,
    RELEASED_ANNOTATION,
)
from airflow_spot.exceptions import BackendError, ConfigError, finite_number
from airflow_spot.jobstate import AttemptHandle

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def for_gangs(method: F) -> F:
    """A ``KubernetesBackend`` method that a gang backend (``nodes`` > 1) hands to
    :class:`Gang` (the method of the same name)."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.nodes > 1:
            return getattr(Gang(self), method.__name__)(*args, **kwargs)
        return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


def check_gang_fields(b: Any) -> None:
    """``nodes`` (a whole number >= 1), ``gang_timeout_s`` (> 0), ``gang_settle_s`` (>= 0)."""
    n = b.nodes
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("backend.nodes", f"must be a whole number >= 1 (ranks), got {n!r}")
    for name, least in (("gang_timeout_s", 0.0), ("gang_settle_s", -1e-9)):
        v = getattr(b, name)
        if not (finite_number(v) and v > least):
            raise ConfigError(
                f"backend.{name}",
                f"must be a number of seconds {'>' if least == 0 else '>='} 0, got {v!r}",
            )
    check_capacity_check(b.capacity_check)


class Gang:
    """The gang operations of ``backend`` (a ``KubernetesBackend`` with ``nodes`` > 1)."""

    def __init__(self, backend: Any) -> None:
        from airflow_spot.backends.kubernetes.gang_api import GangApi

        self.b = backend
        self.n = int(backend.nodes)
        self.api = GangApi(backend.api)
        self.request_class = CLASSES.get(backend.capacity_check)  # None: placeholders
        self.capacity: GangCapacity | None = None  # what the last look saw of the gang's N

    @property
    def by_request(self) -> bool:
        """Gated on a ProvisioningRequest (not placeholders)."""
        return self.request_class is not None

    # -- launching ----------------------------------------------------------------------------
    def launch(
        self,
        ident: TaskIdentity,
        attempt: int,
        capacity: str,
        command: list[str],
        *,
        checkpoint_uri: str,
        changeover_wall_s: float = 0.0,  # noqa: ARG002 - the protocol's
        market: Any = None,  # noqa: ARG002
        env: dict[str, str] | None = None,
        pool: str = "",
        hold: bool = False,
        lease_until: float | None = None,
    ) -> AttemptHandle:
        """Create the gang: its Job (the attempt pod as every rank's template), its Service
        and, on spot, its N placeholders (after removing the task's leftovers; held, the
        gang it replaces trains on)."""
        from airflow_spot.backends.kubernetes.capacity_calls import create_request
        from airflow_spot.backends.kubernetes.pods import attempt_pod, pod_name, task_labels

        name, labels = pod_name(ident, attempt), task_labels(ident)
        pod = attempt_pod(
            self.b, name=name, labels=labels, try_number=ident.try_number, attempt=attempt,
            capacity=capacity, command=command, checkpoint_uri=checkpoint_uri, env=env,
            pool=pool, hold=hold,
        )  # fmt: skip
        self._remove_leftovers(ident, name, attempt, hold)
        # the handle's launch is the pods' own stamp, taken before any of them is created
        stamp = repr(time.time())
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), LAUNCHED_ANNOTATION: stamp}
        if lease_until is not None:
            pod.metadata.annotations[LEASE_ANNOTATION] = repr(lease_until)
        body = self.b.api.as_json(pod)
        key = f"{ident.dag_id}/{ident.task_id}/{ident.run_id}/{ident.map_index}"
        port, spot = rendezvous_port(key, attempt), capacity == "spot"
        cls = self.request_class if spot else None  # a spot gang's request, if gated on one
        if cls:
            body = consume(body, name, cls)
        job = self.api.create_job(build_job(body, name=name, nodes=self.n, port=port, gated=spot))
        uid = job.metadata.uid
        self.api.create_service(build_service(name, uid, port, labels))
        if cls:
            ref = owner(name, uid)
            create_request(
                self.b.api,
                build_pod_template(body, job=name, owner=ref, labels=labels),
                build_request(job=name, nodes=self.n, owner=ref, labels=labels, cls=cls),
            )
        elif spot:
            self.b.cluster.ensure_priority_class()
            for p in build_placeholders(
                body, job=name, job_uid=uid, nodes=self.n, labels=labels, image=self.b.probe_image
            ):
                self.api.create_placeholder(p)
        return launched_attempt(name, self.b.namespace, attempt, capacity, float(stamp))

    def _remove_leftovers(self, task: TaskIdentity, name: str, attempt: int, hold: bool) -> None:
        """Delete the task's Jobs a launch of ``name`` must not meet (held: the running gang
        it replaces is kept; ``delete_pods`` keeps ended ones), then its leftover pods."""
        for job in self.api.jobs(_selector(task)):
            jname = job.metadata.name
            ended = any(
                c.type in ("Complete", "Failed") and c.status == "True"
                for c in (job.status.conditions if job.status else None) or []
            )
            if jname != name and (
                (ended and self.b.delete_pods != "always") or (hold and not ended)
            ):
                continue
            log.warning("Deleting leftover gang %s of this task before attempt %d.", jname, attempt)
            for p in self.api.rank_pods(jname):
                self.b.api.delete_pod(p.metadata.name, grace=0)
            self.api.delete_job(jname)
        self.b._remove_leftovers(task, name, attempt, hold)

    def find_attempts(self, ident: TaskIdentity) -> list[AttemptHandle]:
        """Every gang of this task instance, by attempt number (a Job carries the attempt pod's
        labels and launch stamp)."""
        found = [found_attempt(j, self.b.namespace) for j in self.api.jobs(_selector(ident))]
        return sorted((h for h in found if h is not None), key=lambda h: h.attempt or 0)

    # -- looking ------------------------------------------------------------------------------
    def look(self, handle: AttemptHandle, now: float) -> GangLook:
        """Read the Job, its rank pods and placeholders, every node a rank is or was on, and
        the events of those nodes and of the rank pods that ended or are being deleted."""
        job_name = _job(handle)
        job = self.api.read_job(job_name)
        if job is not None and handle.capacity == "spot":
            from airflow_spot.backends.kubernetes.gang_capacity import waiting_capacity

            self.capacity = waiting_capacity(self, job, float(handle.launched_at or now), now)
        pods = self.api.rank_pods(job_name)
        placeholders = self.api.placeholders(job_name) if job is not None else []
        names = rank_nodes(handle.node, self.n)
        uids = dict(zip(names, rank_nodes(handle.node_uid, self.n), strict=True))
        wanted = {n for n in names if n} | {p.spec.node_name for p in pods if p.spec.node_name}
        nodes = {n: self.b.api.read_node(n) for n in sorted(wanted)}
        since = handle.launched_at
        events: dict[str, list[Any]] = {}
        for n in nodes:
            events[n] = [
                e
                for e in self.b.api.node_events(n)
                if same_object(e, uids.get(n) or None, since, alias=n)
            ]
        for p in pods:
            if _settling(p):
                events[p.metadata.name] = [
                    e
                    for e in self.b.api.pod_events(p.metadata.name)
                    if same_object(e, p.metadata.uid, since)
                ]
        return GangLook.of(self.n, job, pods, placeholders, nodes, events, now)

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        """Judge one look at the gang (:func:`.gang_verdict.judge_gang`), recording what it saw
        in ``handle``; what is due is left to :meth:`carry_out`."""
        look = self.look(handle, time.time())
        seen = judge_gang(handle, look, self.timeouts, self.capacity)
        for field, value in seen.record.items():
            setattr(handle, field, value)
        if seen.default_used:
            log.warning("Gang %s: %s.", _job(handle), seen.status.reason)
        return seen.status

    @property
    def timeouts(self) -> Timeouts:
        b = self.b
        return Timeouts(b.pending_timeout_s, b.gang_timeout_s, b.gang_settle_s)

    def carry_out(self, handle: AttemptHandle, status: AttemptStatus) -> None:
        """Do what ``status`` found due (see the module's notes)."""
        job = _job(handle)
        if LIFT_GATES in status.due:
            self._lift_gates(job, status.granted_at)
        if RELAY_NOTICE in status.due and not handle.notice_sent:
            log.warning(
                "A node of gang %s shows an interruption warning (%s): telling every rank to "
                "checkpoint now.", job, handle.notice,
            )  # fmt: skip
            self._annotate_ranks(job, {NOTICE_ANNOTATION: str(handle.notice)})
            handle.notice_sent = True
        if GIVE_UP in status.due and not handle.gave_up:
            log.warning("Gang %s: %s.", job, status.reason)
            outcome = status.outcome.value if status.outcome else ""
            verdict = next(v for v, o in OUTCOMES.items() if o.value == outcome)
            handle.gave_up = [verdict.value, status.reason, status.evidence["signals"]]
            self._delete(job, grace=0)
        if STOP_RANKS in status.due:
            self._stop_ranks(job)

    def _lift_gates(self, job: str, granted_at: float | None) -> None:
        """All N placeholders are placed (or the ProvisioningRequest provisioned): the Job
        records when (the gang's capacity granted), they go, and the ranks' gates are lifted."""
        if granted_at is not None:
            self.api.annotate_job(job, {GRANTED_ANNOTATION: repr(granted_at)})
        for p in self.api.placeholders(job):
            self.b.api.delete_pod(p.metadata.name, grace=0, what="placeholder")
        lifted = [
            p.metadata.name for p in self.api.rank_pods(job) if self.api.lift_gate(p.metadata.name)
        ]
        granted = (
            f"its ProvisioningRequest {request_name(job)} ({self.request_class}) was "
            f"provisioned (all {self.n} fit, or were asked for together)"
            if self.by_request
            else f"all {self.n} nodes placed"
        )
        log.info("Gang %s: %s; gates lifted on %s.", job, granted, lifted)

    def _stop_ranks(self, job: str) -> None:
        """The verdict is in: the ranks still running are stopped (they save on SIGTERM)."""
        for p in self.api.rank_pods(job):
            phase = p.status.phase if p.status else None
            if phase in ("Pending", "Running") and p.metadata.deletion_timestamp is None:
                log.info("Gang %s has its verdict: stopping rank pod %s.", job, p.metadata.name)
                self.b.api.delete_pod(p.metadata.name, grace=self.b.grace_period_s)

    def _annotate_ranks(self, job: str, annotations: dict[str, str]) -> list[str]:
        """Set annotations on every rank pod that is there; their names."""
        done = []
        for p in self.api.rank_pods(job):
            if self.b.api.annotate(
                p.metadata.name, annotations, f"annotating rank pod {p.metadata.name}"
            ):
                done.append(p.metadata.name)
        return done

    def _delete(self, job: str, grace: int) -> None:
        """Delete the whole gang: placeholders, rank pods (with ``grace``), Job, Service, and
        its ProvisioningRequest and PodTemplate."""
        from airflow_spot.backends.kubernetes.gang_launch import service_name

        for p in self.api.placeholders(job):
            self.b.api.delete_pod(p.metadata.name, grace=0, what="placeholder")
        for p in self.api.rank_pods(job):
            self.b.api.delete_pod(p.metadata.name, grace=grace)
        self.api.delete_job(job)
        self.api.delete_service(service_name(job))
        if self.by_request:  # last: a refusal (403, a clear error) leaves the gang deleted
            from airflow_spot.backends.kubernetes.capacity_calls import delete_request

            delete_request(self.b.api, request_name(job))

    # -- the rest of the protocol ---------------------------------------------------------
    def release_hold(self, handle: AttemptHandle) -> None:
        """Let every rank of a held gang train (the gang it replaces has stopped)."""
        released = {HOLD_ANNOTATION: "go", RELEASED_ANNOTATION: repr(time.time())}
        if len(self._annotate_ranks(_job(handle), released)) < self.n:
            log.warning("Gang %s: a rank is gone before its hold was released.", _job(handle))

    def renew_lease(self, handle: AttemptHandle, until: float) -> None:
        self._annotate_ranks(_job(handle), {LEASE_ANNOTATION: repr(until)})

    def cancel(self, handle: AttemptHandle, wait_s: float = 60.0) -> AttemptStatus:
        """Stop every rank (SIGTERM: they checkpoint) and delete the gang; waits until its
        pods are gone. A gang that already ended is left for :meth:`release`."""
        try:
            st: AttemptStatus | None = look(self.b, handle)
        except Exception as e:  # noqa: BLE001 - a gang we cannot read must still go
            log.warning(
                "Gang %s: cannot read its status (%s); deleting it anyway.", _job(handle), e
            )
            st = None
        if st is not None and st.terminal:
            return st
        job = _job(handle)
        self._delete(job, grace=self.b.grace_period_s)
        until = time.time() + wait_s
        while time.time() < until and self.api.rank_pods(job):
            time.sleep(0.2)
        return AttemptStatus(
            State.ENDED, handle.capacity or "", int(handle.attempt or 0),
            float(handle.launched_at or 0),
            started_at=st.started_at if st else None, granted_at=st.granted_at if st else None,
            ended_at=time.time(), outcome=Outcome.CANCELLED, reason="gang deleted by the controller",
        )  # fmt: skip

    def release(self, handle: AttemptHandle, outcome: str) -> None:
        """Delete an ended gang per ``delete_pods`` (its placeholders always)."""
        job = _job(handle)
        if self.b.delete_pods == "always" or (
            self.b.delete_pods == "on_success" and outcome == Outcome.SUCCEEDED.value
        ):
            self._delete(job, grace=0)
            return
        for p in self.api.placeholders(job):
            self.b.api.delete_pod(p.metadata.name, grace=0, what="placeholder")

    def log_tail(self, handle: AttemptHandle, lines: int = 15) -> str:
        """The last lines of the ranks that failed (the first failure's cause first), else of
        rank 0: ``rank k:`` before each."""
        try:
            pods = self.api.rank_pods(_job(handle))
            failed = sorted(
                (p for p in pods if p.status and p.status.phase == "Failed"),
                key=lambda p: (container_state(self.b.api.as_json(p))[1] or 0.0, p.metadata.name),
            )
            chosen = failed[:2] or sorted(pods, key=lambda p: p.metadata.name)[:1]
            return "\n".join(
                f"rank {_rank(p)}:\n{self.b.api.pod_log(p.metadata.name, 'train', lines)}"
                for p in chosen
            )
        except Exception as e:  # noqa: BLE001 - logs are best effort (the pods may be gone)
            return f"(no log: {type(e).__name__})"


def _job(handle: AttemptHandle) -> str:
    """The Job of a gang's handle."""
    if handle.pod is None:
        raise BackendError(f"not a Kubernetes attempt's handle: {handle.to_dict()}")
    return handle.pod


def _selector(task: TaskIdentity) -> str:
    """The label selector of the task's Jobs and pods."""
    from airflow_spot.backends.kubernetes.pods import label_selector, task_labels

    return label_selector(task_labels(task))


def _rank(pod: Any) -> str:
    from airflow_spot.backends.kubernetes.gang_launch import INDEX

    return (pod.metadata.annotations or {}).get(INDEX, "?")


def _settling(pod: Any) -> bool:
    """A rank pod whose own events may explain its end (ended, deleted, disrupted)."""
    phase = pod.status.phase if pod.status else None
    disrupted = any(
        c.type == "DisruptionTarget" for c in (pod.status.conditions if pod.status else None) or []
    )
    return (
        phase in ("Failed", "Succeeded") or pod.metadata.deletion_timestamp is not None or disrupted
    )
