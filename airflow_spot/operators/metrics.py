"""Run metrics through Airflow's ``Stats`` (StatsD / OpenTelemetry, as the deployment set up)."""

from __future__ import annotations

from typing import Any


def emit(summary: dict[str, Any], dag_id: str, task_id: str, stats: Any = None) -> dict[str, float]:
    """Send a finished run's figures, tagged by DAG and task; returns what was sent."""
    if stats is None:
        from airflow.sdk.observability.stats import Stats as stats  # noqa: N813
    tags = {"dag_id": dag_id, "task_id": task_id}
    counters = {
        "spot_training.preemptions": summary.get("preemptions", 0),
        "spot_training.fallbacks_to_on_demand": summary.get("fallbacks_to_on_demand", 0),
        "spot_training.returns_to_spot": summary.get("returns_to_spot", 0),
        "spot_training.deadline_misses": 1 if summary.get("deadline_met") is False else 0,
    }
    gauges = {
        "spot_training.spot_seconds": 3600 * summary.get("spot_hours", 0.0),
        "spot_training.on_demand_seconds": 3600 * summary.get("on_demand_hours", 0.0),
        "spot_training.cost": summary.get("cost", 0.0),
        "spot_training.savings": summary.get("savings", 0.0),
        "spot_training.work_lost_seconds": 3600 * summary.get("work_lost_hours", 0.0),
    }
    for name, value in counters.items():
        stats.incr(name, count=int(value), tags=tags)
    if gauges["spot_training.savings"] is None:  # a job that did not finish saved nothing
        del gauges["spot_training.savings"]
    for name, value in gauges.items():
        stats.gauge(name, float(value), tags=tags)
    return {**counters, **gauges}
