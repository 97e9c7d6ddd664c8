"""Typed attempt states and outcomes shared by every backend (pure: no Airflow)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from airflow_spot.exceptions import ConfigError, finite_number

if TYPE_CHECKING:  # annotations only: the operator's import stays cheap (no ledger, no policy)
    from airflow_spot.jobstate import AttemptHandle


class State(str, Enum):
    """Where an attempt is in its life."""

    WAITING = "waiting"  # a spot launch waiting for capacity (not billed)
    LAUNCHING = "launching"  # changeover: start-up and restore (billed, no progress)
    RUNNING = "running"
    PREEMPTING = "preempting"  # notice sent, SIGTERM / SIGKILL to follow
    ENDED = "ended"


class Outcome(str, Enum):
    """How an attempt ended. A preemption is never an application failure."""

    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"  # the cloud took the spot capacity back
    SPOT_UNAVAILABLE = "spot_unavailable"  # never got spot capacity in time
    INFRA_DISRUPTION = (
        "infra_disruption"  # not a spot reclaim, not the application (drain, lost supervisor)
    )
    OOM_KILLED = "oom_killed"
    APP_FAILURE = "app_failure"  # non-zero exit on healthy capacity
    # the checkpoint location took no writes (full, read-only, denied: the training process
    # exited STORAGE_EXIT): the environment's trouble, which spends no budget
    CHECKPOINT_UNWRITABLE = "checkpoint_unwritable"
    CANCELLED = "cancelled"  # we stopped it (decision or kill)


@dataclass(frozen=True)
class TaskIdentity:
    """The task instance a job belongs to: a backend names and labels its attempts by it."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1

    @classmethod
    def of(cls, ti: Any) -> TaskIdentity:
        return cls(
            ti.dag_id,
            ti.task_id,
            ti.run_id,
            getattr(ti, "map_index", -1),
            getattr(ti, "try_number", 1),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskIdentity:
        """From :meth:`to_dict`'s form (``map_index`` and ``try_number`` may be left out)."""
        return cls(
            d["dag_id"],
            d["task_id"],
            d["run_id"],
            int(d.get("map_index", -1)),
            int(d.get("try_number", 1)),
        )


@dataclass(frozen=True)
class AttemptStatus:
    """What a backend reports about one attempt; times are wall-clock seconds since the epoch."""

    state: State
    capacity: str
    attempt: int
    launched_at: float
    granted_at: float | None = None  # when capacity was granted (spot may wait before)
    started_at: float | None = None  # when the training process started (changeover over)
    ready_at: float | None = None  # a held attempt (make-before-break) is ready to take over
    ended_at: float | None = None
    outcome: Outcome | None = None
    reason: str = ""
    exit_code: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    heartbeat: float | None = None
    # what the backend must do in the world for this status (``Backend.carry_out``)
    due: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.state is State.ENDED

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        d["outcome"] = self.outcome.value if self.outcome else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptStatus:
        d = dict(d)
        d["state"] = State(d["state"])
        d["outcome"] = Outcome(d["outcome"]) if d.get("outcome") else None
        d["due"] = tuple(d.get("due") or ())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


PRICE_FROM_KEYS = ("aws_conn_id", "instance_type", "zone", "region_name")


def check_pools(pools: Any, kind: type) -> tuple:
    """A backend's spot pools as a tuple of ``kind`` (a list is accepted), with unique names
    and valid prices; ``ConfigError`` naming ``backend.pools`` otherwise."""
    if isinstance(pools, list):
        pools = tuple(pools)
    if not isinstance(pools, tuple) or not all(isinstance(p, kind) for p in pools):
        raise ConfigError(
            "backend.pools", f"give a tuple of {kind.__name__}(...) objects, got {pools!r}"
        )
    if len({p.name for p in pools}) != len(pools):
        raise ConfigError("backend.pools", "pool names must be unique")
    for p in pools:
        check_pool_price(p.name, p.spot_price, p.price_from)
    return pools


def check_pool_price(name: str, spot_price: Any, price_from: Any) -> None:
    """A pool's fixed price (None, or a price per hour >= 0) and its live-price source."""
    if spot_price is not None and not (finite_number(spot_price) and spot_price >= 0):
        raise ConfigError(
            "backend.pools",
            f"pool {name!r}: spot_price must be a price per hour >= 0, got {spot_price!r}",
        )
    check_price_from(f"backend.pools[{name}].price_from", price_from)


def check_price_from(field: str, source: Any) -> None:
    """A pool's live-price source: ``{"aws_conn_id", "instance_type", "zone"[, "region_name"]}``."""
    if source is None:
        return
    ok = (
        isinstance(source, dict)
        and not set(source) - set(PRICE_FROM_KEYS)
        and all(isinstance(v, str) and v.strip() for v in source.values())
        and "instance_type" in source
        and "zone" in source
    )
    if not ok:
        raise ConfigError(
            field,
            'give {"aws_conn_id": "aws_default", "instance_type": "p3.2xlarge", "zone": '
            f'"us-east-1a"}} (region_name optional), got {source!r}',
        )


# -- the backend interface ----------------------------------------------------------------
@runtime_checkable
class Backend(Protocol):
    """Where attempts run. Everything the controller and the watchers use of a backend, and
    nothing more: :class:`~airflow_spot.backends.local.LocalBackend` and
    :class:`~airflow_spot.backends.kubernetes.KubernetesBackend` implement it, and a
    third-party backend is checked against it when the DAG is parsed (:func:`missing_members`).

    Handles (:class:`~airflow_spot.jobstate.AttemptHandle`) are made by :meth:`launch`; the
    operator stores them and a watcher (possibly in another process) passes them back."""

    @property
    def kind(self) -> str:
        """The ``kind`` of :meth:`to_dict`, by which :func:`load_backend` rebuilds it."""

    @property
    def time_scale(self) -> float:
        """Trace seconds per wall second (1.0 for real capacity)."""

    @property
    def spot_cooldown_s(self) -> float:
        """Wall seconds a spot pool counts as down after it lost the job's capacity."""

    @property
    def notice_to_kill_s(self) -> float | None:
        """Wall seconds a preempted attempt has between the notice and the kill, where the
        backend reports save times (None: it cannot say)."""

    @property
    def runs_on_worker(self) -> bool:
        """Attempts run on the Airflow worker itself (else elsewhere: a checkpoint location
        must then be one both reach, not a relative path)."""

    @property
    def node_pools(self) -> tuple[Any, ...]:
        """Spot node pools priced and chosen by the operator (empty: a replayed market, whose
        pools come with :meth:`market_spec`, or one spot placement)."""

    def market_spec(self, epoch: float) -> Any:
        """The replayed market from ``epoch`` (None where the real market is not replayed)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON settings, with ``kind``; :func:`load_backend` builds the backend again."""

    def launch(
        self,
        ident: TaskIdentity,
        attempt: int,
        capacity: str,
        command: list[str],
        *,
        checkpoint_uri: str,
        changeover_wall_s: float,
        market: Any,
        env: dict[str, str] | None = None,
        pool: str = "",
    ) -> AttemptHandle:
        """Start attempt ``attempt`` of the task instance ``ident`` (a :class:`TaskIdentity`,
        a :class:`TaskIdentity`); returns its handle. ``market``: the replayed
        market of the chosen pool (None on real capacity)."""

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        """What the attempt is doing (its verdict once it ended). It only reports: what is
        due in the world (``AttemptStatus.due``) is done by :meth:`carry_out`."""

    def carry_out(self, handle: AttemptHandle, status: AttemptStatus) -> None:
        """Do what ``status`` found due (relay a reclaim notice, delete a pod that will never
        run), recording it in ``handle``."""

    def progress(self, handle: AttemptHandle) -> dict[str, Any] | None:
        """The attempt's latest progress report (None: no progress channel)."""

    def cancel(self, handle: AttemptHandle) -> AttemptStatus:
        """Stop the attempt (an attempt that ended already is left for :meth:`release`)."""

    def log_tail(self, handle: AttemptHandle) -> str:
        """The last lines of the attempt's log (best effort)."""

    def release(self, handle: AttemptHandle, outcome: str) -> None:
        """Free what an ended attempt still holds (its pod, per the backend's policy)."""


@runtime_checkable
class HandsOver(Protocol):
    """A backend that can return to spot make-before-break (optional): ``launch(...,
    hold=True)`` starts an attempt that, once granted and past its changeover, reports
    ``ready_at`` and waits; :meth:`release_hold` lets it train, after the attempt it replaces
    checkpointed and stopped. Without it a return to spot is break-before-make."""

    def release_hold(self, handle: AttemptHandle) -> None:
        """Let the held attempt start training."""


@runtime_checkable
class RunsGangs(Protocol):
    """A backend that launches an attempt as a gang of ``nodes`` ranks (optional: the local
    backend's ``nodes=N``), launched, stopped and judged together; without it, one process."""

    nodes: int


@runtime_checkable
class SeesSpot(Protocol):
    """A backend that shows spot capacity beyond the job's own attempts (optional): what the
    cluster says (:meth:`spot_signals`) and probes that ask it (Kubernetes)."""

    def spot_signals(self, now: float) -> list[Any]:
        """:class:`~airflow_spot.backends.signals.SpotSignal` facts the cluster shows now."""

    def probe(self, ident: TaskIdentity, pool: str = "") -> dict[str, Any]:
        """Start a probe for spot capacity; returns its JSON handle."""

    def probe_signal(self, probe: dict[str, Any], now: float) -> Any:
        """What the probe shows now (a SpotSignal), or None while it cannot tell yet."""

    def drop_probe(self, probe: dict[str, Any]) -> None:
        """Delete the probe at once (its node goes back)."""


#: what a backend must offer, by kind: methods are called, attributes read
BACKEND_METHODS = (
    "market_spec",
    "to_dict",
    "launch",
    "status",
    "carry_out",
    "progress",
    "cancel",
    "log_tail",
    "release",
)
BACKEND_ATTRIBUTES = (
    "kind",
    "time_scale",
    "spot_cooldown_s",
    "notice_to_kill_s",
    "runs_on_worker",
    "node_pools",
)


def missing_members(backend: Any) -> list[str]:
    """The members of :class:`Backend` that ``backend`` lacks (methods not callable, numbers
    that are not numbers), in the protocol's order."""
    missing = [m for m in BACKEND_METHODS if not callable(getattr(backend, m, None))]
    for name in BACKEND_ATTRIBUTES:
        if not hasattr(backend, name):
            missing.append(name)
    if hasattr(backend, "time_scale") and not finite_number(backend.time_scale):
        missing.append("time_scale (a number)")
    return missing


def look(backend: Backend, handle: AttemptHandle) -> AttemptStatus:
    """The attempt's status, after the backend did what it found due (a notice relayed, a
    pod that will never run deleted), its lease renewed while it lives: the turn's and the
    watcher's look."""
    status = backend.status(handle)
    backend.carry_out(handle, status)
    if not status.terminal:
        renew_lease(backend, handle)
    return status


@runtime_checkable
class Leases(Protocol):
    """A backend whose attempts hold a lease: ``launch(..., lease_until=t)`` starts one with a
    lease until wall time ``t``; :meth:`renew_lease` moves it. An attempt whose lease runs out
    (no operator or trigger looked at it for that long: a failed try, a deleted run, a dead
    triggerer) checkpoints and stops by itself, and says so in its log."""

    def renew_lease(self, handle: AttemptHandle, until: float) -> None: ...


@runtime_checkable
class FindsAttempts(Protocol):
    """A backend that lists the attempts of a task instance that exist (a try adopts those
    no record holds: launched by a worker that died before saving them)."""

    def find_attempts(self, ident: TaskIdentity) -> list[AttemptHandle]: ...


def renew_lease(backend: Any, handle: AttemptHandle, now: float | None = None) -> None:
    """Renew the attempt's lease once a third of it is spent (a write per third, not per look)."""
    if not handle.lease_s or not isinstance(backend, Leases):
        return
    now = time.time() if now is None else now
    if handle.lease_until is not None and handle.lease_until - now > handle.lease_s * 2 / 3:
        return
    until = now + handle.lease_s
    backend.renew_lease(handle, until)
    handle.lease_until = until


def stop_and_release(backend: Backend, handle: AttemptHandle) -> AttemptStatus:
    """Cancel an attempt and release what it holds: for callers that keep no record of it (a
    kill, a job replaced), so no log is read first."""
    status = backend.cancel(handle)
    backend.release(handle, status.outcome.value if status.outcome else "")
    return status
