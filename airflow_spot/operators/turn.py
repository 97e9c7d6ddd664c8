"""One turn of the operator's loop: look, record, decide, act. Airflow-free: it gets the
operator's rendered arguments (:class:`JobArgs`), the task instance's identity, a backend, the
job's state and its checkpoints, never the operator itself."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from airflow_spot.backends.base import Backend, Outcome
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.exceptions import (
    BackendError,
    ConfigError,
    FailureBudgetExhausted,
    InfeasibleDeadline,
    PreemptionBudgetExhausted,
)
from airflow_spot.jobstate import JobState
from airflow_spot.operators.attempt import LiveAttempt
from airflow_spot.operators.capacity import SpotCapacity
from airflow_spot.operators.failure_reserve import failure_reserve_s
from airflow_spot.operators.job import MIN_STEPS_FOR_RATE, JobArgs, Progress, TaskIdentity
from airflow_spot.operators.summary import Report
from airflow_spot.policy import HOUR, Capacity, Decision, JobSpec, Observation, get_policy
from airflow_spot.policy.model import SpotView, observe
from airflow_spot.settings import plan_cache
from airflow_spot.triggers.events import EventKind, SpotEvent

log = logging.getLogger(__name__)
MAX_INFRA_DISRUPTIONS = 20
GUARD_SHARE = 0.02  # of the work left, kept back from the deadline for throughput noise
LOOKS_KEPT = 20  # the turns whose lateness the guard keeps (the largest of them)


@dataclass
class StepResult:
    done: bool
    summary: dict[str, Any] | None = None
    wake_at: float = 0.0


class Turn:
    """Runs one turn at a time over a :class:`JobState`."""

    def __init__(
        self,
        args: JobArgs,
        ident: TaskIdentity,
        backend: Backend,
        state: JobState,
        checkpoints: Checkpoints,
    ) -> None:
        self.args = args
        self.ident = ident
        self.backend = backend
        self.state = state
        self.checkpoints = checkpoints
        self.capacity = SpotCapacity(backend, state)
        self.attempt = LiveAttempt(args, ident, backend, state, checkpoints, self.capacity)
        self.report = Report(args, ident, state)
        # kept for a process without the operator (see operators/unwatched.py), as JSON values
        # (the task state store takes nothing else: a settings tuple becomes a list)
        state.backend, state.args = json.loads(json.dumps([backend.to_dict(), args.to_dict()]))
        # a deferred task resumes in a new process: its plans are kept on disk
        self.policy = get_policy(args.policy, plan_cache=plan_cache())

    # -- one turn ---------------------------------------------------------------------------
    def advance(self, now: float, event: SpotEvent | None) -> StepResult:
        """One turn at wall time ``now``, after the watcher's ``event`` (if any)."""
        st = self.state
        if event is not None and event.kind is EventKind.ERROR:
            log.warning("The watcher reported an error (%s); looking again.", event.message)
        self._woke(now, event)
        live = st.live
        if event is not None and event.handle and live and event.handle.same_attempt(live.handle):
            live.handle = event.handle  # what the watcher recorded (node, capacity, notices)
        ended, view = self._look(now)
        spot = view.available
        if ended is not None and ended.outcome == Outcome.SUCCEEDED.value:
            done = self._finish_if_complete(now)
            if done is not None:
                return StepResult(True, summary=done)
        self._check_budgets()
        live = st.live
        if (
            live is not None
            and live.capacity == "spot"
            and live.granted_at is not None
            and self.capacity.pool_down(live, now, spot)
        ):
            # capacity granted is being reclaimed: the verdict arrives within notice + grace;
            # wait for it. (A request still waiting for capacity has no verdict coming: the
            # policy decides, as for any look while spot is down.)
            return StepResult(False, wake_at=now + self.args.poll_interval)
        self.capacity.track_price(now, self.args.spot_price)
        decision, job, obs = self.decide(now, view)
        if decision.rule == "done":  # the progress reports say all the work is done
            if self.args.returns and st.live is not None:  # its function returns after it:
                return StepResult(False, wake_at=now + self.args.poll_interval)  # let it end
            done = self._complete(now)
            if done is not None:
                return StepResult(True, summary=done)
            # the newest valid checkpoint does not hold it yet: keep what runs, look again
            return StepResult(False, wake_at=now + self.args.poll_interval)
        if not self.capacity.oracle:
            holds_spot = any(
                a is not None and a.capacity == Capacity.SPOT.value for a in (st.live, st.coming)
            )
            self.capacity.settle_probe(
                now,
                decision.capacity is Capacity.SPOT,
                decision.look and not holds_spot,
                self.ident,
                job,
            )
        self.act(decision, job, now)
        self.report.snapshot(now, job, obs)
        if st.coming is not None:  # a return to spot: hand over as soon as it is ready
            return StepResult(False, wake_at=now + self.args.poll_interval)
        return StepResult(False, wake_at=now + self.args.decision_interval.total_seconds())

    def _woke(self, now: float, event: SpotEvent | None) -> None:
        """Keep how long after the watcher's event this turn began (a scheduler and executor
        between a trigger and its task take seconds, a busy one minutes): the guard's look."""
        if event is not None:
            late = round(max(0.0, now - event.at), 3)
            self.state.looks_late = [*self.state.looks_late[1 - LOOKS_KEPT :], late]

    def _look(self, now: float) -> tuple[Any, SpotView]:
        """Read the attempts and what shows spot; returns the attempt that ended (if any) and
        what the policy may take as known of spot (``JobState.spot_view``)."""
        st = self.state
        oracle = self.capacity.oracle
        # under the oracle the market is read before the verdicts (as it always was)
        facts = self.capacity.facts(now, self._settle_s()) if oracle else []
        ended = self.attempt.refresh(now)
        self.attempt.refresh_coming(now)
        if not oracle:  # a cluster shows spot through what happened to the job's attempts
            facts = self.capacity.facts(now, self._settle_s())
        for up, at, source in facts:
            st.see_spot(up, now, source, at)
        if not facts:
            st.see_spot(None, now)
        return ended, st.spot_view(now, self._fresh_s())

    def _fresh_s(self) -> float:
        """Wall seconds a fact stays "seen now": one look."""
        return min(self.args.poll_interval, self.args.decision_interval.total_seconds())

    def _settle_s(self) -> float:
        """Wall seconds a spot request waits before its waiting shows spot down (a pod is
        scheduled, or a supervisor starts, within about a second when capacity is there)."""
        return max(self._fresh_s(), 1.0)

    def _check_budgets(self) -> None:
        """The failure budget, and this try's limit on attempts lost to infrastructure."""
        st = self.state
        if st.failures > self.args.max_failures:
            last = next(
                (a for a in reversed(st.attempts) if a.outcome in ("app_failure", "oom_killed")),
                None,
            )
            raise FailureBudgetExhausted(
                f"{st.failures} application failures exceed max_failures={self.args.max_failures}; last: attempt "
                f"{last.attempt if last else '?'} {last.reason if last else ''}. Preemptions so far: {st.preemptions} "
                "(they never count here). Fix the training code or raise max_failures."
            )
        if st.infra_disruptions - st.infra_base > MAX_INFRA_DISRUPTIONS:
            raise BackendError(
                f"{st.infra_disruptions - st.infra_base} attempts lost to infrastructure in this "
                "try; giving up on it"
            )

    # -- finishing --------------------------------------------------------------------------
    def _complete(self, now: float) -> dict[str, Any] | None:
        """All the work is checkpointed though the attempt has not reported its end yet: stop
        it (its outcome is success, not a cancel) and finish the job."""
        m = self.checkpoints.latest_valid()
        total = self.args.total_steps_known(self.state, m)
        if m is None or total is None or m.step < total:
            return None  # the manifest said so, but the files do not verify yet: look again
        stopped = self.attempt.stop()
        if stopped is not None:
            stopped.outcome = Outcome.SUCCEEDED.value
            stopped.reason = "all work checkpointed; attempt stopped"
        return self._finish_if_complete(now)

    def _finish_if_complete(self, now: float) -> dict[str, Any] | None:
        m = self.checkpoints.latest_valid()
        total = self.args.total_steps_known(self.state, m)
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
                    f"{self.args.checkpoint_uri}, so the job could neither resume after a "
                    "preemption nor count as done; save checkpoints with "
                    "airflow_spot.checkpoint.TrainingSession (it reads the location from "
                    "$AIRFLOW_SPOT_CHECKPOINT_URI) and tell it the total steps",
                )
            log.error(
                "Attempt %d %s; counting it as an application failure.", rec.attempt, rec.reason
            )
            return None
        self.attempt.stop_coming("the work is done")  # a spot return still on its way
        return self.report.finished(now, m)

    def stop_for_good(self) -> None:
        """Cancel the live attempt (the task is failing for good); nothing is left running."""
        if self.state.coming is not None:
            self.attempt.stop_coming("the task is failing")
        self.capacity.drop_probe()
        live = self.state.live
        if live is not None:
            log.warning("Stopping attempt %d: the task is failing.", live.attempt)
            self.attempt.stop()

    # -- deciding ---------------------------------------------------------------------------
    def _progress(self) -> Progress:
        st = self.state
        latest = self.checkpoints.latest_manifest()
        total = self.args.total_steps_known(st, latest)
        if total is None:
            raise InfeasibleDeadline(
                "total_steps",
                "unknown: give total_steps or write it into the checkpoints' manifests",
            )
        st.total_steps = total
        if latest is not None and latest.step >= total:
            latest = self.checkpoints.latest_valid()  # done only if its files are whole
        sps = self.args.seconds_per_step(st, total)
        done_steps = latest.step if latest else 0
        changeover = st.measured_changeover_s(sps)
        if changeover is None:
            changeover = self.args.changeover.total_seconds() * st.time_scale
        elif changeover > 0:  # on a grid of 16 steps per octave: the plan is not re-solved
            changeover = 2 ** (round(16 * math.log2(changeover)) / 16)  # for every new mean
        live = st.live
        reported = done_steps  # at best: the running attempt's latest progress report
        if live is not None and live.started_at is not None and live.step_end is not None:
            reported = max(done_steps, live.step_end)
            if live.capacity == Capacity.ON_DEMAND.value:
                done_steps = reported  # on-demand progress is not taken back (spot's may be)
        return Progress(total, done_steps, reported, sps, changeover)

    def _job(self, p: Progress) -> JobSpec:
        """The policy's job: the work at the measured rate, the deadline less the guard, and
        the reserve for the application failures still allowed (:mod:`.failure_reserve`)."""
        st, work_s = self.state, p.total * p.sps
        guard = self._guard(p.total - p.reported, p.sps, work_s, p.changeover)
        tick_s = self.args.decision_interval.total_seconds() * st.time_scale
        kept = failure_reserve_s(st, self.checkpoints, self.args.max_failures, p, tick_s)
        try:
            return JobSpec(
                work_s,
                st.deadline_s - guard,
                p.changeover,
                self.args.spot_price,
                self.args.on_demand_price,
                tick_s=tick_s,
                max_preemptions=self.args.max_preemptions,
                failure_reserve_s=kept,
                nodes=self.args.nodes,
                # in market seconds: as given, or the longest the gang's nodes took, if longer
                acquire_s=max(self.args.acquire_s, st.acquired_s) * st.time_scale,
                make_before_break=self.attempt.can_hand_over(),  # how act() returns to spot
            )
        except ConfigError as e:
            if e.field != "deadline_s":
                raise
            raise InfeasibleDeadline(  # the work at the measured rate no longer fits
                "deadline",
                f"at the measured {p.sps:.1f} s per step ({p.sps * p.total / HOUR:.2f} h for "
                f"{p.total} steps): {e}",
            ) from e

    def _observe(self, now: float, p: Progress, job: JobSpec, view: SpotView) -> Observation:
        """What the policy sees now; a deadline that cannot be met any more is an error.

        A spot return granted reads as spot launching, with ``overlap`` while on-demand
        trains under it (as the simulator has it: one still paying its own launch makes no
        progress, so the safety net judges the return as a launch with nothing under it); one
        still waiting for capacity, as on-demand. Once it took over (``ready_at``), it reads as
        running spot, no changeover left, as the replay hands over only when the launch is
        paid: read as a launch, the safety net called it off for a new on-demand launch, which
        pays a whole changeover."""
        st, live = self.state, self.state.live
        coming = st.coming
        returning = coming is not None and coming.granted_at is not None
        overlap = returning and live is not None and live.started_at is not None
        cap = Capacity(live.capacity) if live else Capacity.NONE
        left = 0.0
        if returning and coming is not None:
            cap = Capacity.SPOT
            left = max(0.0, p.changeover - st.market_s(now) + st.market_s(coming.granted_at or now))
        elif live is not None and live.started_at is None and live.ready_at is None:
            began = live.granted_at or now
            left = max(0.0, p.changeover - st.market_s(now) + st.market_s(began))
        now_m = st.market_s(now)
        remaining, time_left = job.work_s - p.done_steps * p.sps, st.deadline_s - now_m
        # at best: a running instance (spot included) goes on; one still launching pays what
        # is left of its changeover; with none, a launch pays a whole one
        best = job.work_s - p.reported * p.sps + (p.changeover if live is None else left)
        if remaining > 0 and best > time_left + job.tick_s:
            raise InfeasibleDeadline(
                "deadline",
                f"cannot be met any more: at best {_dur(best)} of work and changeover > "
                f"{_dur(time_left)} left (measured {p.sps:.1f} s per step); give more time or cut "
                "the work",
            )
        return observe(
            now_m,
            p.done_steps * p.sps,
            cap,
            view,
            changeover_left_s=left,
            preemptions=st.preemptions,
            spot_down_s=st.spot_down_s,
            last_up_s=st.spot_last_up_s,
            last_down_s=st.spot_last_down_s,
            overlap=overlap,
        )

    def decide(self, now: float, view: SpotView) -> tuple[Decision, JobSpec, Observation]:
        """Decide with what is seen of spot (:meth:`JobState.spot_view`)."""
        st = self.state
        p = self._progress()
        job = self._job(p)
        obs = self._observe(now, p, job, view)
        decision = self._within_budget(self.policy.decide(job, obs))
        signal = spot_signal_text(obs)
        st.record_decision(now, decision.capacity.value, decision.reason, p.done_steps, spot=signal)
        live = st.live
        log.info(
            "[spot] t=%.2f h, done %d/%d steps (%.1f%%), %s, spot %s: %s -> %s%s",
            obs.now / HOUR,
            p.done_steps,
            p.total,
            100 * p.done_steps / p.total,
            f"attempt {live.attempt} on {live.capacity}" if live else "idle",
            signal,
            decision.reason,
            decision.capacity.value,
            " (look)" if decision.look and not self.capacity.oracle else "",
        )
        return decision, job, obs

    def _within_budget(self, decision: Decision) -> Decision:
        """Preemption budget spent: no more spot, and no waiting for it either."""
        st, limit = self.state, self.args.max_preemptions
        if (
            decision.capacity is Capacity.ON_DEMAND
            or decision.rule == "done"
            or limit is None
            or st.preemptions <= limit
        ):
            return decision
        if self.args.on_preemption_budget == "fail":
            raise PreemptionBudgetExhausted(
                f"{st.preemptions} preemptions exceed max_preemptions={limit} "
                f"(on_preemption_budget='fail'); application failures so far: {st.failures}"
            )
        return Decision(Capacity.ON_DEMAND, "budget_spent", (st.preemptions, limit))

    def _guard(self, steps_left: int, sps: float, work_s: float, changeover: float) -> float:
        """Market seconds the policy keeps back from the deadline for what the plan takes as
        certain but a live run is not: the latest attempt running slower than the mean rate,
        GUARD_SHARE of the work left (throughput noise), and two looks (a finish or a verdict
        is seen up to a look late: a poll, and the most the last LOOKS_KEPT turns began after
        the watcher's event, which a busy scheduler or executor stretches). Never more than the
        whole job's slack (the policy then plans with none, and the feasibility check uses the
        true deadline)."""
        st = self.state
        latest = st.latest_seconds_per_step(MIN_STEPS_FOR_RATE) or sps
        left = max(0, steps_left)
        look = self.args.poll_interval + max(st.looks_late, default=0.0)
        guard = left * max(0.0, latest - sps) + GUARD_SHARE * left * sps + 2 * look * st.time_scale
        return min(guard, max(0.0, st.deadline_s - work_s - changeover))

    # -- acting -----------------------------------------------------------------------------
    def act(self, decision: Decision, job: JobSpec, now: float) -> None:
        live = self.state.live
        want = decision.capacity
        reason = f"stopped to switch to {want.value}: {decision.reason}"
        coming = self.state.coming
        if coming is not None:
            if want is Capacity.SPOT:
                return  # on-demand trains on until the spot attempt is ready to take over
            waits = coming.granted_at is None and live is not None  # on-demand under it
            if want is Capacity.ON_DEMAND and decision.look and waits:
                return  # still waiting for capacity: the request is the look (unbilled)
            # (nothing live, a trainer failed: the return is called off, on-demand relaunches)
            log.info("Calling off the return to spot: cancelling attempt %d.", coming.attempt)
            self.attempt.stop_coming(f"return called off: {decision.reason}")
        if (
            want is Capacity.SPOT
            and live is not None
            and live.capacity == Capacity.ON_DEMAND.value
            and self.attempt.can_hand_over()
        ):
            self.attempt.launch(want, job, hold=True)  # make-before-break
            return
        if (
            want is Capacity.NONE
            and decision.look
            and not self.capacity.oracle
            and live is not None
            and live.capacity == Capacity.SPOT.value
            and live.granted_at is None
        ):
            return  # waiting for spot: the job's own spot request is the look (it holds nothing)
        if live is not None and Capacity(live.capacity) is want:
            if not self.capacity.stranded(live, now):
                return
            reason = f"moved: pool {live.pool} has no spot capacity while another pool has"
        if live is not None:
            log.info("Switching away from %s: cancelling attempt %d.", live.capacity, live.attempt)
            self.attempt.stop()
            live.reason = reason
        if want is Capacity.NONE:
            return
        self.attempt.launch(want, job)


def spot_signal_text(obs: Observation) -> str:
    """Spot's signal as the decision log and the UI show it: up or down (and from which
    source), or unknown since when."""
    src = f" ({obs.spot_source})" if obs.spot_source else ""
    if obs.spot_available is not None:
        return f"{'up' if obs.spot_available else 'down'}{src}"
    if obs.spot_seen is None:
        return "unknown (never seen)"
    was = "up" if obs.spot_seen else "down"
    return f"unknown for {obs.spot_unseen_s / HOUR:.2f} h ({was} when last seen{src})"


def _dur(seconds: float) -> str:
    return f"{seconds / HOUR:.2f} h" if abs(seconds) >= 360 else f"{seconds:.0f} s"
