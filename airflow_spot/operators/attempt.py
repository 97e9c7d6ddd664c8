"""The live attempt of a job: launch it, read its status and progress, close its record when
it ends (spending the budgets), and stop it. What the checkpoint location shows between
attempts (vanished checkpoints, a location that takes no writes) is judged in ``storage``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from airflow_spot.backends.base import (
    AttemptStatus,
    Backend,
    FindsAttempts,
    HandsOver,
    Leases,
    Outcome,
    look,
)
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.checkpoint.training import CONFIG_EXIT, STORAGE_EXIT
from airflow_spot.exceptions import ConfigError
from airflow_spot.jobstate import AttemptHandle, AttemptRecord, JobState
from airflow_spot.operators.capacity import SpotCapacity
from airflow_spot.operators.job import JobArgs, TaskIdentity
from airflow_spot.operators.storage import hold_back, saw_checkpoint, saw_progress
from airflow_spot.policy import Capacity, JobSpec

log = logging.getLogger(__name__)


class LiveAttempt:
    """Launches, watches and stops the attempts of one job, recording each in its state."""

    def __init__(
        self,
        args: JobArgs,
        ident: TaskIdentity,
        backend: Backend,
        state: JobState,
        checkpoints: Checkpoints,
        capacity: SpotCapacity,
    ) -> None:
        self.args = args
        self.ident = ident
        self.backend = backend
        self.state = state
        self.checkpoints = checkpoints
        self.capacity = capacity
        # called right before each launch (the operator saves the job's state there)
        self.before_launch: Callable[[], None] = lambda: None

    # -- looking ----------------------------------------------------------------------------
    def refresh(self, now: float) -> AttemptRecord | None:
        """Read the live attempt; returns its record once it ended (closed)."""
        live = self.state.live
        if live is None:
            return None
        status = look(self.backend, live.handle)  # a notice relayed, a stuck pod deleted
        self.sync(live, status)
        if not status.terminal:
            return None
        self.close(live, status, now)
        return live

    def recover(self, now: float) -> list[AttemptRecord]:
        """At a try's start: adopt the attempts the backend shows that no record holds (a worker
        launched them and died before saving their record). The live one recorded is read first
        (closed if it ended); then each found attempt gets its record: re-attached if it lives
        and nothing else does, closed with its verdict if it ended, stopped if another one
        lives (at most one attempt trains). Returns the records made."""
        st = self.state
        if not isinstance(self.backend, FindsAttempts):
            return []
        known = {(a.handle.run_dir, a.handle.pod) for a in st.attempts}
        found = [
            h
            for h in self.backend.find_attempts(self.ident)
            if (h.run_dir, h.pod) not in known
            and (h.attempt or 0) > len(st.attempts)
            and (h.launched_at or 0.0) >= st.started_at  # this job's, not an older one's
        ]
        if not found:
            return []
        if st.live is not None:
            self.refresh(now)  # the recorded attempt ended before the unrecorded one began
        made = []
        for h in found:
            prev = st.attempts[-1] if st.attempts else None
            rec = AttemptRecord(
                int(h.attempt or len(st.attempts) + 1),
                str(h.capacity or "on_demand"),
                h,
                float(h.launched_at or now),
                step_start=(prev.ckpt_step_end or prev.step_end or 0) if prev else 0,
            )
            st.attempts.append(rec)
            made.append(rec)
            status = look(self.backend, h)
            self.sync(rec, status)
            if status.terminal:
                self.close(rec, status, now)
            elif st.live is None:
                st.current = len(st.attempts) - 1
                log.warning(
                    "Attempt %d on %s was launched by a try that died before recording it: "
                    "re-attached to it (it is recorded now).",
                    rec.attempt,
                    rec.capacity,
                )
                continue
            else:
                self.close(rec, self.backend.cancel(h), now)
            rec.reason = (
                f"{rec.reason} (launched by a try that died before recording it; "
                "recorded by the next try)"
            )
        return made

    def refresh_coming(self, now: float) -> None:
        """Read the spot attempt launching while on-demand trains (a make-before-break
        return): ended (reclaimed before it was ready, say): closed, and on-demand goes on;
        ready to take over: the on-demand attempt checkpoints and stops, and the spot attempt
        trains from that checkpoint."""
        coming = self.state.coming
        if coming is None:
            return
        status = look(self.backend, coming.handle)
        self.sync(coming, status)
        if status.terminal:
            self.close(coming, status, now)
            log.info(
                "The return to spot ended before it was ready (%s): on-demand trains on.",
                coming.reason,
            )
            return
        if status.ready_at is None:
            return
        coming.ready_at = status.ready_at
        live = self.state.live
        if live is not None:
            log.info(
                "Spot attempt %d is ready: attempt %d on %s checkpoints and stops.",
                coming.attempt,
                live.attempt,
                live.capacity,
            )
            self.stop()
            live.handed_to = coming.attempt
            live.reason = f"handed over to spot attempt {coming.attempt} (make-before-break)"
        latest = self.checkpoints.latest_manifest()
        coming.step_start = latest.step if latest else 0
        st = self.state
        st.current, st.incoming = st.incoming, None
        assert isinstance(self.backend, HandsOver)
        self.backend.release_hold(coming.handle)

    def can_hand_over(self) -> bool:
        """Returns to spot may be make-before-break: a cluster's view (not the paper's
        replay) on a backend that can hold a launch (:class:`HandsOver`)."""
        return self.state.observe != "oracle" and isinstance(self.backend, HandsOver)

    def stop_coming(self, reason: str) -> None:
        """Cancel the spot attempt that was to take over; on-demand goes on."""
        coming = self.state.coming
        if coming is None:
            return
        status = self.backend.cancel(coming.handle)
        self.sync(coming, status)
        self.close(coming, status, time.time())
        coming.reason = reason

    def sync(self, rec: AttemptRecord, status: AttemptStatus) -> None:
        """Copy what ``status`` and the progress reports say into the record."""
        rec.granted_at = status.granted_at or rec.granted_at
        rec.started_at = status.started_at or rec.started_at
        prog = self.backend.progress(rec.handle)
        if prog is None:  # no progress channel (Kubernetes): the newest checkpoint of this attempt
            m = self.checkpoints.latest_manifest()
            if (
                m is not None
                and rec.started_at is not None  # a held return trains nothing before its release
                and m.created >= rec.launched_at
                and m.step > rec.step_start
            ):
                prog = {"step": m.step, "time": m.created, "checkpoint_step": m.step}
        if prog is not None:
            saw_progress(self.state, prog.get("checkpoint_step"))
            if rec.first_step is None:
                rec.first_step, rec.first_step_at = int(prog["step"]), float(prog["time"])
            rec.step_end, rec.last_step_at = int(prog["step"]), float(prog["time"])
            if prog.get("save_s") is not None:
                self._check_save_time(float(prog["save_s"]))

    def _check_save_time(self, save_s: float) -> None:
        """Warn once when a checkpoint save takes longer than a preempted attempt is given
        between the notice and the kill: the save on the notice would be cut off."""
        st = self.state
        st.save_s = max(st.save_s or 0.0, save_s)
        grace = self.backend.notice_to_kill_s
        if st.save_warned or grace is None or st.save_s <= grace:
            return
        st.save_warned = True
        log.warning(
            "A checkpoint save took %.1f s, longer than the %.1f s a preempted attempt has "
            "between the notice and the kill (backend notice_s + grace_s): the save made on a "
            "notice will be cut off and the steps since the previous save lost. Raise grace_s, "
            "or save less at a time.",
            st.save_s,
            grace,
        )

    # -- ending -----------------------------------------------------------------------------
    def close(self, rec: AttemptRecord, status: AttemptStatus, now: float) -> None:
        """The attempt ended: record its outcome, spend the budgets, release what it holds."""
        st = self.state
        rec.ended_at = status.ended_at or now
        rec.outcome = status.outcome.value if status.outcome else Outcome.INFRA_DISRUPTION.value
        rec.reason = status.reason
        rec.exit_code = status.exit_code
        ranks = status.evidence.get("ranks")  # a gang's: each rank's end, for the ledger and UI
        if isinstance(ranks, list):
            rec.ranks = [{k: r.get(k) for k in ("rank", "outcome", "exit_code")} for r in ranks]
        self._gang_costs(rec, status)
        if rec.outcome == Outcome.APP_FAILURE.value and rec.exit_code == STORAGE_EXIT:
            rec.outcome = Outcome.CHECKPOINT_UNWRITABLE.value  # a backend that does not know 73
        latest = self.checkpoints.latest_manifest()
        saw_checkpoint(st, self.checkpoints, self.ident, self.args.checkpoint_uri, latest, now)
        rec.ckpt_step_end = latest.step if latest else 0
        if rec.step_end is None:
            rec.step_end = rec.step_start
        total = self.args.total_steps_known(st, latest)
        if (
            rec.outcome == Outcome.SUCCEEDED.value
            and (status.evidence.get("notice_at") or status.evidence.get("notice")) is not None
            and (total is None or rec.ckpt_step_end < total)
        ):  # saved and exited cleanly on the notice, as a good training script may: reclaimed
            rec.outcome = Outcome.PREEMPTED.value
            rec.reason = "exited 0 after the reclaim notice with work left: spot capacity reclaimed"
        if st.coming is rec:
            st.incoming = None
        elif st.live is rec:  # not an unrecorded attempt closed beside the one that trains
            st.current = None
        failed = rec.outcome in (Outcome.APP_FAILURE.value, Outcome.OOM_KILLED.value)
        unwritable = rec.outcome == Outcome.CHECKPOINT_UNWRITABLE.value
        # the log goes with the pod: read it before the release deletes it
        tail = self.backend.log_tail(rec.handle) if failed or unwritable else ""
        self.backend.release(rec.handle, rec.outcome)
        self._spend(rec, failed, tail)
        if failed and rec.exit_code == CONFIG_EXIT:
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
            raise ConfigError(
                "command",
                f"the training process stopped on a configuration error (exit {CONFIG_EXIT}, "
                f"attempt {rec.attempt}): {last.strip() or rec.reason}; every launch would stop "
                "the same way, so none is retried: fix it and clear the task",
            )

    def _gang_costs(self, rec: AttemptRecord, status: AttemptStatus) -> None:
        """A gang's own figures from its backend: the node-seconds a partial gang held before it
        was given up (billed, as probe capacity found and not used, at the spot price per
        node), and how long its on-demand nodes took to come (the safety net's margin keeps
        the longest seen: the turn's JobSpec takes it where it outgrows the one given)."""
        st, ev = self.state, status.evidence
        held = ev.get("held_node_s")
        if held and rec.granted_at is None:
            since = ev.get("held_since") or rec.launched_at
            st.probe_found.append([float(since), float(held) * st.time_scale, rec.price])
        took = ev.get("acquired_s")
        if rec.capacity == Capacity.ON_DEMAND.value and isinstance(took, (int, float)):
            st.acquired_s = max(st.acquired_s, float(took))

    def _spend(self, rec: AttemptRecord, failed: bool, tail: str) -> None:
        """Count an ended attempt against its budget, and say so."""
        st = self.state
        if rec.outcome == Outcome.PREEMPTED.value:
            st.preemptions += 1
        elif failed:
            st.failures += 1
            log.error(
                "Attempt %d failed on healthy %s capacity: %s. Log tail:\n%s",
                rec.attempt,
                rec.capacity,
                rec.reason,
                tail,
            )
        elif rec.outcome == Outcome.INFRA_DISRUPTION.value:
            st.infra_disruptions += 1
        elif rec.outcome == Outcome.CHECKPOINT_UNWRITABLE.value:
            log.warning(
                "Attempt %d could not write its checkpoint: %s. The location, not the training "
                "code, failed: no budget is spent, and the next launch waits until the location "
                "takes writes. Log tail:\n%s",
                rec.attempt,
                rec.reason,
                tail,
            )
        lost = max(0, (rec.step_end or 0) - (rec.ckpt_step_end or 0))
        log.info(
            "Attempt %d on %s ended: %s (%s); progress step %s, checkpoint step %s, %d steps lost. "
            "Budgets: preemptions %d%s, failures %d/%d.",
            rec.attempt,
            rec.capacity,
            rec.outcome,
            rec.reason,
            rec.step_end,
            rec.ckpt_step_end,
            lost,
            st.preemptions,
            "" if self.args.max_preemptions is None else f"/{self.args.max_preemptions}",
            st.failures,
            self.args.max_failures,
        )

    def stop(self) -> AttemptRecord | None:
        """Cancel the live attempt and close its record (the caller says why)."""
        live = self.state.live
        if live is None:
            return None
        status = self.backend.cancel(live.handle)
        self.sync(live, status)
        self.close(live, status, time.time())
        return live

    # -- starting ---------------------------------------------------------------------------
    def launch(self, capacity: Capacity, job: JobSpec, hold: bool = False) -> AttemptRecord | None:
        """Start the next attempt on ``capacity`` from the newest checkpoint; ``hold``: a
        make-before-break return, launched while the live attempt trains on (it waits, ready,
        until :meth:`refresh_coming` hands over). None: not launched (:meth:`_held_back`)."""
        st = self.state
        n = len(st.attempts) + 1
        latest = self.checkpoints.latest_manifest()
        self._catch_up(latest)
        now = time.time()
        if self._held_back(latest, job, now):
            return None
        pool, price = "", job.on_demand_price
        if capacity is Capacity.SPOT:
            price = job.spot_price
            if self.capacity.priced():
                pool = self.capacity.choose_pool(now, job.spot_price)
                price = self.capacity.pool_price(pool, now, job.spot_price)
        self.before_launch()  # the state as it is now, kept before anything runs
        launch: Any = self.backend.launch  # ``hold`` only where the backend HandsOver
        lease_s = self.args.lease_s if isinstance(self.backend, Leases) else None
        lease = {"lease_until": now + lease_s} if lease_s else {}
        handle = launch(
            self.ident,
            n,
            capacity.value,
            list(self.args.command),
            checkpoint_uri=self.args.checkpoint_uri,
            changeover_wall_s=self.args.changeover.total_seconds(),
            market=self.capacity.market_of(pool),
            pool=pool,
            env=training_env(),
            **({"hold": True} if hold else {}),
            **lease,
        )
        if lease:  # renewed by every look (backends.base.look), the trigger's included
            handle.lease_s, handle.lease_until = lease_s, lease["lease_until"]
        step = latest.step if latest else 0
        rec = AttemptRecord(n, capacity.value, handle, now, step_start=step, price=price, pool=pool)
        if capacity is Capacity.SPOT:
            rec.prices.append([now, price])
        st.attempts.append(rec)
        if hold:
            st.incoming = len(st.attempts) - 1
        else:
            st.current = len(st.attempts) - 1
        log.info(
            "Launched attempt %d on %s%s at $%.4f/h from checkpoint step %d (%s).",
            n,
            capacity.value,
            f" in pool {pool}" if pool else "",
            price,
            rec.step_start,
            _where(handle),
        )
        return rec

    def _held_back(self, latest: Manifest | None, job: JobSpec, now: float) -> bool:
        """Before a launch: say if checkpoints vanished (and restore the claim); True while the
        location the last attempt could not write still takes no writes (``storage``)."""
        st, uri = self.state, self.args.checkpoint_uri
        saw_checkpoint(st, self.checkpoints, self.ident, uri, latest, now)
        return hold_back(st, self.checkpoints, uri, job, latest, now)

    def _catch_up(self, latest: Manifest | None) -> None:
        """Credit the ended attempt with a checkpoint it finished after its verdict. A real
        Eviction API (and a kubelet's graceful shutdown) writes its verdict while the
        container still saves on the notice, so the newest checkpoint at close time can lag
        the one it leaves; only one attempt trains at a time, so a newer checkpoint found at
        the next launch is that attempt's."""
        st = self.state
        # the last attempt that trained: a held spot attempt that ended before it was ready
        # (while on-demand trained on) saved nothing
        prev = next((a for a in reversed(st.attempts) if a.started_at is not None), None)
        if (
            prev is None
            or prev.ended_at is None
            or latest is None
            or latest.step <= max(prev.ckpt_step_end or 0, prev.step_start)
        ):
            return
        log.info(
            "Attempt %d saved checkpoint step %d after it was recorded as ended (at step %s): "
            "its record now says so.",
            prev.attempt,
            latest.step,
            prev.ckpt_step_end,
        )
        prev.ckpt_step_end = latest.step
        prev.step_end = max(prev.step_end or 0, latest.step)


def training_env() -> dict[str, str]:
    """What the training process gets of the provider's settings (it has no Airflow
    configuration): the S3 retry budget, as ``AIRFLOW_SPOT_S3_RETRY_S``."""
    from airflow_spot.settings import S3_RETRY_ENV, s3_retry_s

    return {S3_RETRY_ENV: f"{s3_retry_s():g}"}


def _where(handle: AttemptHandle) -> str:
    if handle.run_dir is not None:
        return handle.run_dir
    return f"pod {handle.namespace}/{handle.pod}"
