"""What a job reports: its summary (the ledger, attempts and decisions), the live snapshot the
UI shows while it runs, the metrics, and the bounded copy the task returns as its XCom."""

from __future__ import annotations

import logging
from typing import Any

from airflow_spot.backends.base import Outcome
from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.jobstate import AttemptRecord, JobState
from airflow_spot.operators.job import JobArgs, TaskIdentity
from airflow_spot.policy import HOUR, Capacity, JobSpec, Observation

log = logging.getLogger(__name__)


class Report:
    """The figures of one job, from its state."""

    def __init__(self, args: JobArgs, ident: TaskIdentity, state: JobState) -> None:
        self.args = args
        self.ident = ident
        self.state = state

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
        total = self.args.total_steps_known(st, final) or 1
        sps = self.args.seconds_per_step(st, total)
        n = self.args.nodes
        led = st.ledger(now, sps, self.args.on_demand_price, total * sps, n)
        led.finished_s = st.market_s(now)
        out = led.summary()
        if n > 1:  # a gang: every node billed, the prices above per node
            out["nodes"] = n
            out["node_hours"] = {
                cap: round(out[f"{cap}_hours"] * n, 6) for cap in ("spot", "on_demand")
            }
        out.update(
            {
                "policy": self.args.policy,
                "on_demand_price": self.args.on_demand_price,
                "spot_price": self.args.spot_price,
                "time_scale": st.time_scale,
                "deadline_hours": round(st.deadline_s / HOUR, 4),
                "attempts": [self._attempt(a) for a in st.attempts],
                "failures": st.failures,
                "infra_disruptions": st.infra_disruptions,
                "fallbacks_to_on_demand": _switches(st.attempts, "spot", "on_demand"),
                "returns_to_spot": _switches(st.attempts, "on_demand", "spot"),
                "final_checkpoint": None if final is None else self._final(final),
                "decisions": st.decisions,
                "decisions_dropped": st.decisions_dropped,
                "observe": st.observe,
                "spot_signal": spot_signal(st, now, self._fresh_s()),
            }
        )
        return out

    def _fresh_s(self) -> float:
        """Wall seconds a fact stays "seen now": one look (as the turn counts it)."""
        return min(self.args.poll_interval, self.args.decision_interval.total_seconds())

    def _attempt(self, a: AttemptRecord) -> dict[str, Any]:
        st = self.state

        def hours(wall: float | None) -> float | None:
            return None if wall is None else round(st.market_s(wall) / HOUR, 4)

        return {
            "attempt": a.attempt,
            "capacity": a.capacity,
            "launched_h": hours(a.launched_at),
            "start_h": hours(a.started_at),
            "end_h": hours(a.ended_at),
            "outcome": a.outcome,
            "reason": a.reason,
            "exit_code": a.exit_code,
            "step_start": a.step_start,
            "step_end": a.step_end,
            "checkpoint_step_end": a.ckpt_step_end,
            **({} if a.ready_at is None else {"ready_h": hours(a.ready_at)}),
            **({} if a.handed_to is None else {"handed_to": a.handed_to}),
            **({} if a.ranks is None else {"ranks": a.ranks}),
        }

    def _final(self, final: Manifest) -> dict[str, Any]:
        return {
            "name": final.name,
            "step": final.step,
            "metrics": final.metrics,
            "uri": f"{self.args.checkpoint_uri.rstrip('/')}/{final.name}",
        }

    def finished(self, now: float, final: Manifest) -> dict[str, Any]:
        """The job is done: its summary, kept once in the task state store (Airflow warns
        above 64 KB: the decisions are in the state's own list, the live snapshot is
        superseded), sent as metrics and logged."""
        summary = self.summary(now, final)
        self.state.finished = {k: v for k, v in summary.items() if k != "decisions"}
        self.state.snapshot = None
        self.emit(summary)
        log.info("Job complete: %s", one_line(summary))
        return summary

    def snapshot(self, now: float, job: JobSpec, obs: Observation) -> None:
        """A small live summary for the UI (the ledger so far and an estimated finish)."""
        snap = self.unfinished(now, deadline_met=None)  # not known until it ends
        remaining = max(0.0, job.work_s - obs.done_s)
        extra = 0.0 if obs.capacity is not Capacity.NONE else job.changeover_s
        snap["estimated_finish_hours"] = round(
            (obs.now + remaining + extra + obs.changeover_left_s) / HOUR, 4
        )
        snap["spot_signal"] = spot_signal(self.state, now, self._fresh_s(), obs)
        snap["probing"] = self.state.probe is not None
        coming = self.state.coming
        snap["incoming_attempt"] = None if coming is None else coming.attempt
        self.state.snapshot = snap

    def failed_for_good(self, now: float) -> None:
        """The task fails for good: the UI's snapshot and the metrics say the deadline is
        missed (no model comes out of this job), with what was spent until now."""
        try:
            snap = self.unfinished(now, deadline_met=False)
        except Exception as e:  # noqa: BLE001 - reporting must not hide the task's own error
            log.warning("Could not summarise the failed job: %s", e)
            return
        self.state.snapshot = snap
        self.emit(snap)

    def unfinished(self, now: float, deadline_met: bool | None) -> dict[str, Any]:
        """The ledger so far, for a job that has not finished (no decision log, no finish)."""
        snap = self.summary(now, None)
        snap.pop("decisions", None)
        snap["finished_hours"] = None
        snap["deadline_met"] = deadline_met
        snap["savings"] = None  # against the whole job on on-demand: only once it is done
        return snap

    def emit(self, summary: dict[str, Any]) -> None:
        from airflow_spot.operators.metrics import emit

        try:
            emit(summary, self.ident.dag_id, self.ident.task_id)
        except Exception as e:  # noqa: BLE001 - metrics must never fail a job
            log.warning("Could not send metrics: %s", e)


