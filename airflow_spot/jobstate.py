"""A training job's persistent state: attempts, budgets, what was seen of spot, decisions.

Pure (no Airflow, no clock): the operator stores :meth:`JobState.to_dict` in the task
instance's ``task_state_store`` so that it survives deferrals, worker restarts and retries,
and builds the :class:`~airflow_spot.ledger.Ledger` from it. Wall times are seconds since the
epoch; market times (what the policy and the ledger see) are ``(wall - started_at) * time_scale``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_spot.ledger import Ledger, Phase, Segment
from airflow_spot.policy import Capacity
from airflow_spot.policy.model import SpotView

MAX_DECISIONS = 150


def _known(kind: type, d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in kind.__dataclass_fields__}  # type: ignore[attr-defined]


@dataclass
class AttemptHandle:
    """How to find one attempt again, from any process: made by a backend's ``launch``,
    stored in the job state, carried by the trigger and by the events it sends back. A watcher
    records in it what it saw of the attempt (a pod's node, capacity and notice), so that a
    verdict is still possible after the node is gone. Fields a backend does not use stay None
    and are left out of :meth:`to_dict`."""

    launched_at: float | None = None
    kind: str | None = None  # the backend's kind (Kubernetes handles carry it)
    attempt: int | None = None
    capacity: str | None = None
    # local: the attempt's folder (spec, status and log, under its supervisor)
    run_dir: str | None = None
    # Kubernetes: the pod, and what was seen of it and its node
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    node: str | None = None
    node_uid: str | None = None
    node_created: float | None = None
    was_spot: bool | None = (
        None  # on a spot node (an on-demand pod that cannot schedule is not "spot unavailable")
    )
    was_running: bool | None = None
    pending_since: float | None = None
    start_error_since: float | None = None  # a container that cannot start, since when
    notice: str | None = (
        None  # the node's reclaim notice (kept: the node may be gone at the verdict)
    )
    notice_at: float | None = None
    notice_sent: bool | None = None  # relayed to the pod's annotation
    gave_up: list[Any] | None = None  # [verdict, reason, evidence]: we deleted a pod that never ran
    # the attempt's lease: it checkpoints and stops by itself once no watcher renewed it
    lease_s: float | None = None
    lease_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | AttemptHandle) -> AttemptHandle:
        """A stored handle (keys this version does not know are dropped)."""
        if isinstance(d, AttemptHandle):
            return d
        return cls(**_known(cls, d))

    def same_attempt(self, other: AttemptHandle) -> bool:
        return (self.run_dir, self.pod, self.attempt) == (other.run_dir, other.pod, other.attempt)


@dataclass
class AttemptRecord:
    attempt: int
    capacity: str
    handle: AttemptHandle
    launched_at: float
    step_start: int = 0
    granted_at: float | None = None  # when capacity was granted (a spot request waits before)
    started_at: float | None = None  # training process started: changeover over
    ended_at: float | None = None
    outcome: str | None = None
    reason: str = ""
    exit_code: int | None = None
    step_end: int | None = None
    ckpt_step_end: int | None = None
    price: float = 0.0
    pool: str = ""  # the spot pool (zone) it ran in
    prices: list[list[float]] = field(
        default_factory=list
    )  # [wall, price per hour] at each price change
    first_step: int | None = None  # first progress report seen (steady-state throughput)
    first_step_at: float | None = None
    last_step_at: float | None = None
    ready_at: float | None = None  # a make-before-break spot attempt was ready to take over
    handed_to: int | None = None  # this on-demand attempt trained on until attempt N took over
    ranks: list[dict[str, Any]] | None = None  # a gang's ranks: each one's outcome and exit

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptRecord:
        """A stored attempt (``launch_began_at``: the name 0.1.0 stored ``granted_at`` under)."""
        if "launch_began_at" in d and "granted_at" not in d:
            d = {**d, "granted_at": d["launch_began_at"]}
        return cls(**_known(cls, d))

    def __post_init__(self) -> None:
        if isinstance(self.handle, dict):  # as stored, or written by hand
            self.handle = AttemptHandle.from_dict(self.handle)


@dataclass
class JobState:
    started_at: float
    deadline_at: float
    time_scale: float = 1.0
    total_steps: int | None = None
    market: dict[str, Any] | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    current: int | None = None  # index into attempts of the live attempt
    preemptions: int = 0
    failures: int = 0
    infra_disruptions: int = 0
    infra_base: int = 0  # infra_disruptions when this try began (the limit is per try)
    try_started_at: float | None = None  # wall time this Airflow try began (execution_timeout)
    spot_last: bool | None = None
    spot_last_change: float | None = None
    spot_down_s: float = 0.0  # market seconds spot was seen down
    spot_run_seen_start: bool = False  # the current run began after the job's first look
    spot_last_up_s: float | None = None  # market seconds of the last spot run seen whole
    spot_last_down_s: float | None = None  # market seconds of the last outage seen whole
    last_seen: float | None = None  # wall time of the last look
    looks_late: list[float] = field(default_factory=list)  # wall s the last turns began late
    # what was seen of spot (observe="cluster": spot is seen only through the job's own spot
    # attempt, its request, its probes and what the cluster shows; older states: "oracle")
    observe: str = "oracle"
    spot_seen_at: float | None = None  # wall time spot's state was last seen
    spot_source: str = ""  # what showed it (backends.signals.SOURCES)
    probe: dict[str, Any] | None = None  # the probe asking for spot now (started_at, pool, handle)
    probes: int = 0  # probes asked
    probe_found: list[list[float]] = field(default_factory=list)  # [wall, market s, $/h] unused
    acquired_s: float = 0.0  # the longest a gang's on-demand nodes took to come (wall seconds)
    incoming: int | None = None  # index of a spot attempt launching while on-demand trains
    decisions: list[dict[str, Any]] = field(default_factory=list)
    decisions_dropped: int = 0  # older decisions not kept (the log keeps the last MAX_DECISIONS)
    finished: dict[str, Any] | None = None
    failed: dict[str, Any] | None = None  # why the task failed for good (error type and message)
    snapshot: dict[str, Any] | None = None  # the live summary the UI shows while the job runs
    save_s: float | None = None  # wall seconds of the longest checkpoint save reported
    save_warned: bool = False  # the user was told a save outlasts the preemption grace
    # the newest checkpoint step the job has seen (the trainer's reports, the location's
    # newest manifest): a location that later shows less lost checkpoints (the UI's progress)
    checkpoint_seen: int = 0
    # the backend's settings and the job's arguments (JobArgs.to_dict) as the last try had them:
    # what the scheduler or api-server needs to stop and report a job (operators/unwatched.py)
    backend: dict[str, Any] | None = None
    args: dict[str, Any] | None = None

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for a, rec in zip(d["attempts"], self.attempts, strict=True):
            a["handle"] = rec.handle.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobState:
        """The state as stored; fields this version does not know (written by a newer one,
        in a rolling deploy or after a rollback) are dropped."""
        d = _known(cls, d)
        d["attempts"] = [AttemptRecord.from_dict(a) for a in d.get("attempts", [])]
        return cls(**d)

    # -- time -----------------------------------------------------------------------------
    def market_s(self, wall: float) -> float:
        return (wall - self.started_at) * self.time_scale

    @property
    def deadline_s(self) -> float:
        return self.market_s(self.deadline_at)

    @property
    def live(self) -> AttemptRecord | None:
        return None if self.current is None else self.attempts[self.current]

    @property
    def coming(self) -> AttemptRecord | None:
        """The spot attempt launching while the live on-demand one trains on (None: none)."""
        return None if self.incoming is None else self.attempts[self.incoming]

    # -- what was seen ----------------------------------------------------------------------
    def see_spot(
        self, available: bool | None, wall: float, source: str = "", at: float | None = None
    ) -> None:
        """A look at ``wall``: account for spot's state since the previous look, and take in
        what ``source`` showed of it at ``at`` (default ``wall``; ``None``: nothing). A fact
        older than the last one seen is ignored; a preemption's ``ended_at`` is a fact of its
        own time, so an outage between two looks resets the run seen."""
        if self.last_seen is not None and self.spot_last is False:
            self.spot_down_s += max(0.0, wall - self.last_seen) * self.time_scale
        self.last_seen = wall
        if available is None:
            return
        at = wall if at is None else at
        if self.spot_seen_at is not None and at < self.spot_seen_at:
            return
        if available != self.spot_last:
            if self.spot_last is not None and self.spot_last_change is not None:
                if self.spot_run_seen_start:
                    length = (at - self.spot_last_change) * self.time_scale
                    if self.spot_last:
                        self.spot_last_up_s = length
                    else:
                        self.spot_last_down_s = length
                self.spot_run_seen_start = True
            self.spot_last_change = at
        self.spot_last = available
        self.spot_seen_at = at
        self.spot_source = source

    def spot_age_s(self, wall: float) -> float:
        return (
            0.0
            if self.spot_last_change is None
            else (wall - self.spot_last_change) * self.time_scale
        )

    def spot_view(self, wall: float, fresh_s: float) -> SpotView:
        """What the policy may take as known of spot at ``wall``: its state if seen within
        ``fresh_s`` wall seconds, else ``None`` with the state last seen, its age then and how
        long ago (market seconds). Under the oracle every look sees spot."""
        seen_at = self.spot_seen_at if self.spot_seen_at is not None else self.last_seen
        if self.spot_last is None or seen_at is None:
            return SpotView()
        unseen = max(0.0, wall - seen_at)
        if unseen <= fresh_s:
            return SpotView.now(self.spot_last, self.spot_age_s(wall), self.spot_source)
        return SpotView(
            None,
            self.spot_age_s(seen_at),
            unseen * self.time_scale,
            self.spot_last,
            self.spot_source,
        )

    def record_decision(
        self,
        wall: float,
        capacity: str,
        reason: str,
        done_steps: int | None,
        spot: str | None = None,
    ) -> None:
        entry = {
            "at": wall,
            "market_h": round(self.market_s(wall) / 3600, 4),
            "capacity": capacity,
            "reason": reason,
            "step": done_steps,
        }
        if spot is not None:  # spot's signal: up, down (and its source) or unknown since when
            entry["spot"] = spot
        self.decisions.append(entry)
        if len(self.decisions) > MAX_DECISIONS:
            self.decisions_dropped += len(self.decisions) - MAX_DECISIONS
            del self.decisions[:-MAX_DECISIONS]

    def record_event(self, wall: float, text: str, step: int | None = None) -> None:
        """A warning in the decision log the UI shows (no capacity: not a decision)."""
        self.record_decision(wall, "", text, step)
        self.decisions[-1]["event"] = "warning"

    # -- measurement ------------------------------------------------------------------------
    def _runs(self) -> list[tuple[int, float]]:
        """(steps, market seconds) of steady-state training of each attempt that reported."""
        return [
            (
                max(0, a.step_end - a.first_step),
                max(0.0, (a.last_step_at - a.first_step_at) * self.time_scale),
            )
            for a in self.attempts
            if a.first_step is not None
            and a.step_end is not None
            and a.last_step_at
            and a.first_step_at
        ]

    def throughput(self) -> tuple[int, float]:
        """(steps, market seconds) of steady-state training seen across attempts."""
        runs = self._runs()
        return sum(n for n, _ in runs), sum(t for _, t in runs)

    def latest_seconds_per_step(self, min_steps: int) -> float | None:
        """Market seconds per step of the latest attempt that ran ``min_steps`` steps (the
        live one included): capacity of another kind, a slower instance or a busier node
        shows here before it moves the mean."""
        return next((t / n for n, t in reversed(self._runs()) if n >= min_steps and t > 0), None)

    def measured_changeover_s(self, seconds_per_step: float) -> float | None:
        """Mean market seconds from capacity granted until training began: the first progress
        seen, less the steps it reports since the attempt's start (one look, or on Kubernetes
        one checkpoint, may hold many)."""
        vals = [
            max(0.0, began - self.market_s(a.granted_at or a.launched_at))
            for a in self.attempts
            if (began := self._training_began_s(a, seconds_per_step)) is not None
        ]
        return sum(vals) / len(vals) if vals else None

    def _training_began_s(self, a: AttemptRecord, seconds_per_step: float) -> float | None:
        """Market seconds at which ``a`` began training: its first progress seen, less the
        steps that report holds (None before any progress)."""
        if a.first_step_at is None or a.first_step is None:
            return None
        return self.market_s(a.first_step_at) - max(1, a.first_step - a.step_start) * (
            seconds_per_step
        )

    # -- the ledger -------------------------------------------------------------------------
    def ledger(
        self,
        now: float,
        seconds_per_step: float,
        on_demand_price: float,
        work_s: float,
        nodes: int = 1,
    ) -> Ledger:
        """Segments of the job so far: idle gaps, waits, changeovers and runs of each attempt,
        each piece billed at the price that applied then, per node of the gang (``p * 1``: p)."""
        led = Ledger(work_s, self.deadline_s, on_demand_price * nodes)
        cursor = 0.0
        for a in self.attempts:
            cap = Capacity(a.capacity)
            t_launch = self.market_s(a.launched_at)
            t_start = self.market_s(a.started_at) if a.started_at else None
            t_end = self.market_s(a.ended_at or now)
            if a.granted_at:
                t_grant = self.market_s(a.granted_at)
            else:  # never granted (a request that waited for capacity) is not billed
                t_grant = t_launch if t_start is not None else t_end
            ended = a.outcome or ""
            p0 = a.step_start * seconds_per_step
            prices = a.prices or [[a.launched_at, a.price]]
            schedule = [(self.market_s(w), p * nodes) for w, p in prices]
            if t_launch > cursor:
                led.add(Segment(Capacity.NONE, Phase.IDLE, cursor, t_launch, p0, p0))
            overlaps = t_launch < cursor - 1e-9  # launched while another attempt trained on
            if t_grant > t_launch and not overlaps:
                led.add(
                    Segment(
                        Capacity.NONE,
                        Phase.IDLE,
                        t_launch,
                        min(t_grant, t_end),
                        p0,
                        p0,
                        attempt=a.attempt,
                    )
                )
            began = self._training_began_s(a, seconds_per_step)
            if t_start is not None and began is not None:
                # the changeover lasts until training began (as the policy measures it): the
                # process's own start-up and restore (imports, loading the checkpoint) too
                t_start = min(max(t_start, began), t_end)
            launch_end = t_end if t_start is None else t_start
            if launch_end > t_grant:
                for lo, hi, price in _pieces(t_grant, launch_end, schedule):
                    last = hi >= launch_end
                    led.add(
                        Segment(
                            cap,
                            Phase.LAUNCHING,
                            lo,
                            hi,
                            p0,
                            p0,
                            price,
                            a.pool,
                            a.attempt,
                            ended_by=ended if (t_start is None and last) else "",
                        )
                    )
            if t_start is not None:
                step_end = a.step_end if a.step_end is not None else a.step_start
                kept = a.ckpt_step_end if a.ckpt_step_end is not None else step_end
                failed = a.outcome in (
                    "preempted",
                    "cancelled",
                    "infra_disruption",
                    "app_failure",
                    "oom_killed",
                    "checkpoint_unwritable",
                )
                lost = max(0, step_end - kept) * seconds_per_step if failed else 0.0
                p1 = step_end * seconds_per_step
                span = max(t_end - t_start, 1e-9)
                if a.handed_to is not None:  # trained on while the spot return launched
                    nxt = next((b for b in self.attempts if b.attempt == a.handed_to), None)
                    took = nxt.granted_at if nxt is not None else None
                    if took:
                        schedule = sorted({*schedule, (self.market_s(took), schedule[-1][1])})
                        overlap_from = self.market_s(took)
                    else:
                        overlap_from = t_end
                else:
                    overlap_from = t_end
                for lo, hi, price in _pieces(t_start, t_end, schedule):
                    last = hi >= t_end
                    led.add(
                        Segment(
                            cap,
                            Phase.RUNNING,
                            lo,
                            hi,
                            p0 + (p1 - p0) * (lo - t_start) / span,
                            p0 + (p1 - p0) * (hi - t_start) / span,
                            price,
                            a.pool,
                            a.attempt,
                            ended_by=ended if last else "",
                            lost_s=lost if last else 0.0,
                            overlap=lo >= overlap_from - 1e-9,
                        )
                    )
            cursor = max(cursor, t_end)
        led.probes = self.probes
        for found, hold_s, price in self.probe_found:
            t0 = self.market_s(found)
            led.add(Segment(Capacity.SPOT, Phase.PROBE, t0, t0 + hold_s, 0.0, 0.0, price))
        return led


def _pieces(
    lo: float, hi: float, schedule: list[tuple[float, float]]
) -> list[tuple[float, float, float]]:
    """Split [lo, hi] where the price schedule ``[(time, price), ...]`` changes."""
    price = schedule[0][1]
    for t, p in schedule:
        if t <= lo:
            price = p
    out, start = [], lo
    for t, p in schedule:
        if lo < t < hi:
            out.append((start, t, price))
            start, price = t, p
    out.append((start, hi, price))
    return out
