"""Rows for the UI: every spot training task instance, from the operator's persisted state."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from airflow_spot.timeline import gang_size

STATE_KEY = (
    "airflow_spot_job"  # the key SpotTrainingOperator writes (kept here to avoid importing it)
)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def row(
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    ti_state: str | None,
    state: dict[str, Any],
    updated_at: datetime | None,
) -> dict[str, Any]:
    """One table row from a job state (finished summary, or the live snapshot)."""
    summary = state.get("finished") or state.get("snapshot") or {}
    total = state.get("total_steps") or 0
    step = _step(state, summary)
    live = next((a for a in state.get("attempts", []) if a.get("ended_at") is None), None)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "map_index": map_index,
        "nodes": gang_size(summary),  # a gang's ranks (its timeline has a lane a rank); 1
        "state": ti_state,
        "progress": round(100 * step / total, 1) if total else None,
        "deadline": _iso(state.get("deadline_at")),
        "started": _iso(state.get("started_at")),
        "estimated_finish_hours": summary.get("estimated_finish_hours")
        or summary.get("finished_hours"),
        "spot_hours": summary.get("spot_hours", 0.0),
        "on_demand_hours": summary.get("on_demand_hours", 0.0),
        "idle_hours": summary.get("idle_hours", 0.0),
        "cost": summary.get("cost", 0.0),
        "on_demand_cost": summary.get("on_demand_cost", 0.0),
        "savings": summary.get("savings") if state.get("finished") else None,
        "preemptions": state.get("preemptions", 0),
        "work_lost_hours": summary.get("work_lost_hours", 0.0),
        "observe": summary.get("observe") or state.get("observe") or "",
        "spot_signal": summary.get("spot_signal"),
        "spot": signal_text(summary.get("spot_signal"), probing=_probing(state)),
        "probes": int(summary.get("probes", state.get("probes")) or 0),
        "probe_cost": summary.get("probe_cost", 0.0),
        "overlap_hours": summary.get("overlap_hours", 0.0),
        "deadline_met": _deadline_met(state, summary),
        "now": _now(state, live, ti_state),
        "failed": state.get("failed"),
        "updated_at": updated_at.isoformat() if updated_at else None,
    }


def _step(state: dict[str, Any], summary: dict[str, Any]) -> int:
    """The job's progress in steps: the final checkpoint once done; else the last decision's
    step or the newest checkpoint the job has seen, whichever is more (a job that failed
    before deciding again still shows the checkpoints its attempts saved)."""
    if state.get("finished"):
        final = (summary.get("final_checkpoint") or {}).get("step")
        if isinstance(final, int):
            return final
    decisions = state.get("decisions") or []
    step = next((d.get("step") for d in reversed(decisions) if d.get("step") is not None), 0) or 0
    seen = state.get("checkpoint_seen")
    if seen is None:  # stored before the job kept it: its attempts' newest checkpoint
        seen = max((a.get("ckpt_step_end") or 0 for a in state.get("attempts") or []), default=0)
    return max(int(step), int(seen))


def signal_text(sig: dict[str, Any] | None, probing: bool = False) -> str:
    """Spot's signal in a few words: "up · attempt", "down · probe", "unknown 0.7 h · was
    down (probe)", "unknown · never seen"; "" for a state that has none (an older version's)."""
    if not isinstance(sig, dict) or not sig.get("state"):
        return ""
    state, source = str(sig["state"]), str(sig.get("source") or "")
    if state != "unknown":
        text = f"{state} · {source}" if source else state
    elif sig.get("last_state") is None:
        text = "unknown · never seen"
    else:
        since = sig.get("since_hours")
        ago = f" {_hours(since)} h" if isinstance(since, (int, float)) else ""
        src = f" ({source})" if source else ""
        text = f"unknown{ago} · was {sig['last_state']}{src}"
    return text + (" · probing" if probing else "")


def _hours(h: float) -> str:
    return f"{h:.2f}".rstrip("0").rstrip(".") if h < 10 else f"{h:.0f}"


# task instance states in which no try of the operator runs or waits any more
TI_ENDED = {"success", "failed", "upstream_failed", "skipped", "removed"}


def _now(state: dict[str, Any], live: dict[str, Any] | None, ti_state: str | None) -> str:
    """What the job is doing. A task instance Airflow ended without the operator (marked
    failed by hand or by the scheduler, a killed worker) shows as stopped, not as running."""
    if state.get("failed"):
        return "failed"
    if state.get("finished"):
        return "done"
    if ti_state in TI_ENDED:
        if live is not None:
            return f"stopped (task {ti_state}); attempt {live.get('attempt')} on {live.get('capacity')} may still run"
        return f"stopped (task {ti_state})"
    now = (live or {}).get("capacity") or "idle"
    coming = _coming(state)
    if coming is not None:  # a make-before-break return: on-demand trains on meanwhile
        now += f" (spot attempt {coming.get('attempt')} launching)"
    return now


def _coming(state: dict[str, Any]) -> dict[str, Any] | None:
    """The spot attempt launching while on-demand trains on (None: none, or an older state)."""
    i, attempts = state.get("incoming"), state.get("attempts") or []
    if isinstance(i, int) and 0 <= i < len(attempts) and attempts[i].get("ended_at") is None:
        return attempts[i]
    return None


def _probing(state: dict[str, Any]) -> bool:
    return bool(state.get("probe")) and not state.get("finished") and not state.get("failed")


def load_rows(session: Any, dag_id: str | None = None) -> list[dict[str, Any]]:
    """All spot training task instances (optionally of one DAG), newest first."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    q = select(TaskStateStoreModel).where(TaskStateStoreModel.key == STATE_KEY)
    if dag_id:
        q = q.where(TaskStateStoreModel.dag_id == dag_id)
    out = []
    for rec in session.scalars(q.order_by(TaskStateStoreModel.updated_at.desc())):
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == rec.dag_id,
                TaskInstance.run_id == rec.run_id,
                TaskInstance.task_id == rec.task_id,
                TaskInstance.map_index == rec.map_index,
            )
        ).first()
        out.append(
            row(
                rec.dag_id,
                rec.run_id,
                rec.task_id,
                rec.map_index,
                str(ti.state) if ti and ti.state else None,
                json.loads(rec.value),
                rec.updated_at,
            )
        )
    return out


def load_one(
    session: Any, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> dict[str, Any] | None:
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import select

    rec = session.scalars(
        select(TaskStateStoreModel).where(
            TaskStateStoreModel.key == STATE_KEY,
            TaskStateStoreModel.dag_id == dag_id,
            TaskStateStoreModel.run_id == run_id,
            TaskStateStoreModel.task_id == task_id,
            TaskStateStoreModel.map_index == map_index,
        )
    ).first()
    return None if rec is None else json.loads(rec.value)


def _deadline_met(state: dict[str, Any], summary: dict[str, Any]) -> bool | None:
    """True/False once the job has ended (a job that failed for good missed it); None while it
    runs (a snapshot's finish is only an estimate)."""
    if state.get("failed"):
        return False
    if state.get("finished"):
        return summary.get("deadline_met")
    return None