def spot_signal(
    st: JobState, now: float, fresh_s: float, obs: Observation | None = None
) -> dict[str, Any]:
    """What is known of spot at ``now``: ``state`` ("up", "down" or "unknown"), the
    ``source`` that showed it, ``seen_at`` (wall time last seen), ``since_hours`` (market hours
    it has gone unseen: 0 when seen now, None when never seen) and ``last_state`` (as last
    seen). From the turn's observation when there is one, else from the state (seen within
    ``fresh_s`` wall seconds counts as seen now)."""
    seen_at = st.spot_seen_at if st.spot_seen_at is not None else st.last_seen
    if obs is not None:
        available, seen, source = obs.spot_available, obs.spot_seen, obs.spot_source
        unseen_s = obs.spot_unseen_s
        if seen is None and available is not None:
            seen = available
    else:
        view = st.spot_view(now, fresh_s)
        available, seen, source = view.available, view.seen, view.source
        unseen_s = view.unseen_s
    if seen is None:
        return {
            "state": "unknown",
            "source": "",
            "seen_at": None,
            "since_hours": None,
            "last_state": None,
        }
    return {
        "state": "unknown" if available is None else _updown(available),
        "source": source or "",
        "seen_at": seen_at,
        "since_hours": 0.0 if available is not None else round(unseen_s / HOUR, 4),
        "last_state": _updown(seen),
    }


def _updown(up: bool) -> str:
    return "up" if up else "down"


def _switches(attempts: list[AttemptRecord], a: str, b: str) -> int:
    """How often an attempt on capacity ``a`` was followed by one on ``b``."""
    return sum(
        1
        for x, y in zip(attempts, attempts[1:], strict=False)
        if x.capacity == a and y.capacity == b
    )


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


def one_line(s: dict[str, Any]) -> str:
    return (
        f"cost ${s['cost']:.2f} vs ${s['on_demand_cost']:.2f} all on-demand (savings {100 * s['savings']:.1f}%), "
        f"spot {s['spot_hours']:.2f} h, on-demand {s['on_demand_hours']:.2f} h, idle {s['idle_hours']:.2f} h, "
        f"{s['preemptions']} preemptions, {s['work_lost_hours']:.2f} h of work lost, deadline met: {s['deadline_met']}"
    )
