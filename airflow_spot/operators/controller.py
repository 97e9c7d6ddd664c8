"""One turn of the operator's loop: look, record, decide, act. Airflow-free except for the
operator object it serves (its arguments) and the task state store the operator writes."""

from __future__ import annotations

import logging
import math
import os
import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_spot.backends.base import AttemptStatus, Outcome
from airflow_spot.backends.local.market import Pools
from airflow_spot.checkpoint.manifest import Checkpoints, Manifest
from airflow_spot.checkpoint.training import CONFIG_EXIT
from airflow_spot.exceptions import (
    BackendError,
    ConfigError,
    FailureBudgetExhausted,
    InfeasibleDeadline,
    PreemptionBudgetExhausted,
)
from airflow_spot.jobstate import AttemptRecord, JobState
from airflow_spot.policy import HOUR, Capacity, Decision, JobSpec, Observation, get_policy
from airflow_spot.policy import plan as plan_mod
from airflow_spot.triggers.events import EventKind, SpotEvent

if TYPE_CHECKING:
    from airflow_spot.operators.spot_training import SpotTrainingOperator

log = logging.getLogger("airflow_spot.controller")
MAX_INFRA_DISRUPTIONS = 20
MIN_STEPS_FOR_RATE = 10
GUARD_SHARE = 0.02  # of the work left, kept back from the deadline for throughput noise


@dataclass
class StepResult:
    done: bool
    summary: dict[str, Any] | None = None
    wake_at: float = 0.0


class Controller:
    """Runs one turn at a time over a :class:`JobState`, for one operator."""

    def __init__(self, op: SpotTrainingOperator, state: JobState, context: Any) -> None:
        self.op = op
        self.state = state
        self.context = context
        self.backend = op._backend()
        self.pools = Pools.load(state.market) if state.market else None
        self.checkpoint_uri = str(op.checkpoint_uri)
        self.checkpoints = Checkpoints.watching(op.checkpoint_store())
        self.policy = get_policy(op.policy)
        if plan_mod.CACHE_DIR is None:  # a deferred task resumes in a new process: keep plans
            plan_mod.CACHE_DIR = os.environ.get("AIRFLOW_SPOT_PLAN_CACHE") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                "airflow-spot",
                "plans",
            )
        self.command = (
            shlex.split(op.command) if isinstance(op.command, str) else list(op.command or [])
        )

    # -- one turn ---------------------------------------------------------------------------
    def advance(self, event: SpotEvent | None) -> StepResult:
        now = time.time()
        st = self.state
        if event is not None and event.kind is EventKind.ERROR:
            log.warning("The watcher reported an error (%s); looking again.", event.message)
        live = st.live
        if (
            event is not None
            and event.handle
            and live is not None
            and _same_attempt(event.handle, live.handle)
        ):
            live.handle.update(event.handle)  # what the watcher recorded (node, capacity, notices)
        spot = (
            self.pools.available_at(now, self._cooling(now))
            if self.pools
            else self._spot_guess(now)
        )
        st.see_spot(spot, now)
        ended = self._refresh_live(now)
        if ended is not None and ended.outcome == Outcome.SUCCEEDED.value:
            done = self._finish_if_complete(now)
            if done is not None:
                return StepResult(True, summary=done)
        if st.failures > self.op.max_failures:
            last = next(
                (a for a in reversed(st.attempts) if a.outcome in ("app_failure", "oom_killed")),
                None,
            )
            raise FailureBudgetExhausted(
                f"{st.failures} application failures exceed max_failures={self.op.max_failures}; last: attempt "
                f"{last.attempt if last else '?'} {last.reason if last else ''}. Preemptions so far: {st.preemptions} "
                "(they never count here). Fix the training code or raise max_failures."
            )
        if st.infra_disruptions - st.infra_base > MAX_INFRA_DISRUPTIONS:
            raise BackendError(
                f"{st.infra_disruptions - st.infra_base} attempts lost to infrastructure in this "
                "try; giving up on it"
            )
        live = st.live
        if (
            live is not None
            and live.capacity == "spot"
            and live.launch_began_at is not None
            and self._pool_down(live, now, spot)
        ):
            # capacity granted is being reclaimed: the verdict arrives within notice + grace;
            # wait for it. (A request still waiting for capacity has no verdict coming: the
            # policy decides, as for any look while spot is down.)
            return StepResult(False, wake_at=now + self.op.poll_interval)
        self._track_price(now)
        decision, job, obs = self._decide(now, spot)
        if decision.rule == "done":  # the progress reports say all the work is done
            done = self._complete(now)
            if done is not None:
                return StepResult(True, summary=done)
            # the newest valid checkpoint does not hold it yet: keep what runs, look again
            return StepResult(False, wake_at=now + self.op.poll_interval)
        self._act(decision, job)
        self._snapshot(now, job, obs)
        return StepResult(False, wake_at=now + self.op.decision_interval.total_seconds())

    def _snapshot(self, now: float, job: JobSpec, obs: Observation) -> None:
        """A small live summary for the UI (the ledger so far and an estimated finish)."""
        snap = self._unfinished_summary(now, deadline_met=None)  # not known until it ends
        remaining = max(0.0, job.work_s - obs.done_s)
        extra = 0.0 if obs.capacity is not Capacity.NONE else job.changeover_s
        snap["estimated_finish_hours"] = round(
            (obs.now + remaining + extra + obs.changeover_left_s) / HOUR, 4
        )
        self.state.snapshot = snap

    def _pool_down(self, live: AttemptRecord, now: float, spot: bool | None) -> bool:
        """The replayed market has taken the live attempt's spot capacity (its verdict is coming).
        Without a replayed market (Kubernetes) the pod's own status says so: never wait here."""
        if not self.pools:
            return False
        if live.pool in self.pools.names:
            return not self.pools.market(live.pool).available_at(now)
        return spot is False

    def _cooling(self, now: float) -> set[str]:
        """Pools that lost the job's spot capacity less than their cool-down ago (kept out)."""
        return set(self.cooling_until(now))

    def cooling_until(self, now: float) -> dict[str, float]:
        """The pools kept out now, each with the wall time its cool-down ends."""
        lost: tuple[str, ...] = ("preempted",)
        if self.pools:
            cool = self.pools.cooldown_wall_s
        else:  # Kubernetes node pools: pending too long also means "no capacity there"
            cool, lost = (
                float(getattr(self.backend, "spot_cooldown_s", 0.0)),
                ("preempted", "spot_unavailable"),
            )
        out: dict[str, float] = {}
        for a in self.state.attempts:
            ended = a.ended_at
            if a.capacity == "spot" and a.pool and a.outcome in lost and ended:
                until = ended + cool
                if now < until:
                    out[a.pool] = max(out.get(a.pool, 0.0), until)
        return out

    @property
    def kube_pools(self) -> dict[str, Any]:
        return {p.name: p for p in getattr(self.backend, "pools", ())} if not self.pools else {}

    def _pool_price(self, name: str, now: float, default: float) -> float:
        if self.pools:
            return self.pools.price(name, now, default, self._live_price)
        pool = self.kube_pools[name]
        if pool.price_from:
            return self._live_price(pool.price_from)
        return pool.spot_price if pool.spot_price is not None else default

    def _choose_pool(self, now: float, default: float) -> str:
        if self.pools:
            return (
                self.pools.choose(now, self._cooling(now), default, self._live_price)
                or self.pools.names[0]
            )
        cooling = self._cooling(now)
        names = [n for n in self.kube_pools if n not in cooling] or list(self.kube_pools)
        return min(names, key=lambda n: (self._pool_price(n, now, default), n))

    def _track_price(self, now: float) -> None:
        """Record the live spot attempt's price when its pool's price changes (the ledger bills by it)."""
        live = self.state.live
        if live is None or live.capacity != "spot" or not live.pool:
            return
        price = self._pool_price(live.pool, now, self.op.spot_price)
        if not live.prices or live.prices[-1][1] != price:
            live.prices.append([now, price])

    def _live_price(self, source: dict[str, Any]) -> float:
        """A pool's live spot price through its Airflow AWS connection (cached by the hook)."""
        key = (source.get("aws_conn_id"), source.get("region_name"))
        hooks = self.__dict__.setdefault("_hooks", {})
        if key not in hooks:
            from airflow_spot.hooks.aws import SpotMarketHook

            hooks[key] = SpotMarketHook(aws_conn_id=key[0], region_name=key[1])
        prices = hooks[key].current_spot_prices(source["instance_type"], [source["zone"]])
        if source["zone"] not in prices:
            raise BackendError(
                f"no live spot price for {source['instance_type']} in {source['zone']}"
            )
        return prices[source["zone"]]

    def _spot_guess(self, now: float) -> bool:
        """Without a replayed market: spot counts as down for a cool-down after it was lost
        (with several node pools: while every pool is cooling down)."""
        if self.kube_pools:
            return bool(set(self.kube_pools) - self._cooling(now))
        cooldown = float(getattr(self.backend, "spot_cooldown_s", 900.0))
        for a in reversed(self.state.attempts):
            if (
                a.capacity == "spot"
                and a.outcome in ("preempted", "spot_unavailable")
                and a.ended_at
            ):
                return now - a.ended_at >= cooldown
        return True

    def wait_here(self, wake_at: float) -> SpotEvent:
        """Synchronous mode: poll in the worker until something happens."""
        from airflow_spot.triggers.watch import Watch

        live = self.state.live
        backend = (
            self.backend.to_dict() if getattr(self.backend, "name", "") == "kubernetes" else None
        )
        watch = Watch(
            live.handle if live else None,
            self.state.market,
            self.state.spot_last,
            wake_at,
            backend,
            self.cooling_until(time.time()),
        )
        while True:
            ev = watch.poll_once()
            if ev is not None:
                return ev
            time.sleep(self.op.poll_interval)

    # -- looking ----------------------------------------------------------------------------
    def _refresh_live(self, now: float) -> AttemptRecord | None:
        live = self.state.live
        if live is None:
            return None
        status = self.backend.status(live.handle)
        self._sync(live, status)
        if not status.terminal:
            return None
        self._close(live, status, now)
        return live

    def _sync(self, rec: AttemptRecord, status: AttemptStatus) -> None:
        rec.launch_began_at = status.granted_at or rec.launch_began_at
        rec.started_at = status.started_at or rec.started_at
        prog = self.backend.progress(rec.handle)
        if prog is None:  # no progress channel (Kubernetes): the newest checkpoint of this attempt
            m = self.checkpoints.latest_manifest()
            if m is not None and m.created >= rec.launched_at and m.step > rec.step_start:
                prog = {"step": m.step, "time": m.created}
        if prog is not None:
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
        # the local backend's notice + grace; a pod's grace is its node's (and the pod has no
        # progress channel to report save times on)
        grace = getattr(self.backend, "grace_s", None)
        if st.save_warned or grace is None:
            return
        grace += getattr(self.backend, "notice_s", 0.0)
        if st.save_s <= grace:
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

    def _close(self, rec: AttemptRecord, status: AttemptStatus, now: float) -> None:
        st = self.state
        rec.ended_at = status.ended_at or now
        rec.outcome = status.outcome.value if status.outcome else Outcome.INFRA_DISRUPTION.value
        rec.reason = status.reason
        rec.exit_code = status.exit_code
        latest = self.checkpoints.latest_manifest()
        rec.ckpt_step_end = latest.step if latest else 0
        if rec.step_end is None:
            rec.step_end = rec.step_start
        total = self._total_steps(latest)
        if (
            rec.outcome == Outcome.SUCCEEDED.value
            and (status.evidence.get("notice_at") or status.evidence.get("notice")) is not None
            and (total is None or rec.ckpt_step_end < total)
        ):  # saved and exited cleanly on the notice, as a good training script may: reclaimed
            rec.outcome = Outcome.PREEMPTED.value
            rec.reason = "exited 0 after the reclaim notice with work left: spot capacity reclaimed"
        st.current = None
        outcome = rec.outcome
        failed = outcome in (Outcome.APP_FAILURE.value, Outcome.OOM_KILLED.value)
        # the log goes with the pod: read it before the cleanup deletes it
        tail = self.backend.log_tail(rec.handle) if failed else ""
        self.backend.cleanup(rec.handle, rec.outcome)
        if outcome == Outcome.PREEMPTED.value:
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
        elif outcome == Outcome.INFRA_DISRUPTION.value:
            st.infra_disruptions += 1
        lost = max(0, (rec.step_end or 0) - (rec.ckpt_step_end or 0))
        log.info(
            "Attempt %d on %s ended: %s (%s); progress step %s, checkpoint step %s, %d steps lost. "
            "Budgets: preemptions %d%s, failures %d/%d.",
            rec.attempt,
            rec.capacity,
            outcome,
            rec.reason,
            rec.step_end,
            rec.ckpt_step_end,
            lost,
            st.preemptions,
            "" if self.op.max_preemptions is None else f"/{self.op.max_preemptions}",
            st.failures,
            self.op.max_failures,
        )
        if failed and rec.exit_code == CONFIG_EXIT:
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
            raise ConfigError(
                "command",
                f"the training process stopped on a configuration error (exit {CONFIG_EXIT}, "
                f"attempt {rec.attempt}): {last.strip() or rec.reason}; every launch would stop "
                "the same way, so none is retried: fix it and clear the task",
            )

    def _complete(self, now: float) -> dict[str, Any] | None:
        """All the work is checkpointed though the attempt has not reported its end yet: stop
        it (its outcome is success, not a cancel) and finish the job."""
        m = self.checkpoints.latest_valid()
        total = self._total_steps(m)
        if m is None or total is None or m.step < total:
            return None  # the manifest said so, but the files do not verify yet: look again
        live = self.state.live
        if live is not None:
            status = self.backend.cancel(live.handle)
            self._sync(live, status)
            self._close(live, status, time.time())
            live.outcome, live.reason = (
                Outcome.SUCCEEDED.value,
                "all work checkpointed; attempt stopped",
            )
        return self._finish_if_complete(now)

    def _finish_if_complete(self, now: float) -> dict[str, Any] | None:
        m = self.checkpoints.latest_valid()
        total = self._total_steps(m)
        if m is None or total is None or m.step < total:
            rec = self.state.attempts[-1]
            rec.outcome = Outcome.APP_FAILURE.value
            rec.reason = f"exited 0 but the newest valid checkpoint is at step {m.step if m else 0} of {total}"
            self.state.failures += 1
            if m is None and self.checkpoints.latest_manifest() is None:
                # nothing at all was checkpointed: every retry would run the whole command again
                raise ConfigError(
                    "command",
                    f"the training command exited 0 but never wrote a checkpoint to "
                    f"{self.op.checkpoint_uri}, so the job could neither resume after a "
                    "preemption nor count as done; save checkpoints with "
                    "airflow_spot.checkpoint.TrainingSession (it reads the location from "
                    "$AIRFLOW_SPOT_CHECKPOINT_URI) and tell it the total steps",
                )
            log.error(
                "Attempt %d %s; counting it as an application failure.", rec.attempt, rec.reason
            )
            return None
        summary = self.summary(now, m)
        # kept once in the task state store (Airflow warns above 64 KB): the decisions are in
        # the state's own list, and the live snapshot is superseded
        self.state.finished = {k: v for k, v in summary.items() if k != "decisions"}
        self.state.snapshot = None
        self._emit(summary)
        log.info("Job complete: %s", _one_line(summary))
        return summary

    def failed_for_good(self, now: float) -> None:
        """The task fails for good: the UI's snapshot and the metrics say the deadline is
        missed (no model comes out of this job), with what was spent until now."""
        try:
            snap = self._unfinished_summary(now, deadline_met=False)
        except Exception as e:  # noqa: BLE001 - reporting must not hide the task's own error
            log.warning("Could not summarise the failed job: %s", e)
            return
        self.state.snapshot = snap
        self._emit(snap)

    def _unfinished_summary(self, now: float, deadline_met: bool | None) -> dict[str, Any]:
        """The ledger so far, for a job that has not finished (no decision log, no finish)."""
        snap = self.summary(now, None)
        snap.pop("decisions", None)
        snap["finished_hours"] = None
        snap["deadline_met"] = deadline_met
        snap["savings"] = None  # against the whole job on on-demand: only once it is done
        return snap

    def _emit(self, summary: dict[str, Any]) -> None:
        from airflow_spot.operators.metrics import emit

        ti = self.context["ti"]
        try:
            emit(summary, ti.dag_id, ti.task_id)
        except Exception as e:  # noqa: BLE001 - metrics must never fail a job
            log.warning("Could not send metrics: %s", e)

    # -- deciding ---------------------------------------------------------------------------
    def _total_steps(self, m: Manifest | None) -> int | None:
        total = self.op.total_steps or self.state.total_steps
        if total and m is not None and m.total_steps and m.total_steps != total:
            raise ConfigError(
                "total_steps",
                f"the operator says {total} but the training script's checkpoints say "
                f"{m.total_steps} (checkpoint {m.name}); make them agree (the job would stop "
                "early or never count as done)",
            )
        return total or (m.total_steps if m else None)

    def seconds_per_step(self, total: int) -> float:
        """Market seconds per step: measured once enough steps ran, else from expected_compute."""
        steps, secs = self.state.throughput()
        if steps >= MIN_STEPS_FOR_RATE and secs > 0:
            return secs / steps
        assert self.op.expected_compute is not None  # validated at parse time
        return self.op.expected_compute.total_seconds() * self.state.time_scale / total

    def _guard(self, steps_left: int, sps: float, work_s: float, changeover: float) -> float:
        """Market seconds the policy keeps back from the deadline for what the plan takes as
        certain but a live run is not: the latest attempt running slower than the mean rate,
        GUARD_SHARE of the work left (throughput noise), and two looks (a finish or a verdict
        is seen up to a look late). Never more than the whole job's slack (the policy then
        plans with none, and the feasibility check uses the true deadline)."""
        st = self.state
        latest = st.latest_seconds_per_step(MIN_STEPS_FOR_RATE) or sps
        left = max(0, steps_left)
        guard = (
            left * max(0.0, latest - sps)
            + GUARD_SHARE * left * sps
            + 2 * self.op.poll_interval * st.time_scale
        )
        return min(guard, max(0.0, st.deadline_s - work_s - changeover))

    def _decide(self, now: float, spot: bool | None) -> tuple[Decision, JobSpec, Observation]:
        st = self.state
        latest = self.checkpoints.latest_manifest()
        total = self._total_steps(latest)
        if total is None:
            raise InfeasibleDeadline(
                "total_steps",
                "unknown: give total_steps or write it into the checkpoints' manifests",
            )
        st.total_steps = total
        if latest is not None and latest.step >= total:
            latest = self.checkpoints.latest_valid()  # done only if its files are whole
        sps = self.seconds_per_step(total)
        done_steps = latest.step if latest else 0
        scale = st.time_scale
        changeover = st.measured_changeover_s(sps)
        if changeover is None:
            changeover = self.op.changeover.total_seconds() * scale
        elif changeover > 0:  # on a grid of 16 steps per octave: the plan is not re-solved
            changeover = 2 ** (round(16 * math.log2(changeover)) / 16)  # for every new mean
        live = st.live
        reported = done_steps  # at best: the running attempt's latest progress report
        if live is not None and live.started_at is not None and live.step_end is not None:
            reported = max(done_steps, live.step_end)
            if live.capacity == Capacity.ON_DEMAND.value:
                done_steps = reported  # on-demand progress is not taken back (spot's may be)
        work_s, done_s, now_m = total * sps, done_steps * sps, st.market_s(now)
        guard = self._guard(total - reported, sps, work_s, changeover)
        try:
            job = JobSpec(
                work_s,
                st.deadline_s - guard,
                changeover,
                self.op.spot_price,
                self.op.on_demand_price,
                tick_s=self.op.decision_interval.total_seconds() * scale,
                max_preemptions=self.op.max_preemptions,
            )
        except ConfigError as e:
            if e.field != "deadline_s":
                raise
            raise InfeasibleDeadline(  # the work at the measured rate no longer fits
                "deadline",
                f"at the measured {sps:.1f} s per step ({sps * total / HOUR:.2f} h for {total} "
                f"steps): {e}",
            ) from e
        cap = Capacity(live.capacity) if live else Capacity.NONE
        left = 0.0
        if live is not None and live.started_at is None:
            began = live.launch_began_at or now
            left = max(0.0, changeover - st.market_s(now) + st.market_s(began))
        remaining, time_left = work_s - done_s, st.deadline_s - now_m
        # at best: a running instance (spot included) goes on; one still launching pays what
        # is left of its changeover; with none, a launch pays a whole one
        best = work_s - reported * sps + (changeover if live is None else left)
        if remaining > 0 and best > time_left + job.tick_s:
            raise InfeasibleDeadline(
                "deadline",
                f"cannot be met any more: at best {_dur(best)} of work and changeover > "
                f"{_dur(time_left)} left (measured {sps:.1f} s per step); give more time or cut "
                "the work",
            )
        obs = Observation(
            now_m,
            done_s,
            cap,
            spot,
            left,
            st.preemptions,
            st.spot_age_s(now),
            st.spot_down_s,
            st.spot_last_up_s,
            st.spot_last_down_s,
        )
        decision = self.policy.decide(job, obs)
        if (  # budget spent: no more spot, and no waiting for it either
            decision.capacity is not Capacity.ON_DEMAND
            and decision.rule != "done"
            and self.op.max_preemptions is not None
            and st.preemptions > self.op.max_preemptions
        ):
            if self.op.on_preemption_budget == "fail":
                raise PreemptionBudgetExhausted(
                    f"{st.preemptions} preemptions exceed max_preemptions={self.op.max_preemptions} "
                    f"(on_preemption_budget='fail'); application failures so far: {st.failures}"
                )
            decision = Decision(
                Capacity.ON_DEMAND, "budget_spent", (st.preemptions, self.op.max_preemptions)
            )
        st.record_decision(now, decision.capacity.value, decision.reason, done_steps)
        log.info(
            "[spot] t=%.2f h, done %d/%d steps (%.1f%%), %s%s: %s -> %s",
            now_m / HOUR,
            done_steps,
            total,
            100 * done_steps / total,
            f"attempt {live.attempt} on {live.capacity}" if live else "idle",
            "" if spot is None else f", spot {'up' if spot else 'down'}",
            decision.reason,
            decision.capacity.value,
        )
        return decision, job, obs

    # -- acting -----------------------------------------------------------------------------
    def _act(self, decision: Decision, job: JobSpec) -> None:
        live = self.state.live
        want = decision.capacity
        reason = f"stopped to switch to {want.value}: {decision.reason}"
        if live is not None and Capacity(live.capacity) is want:
            if not self._stranded(live, time.time()):
                return
            reason = f"moved: pool {live.pool} has no spot capacity while another pool has"
        if live is not None:
            log.info("Switching away from %s: cancelling attempt %d.", live.capacity, live.attempt)
            status = self.backend.cancel(live.handle)
            self._sync(live, status)
            self._close(live, status, time.time())
            live.reason = reason
        if want is Capacity.NONE:
            return
        self._launch(want, job)

    def _stranded(self, live: AttemptRecord, now: float) -> bool:
        """A spot request still waiting for capacity in a pool that is down, while another
        pool (not cooling down) has capacity: cheaper to move it than to wait."""
        pools = self.pools
        return bool(
            pools is not None
            and live.capacity == Capacity.SPOT.value
            and live.launch_began_at is None
            and live.started_at is None
            and live.pool in pools.names
            and not pools.market(live.pool).available_at(now)
            and pools.available_at(now, self._cooling(now) | {live.pool})
        )

    def _launch(self, capacity: Capacity, job: JobSpec) -> None:
        st = self.state
        ti = self.context["ti"]
        n = len(st.attempts) + 1
        latest = self.checkpoints.latest_manifest()
        ident = {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "map_index": getattr(ti, "map_index", -1),
            "try_number": getattr(ti, "try_number", 1),
        }
        now = time.time()
        pool, market, price = "", None, job.on_demand_price
        if capacity is Capacity.SPOT:
            price = job.spot_price
            if self.pools or self.kube_pools:
                pool = self._choose_pool(now, job.spot_price)
                price = self._pool_price(pool, now, job.spot_price)
        if self.pools:
            market = self.pools.market(pool or self.pools.names[0]).spec
        handle = self.backend.launch(
            ident,
            n,
            capacity.value,
            self.command,
            checkpoint_uri=self.checkpoint_uri,
            changeover_wall_s=self.op.changeover.total_seconds(),
            market=market,
            pool=pool,
        )
        rec = AttemptRecord(
            n,
            capacity.value,
            handle,
            now,
            step_start=latest.step if latest else 0,
            price=price,
            pool=pool,
        )
        if capacity is Capacity.SPOT:
            rec.prices.append([now, price])
        st.attempts.append(rec)
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

    def abandon(self) -> None:
        """Cancel the live attempt (the task is failing for good); nothing is left running."""
        live = self.state.live
        if live is not None:
            log.warning("Stopping attempt %d: the task is failing.", live.attempt)
            status = self.backend.cancel(live.handle)
            self._sync(live, status)
            self._close(live, status, time.time())

    # -- reporting --------------------------------------------------------------------------
    def summary(self, now: float, final: Manifest | None) -> dict[str, Any]:
        st = self.state
        last = st.attempts[-1] if st.attempts else None
        if (
            final is not None
            and last is not None
            and last.outcome == Outcome.SUCCEEDED.value
            and last.ended_at is not None
        ):  # the job ended with its attempt, not when a later look (or try) saw that it had
            now = min(now, last.ended_at)
        total = self._total_steps(final) or 1
        sps = self.seconds_per_step(total)
        led = st.ledger(now, sps, self.op.on_demand_price, total * sps)
        led.finished_s = st.market_s(now)
        out = led.summary()
        out.update(
            {
                "policy": self.op.policy,
                "on_demand_price": self.op.on_demand_price,
                "spot_price": self.op.spot_price,
                "time_scale": st.time_scale,
                "deadline_hours": round(st.deadline_s / HOUR, 4),
                "attempts": [
                    {
                        "attempt": a.attempt,
                        "capacity": a.capacity,
                        "launched_h": round(st.market_s(a.launched_at) / HOUR, 4),
                        "start_h": None
                        if a.started_at is None
                        else round(st.market_s(a.started_at) / HOUR, 4),
                        "end_h": None
                        if a.ended_at is None
                        else round(st.market_s(a.ended_at) / HOUR, 4),
                        "outcome": a.outcome,
                        "reason": a.reason,
                        "exit_code": a.exit_code,
                        "step_start": a.step_start,
                        "step_end": a.step_end,
                        "checkpoint_step_end": a.ckpt_step_end,
                    }
                    for a in st.attempts
                ],
                "failures": st.failures,
                "infra_disruptions": st.infra_disruptions,
                "fallbacks_to_on_demand": sum(
                    1
                    for a, b in zip(st.attempts, st.attempts[1:], strict=False)
                    if a.capacity == "spot" and b.capacity == "on_demand"
                ),
                "returns_to_spot": sum(
                    1
                    for a, b in zip(st.attempts, st.attempts[1:], strict=False)
                    if a.capacity == "on_demand" and b.capacity == "spot"
                ),
                "final_checkpoint": None
                if final is None
                else {
                    "name": final.name,
                    "step": final.step,
                    "metrics": final.metrics,
                    "uri": f"{self.checkpoint_uri.rstrip('/')}/{final.name}",
                },
                "decisions": st.decisions,
                "decisions_dropped": st.decisions_dropped,
            }
        )
        return out


# What the task returns as its XCom: the same figures, with the lists bounded (a long job with
# many price changes and decisions gave 240 KB to 1 MB). The task state store keeps them whole
# for the UI.
XCOM_DECISIONS = 50
XCOM_SEGMENTS = 200
XCOM_ATTEMPTS = 100


def xcom_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with the last XCOM_DECISIONS decisions and XCOM_ATTEMPTS attempts, and
    segments merged across price changes (time-weighted price, same cost) once there are more
    than XCOM_SEGMENTS, then the last XCOM_SEGMENTS of them; ``*_omitted`` counts the rest."""
    out = dict(summary)
    segs = out.get("segments") or []
    if len(segs) > XCOM_SEGMENTS:
        segs = _merge_price_pieces(segs)
    for key, keep in (
        ("decisions", XCOM_DECISIONS),
        ("attempts", XCOM_ATTEMPTS),
        ("segments", XCOM_SEGMENTS),
    ):
        items = segs if key == "segments" else out.get(key) or []
        out[key] = items[-keep:]
        dropped = len(items) - len(out[key])
        if key == "decisions":
            dropped += int(out.get("decisions_dropped") or 0)
            out.pop("decisions_dropped", None)
        out[f"{key}_omitted"] = dropped
    return out


def _merge_price_pieces(segs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent segments of one attempt, capacity, phase and pool become one."""
    keys = ("attempt", "capacity", "phase", "pool")
    out: list[dict[str, Any]] = []
    for s in segs:
        prev = out[-1] if out else None
        if (
            prev is not None
            and all(prev.get(k) == s.get(k) for k in keys)
            and abs(prev["end_s"] - s["start_s"]) < 1e-6
        ):
            a, b = prev["end_s"] - prev["start_s"], s["end_s"] - s["start_s"]
            if a + b > 0:
                prev["price_per_h"] = (prev["price_per_h"] * a + s["price_per_h"] * b) / (a + b)
            prev.update(
                end_s=s["end_s"],
                progress_end_s=s["progress_end_s"],
                ended_by=s["ended_by"],
                lost_s=prev["lost_s"] + s["lost_s"],
            )
        else:
            out.append(dict(s))
    return out


def _same_attempt(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("run_dir", "pod", "attempt")
    return all(a.get(k) == b.get(k) for k in keys)


def _dur(seconds: float) -> str:
    return f"{seconds / HOUR:.2f} h" if abs(seconds) >= 360 else f"{seconds:.0f} s"


def _where(handle: dict[str, Any]) -> str:
    if "run_dir" in handle:
        return str(handle["run_dir"])
    return f"pod {handle.get('namespace')}/{handle.get('pod')}"


def _one_line(s: dict[str, Any]) -> str:
    return (
        f"cost ${s['cost']:.2f} vs ${s['on_demand_cost']:.2f} all on-demand (savings {100 * s['savings']:.1f}%), "
        f"spot {s['spot_hours']:.2f} h, on-demand {s['on_demand_hours']:.2f} h, idle {s['idle_hours']:.2f} h, "
        f"{s['preemptions']} preemptions, {s['work_lost_hours']:.2f} h of work lost, deadline met: {s['deadline_met']}"
    )
