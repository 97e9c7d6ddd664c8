"""The operator's extra link to its "Spot timeline" view."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperatorLink


class SpotTimelineLink(BaseOperatorLink):
    """Links a SpotTrainingOperator task instance to its timeline in the Spot training plugin."""

    name = "Spot timeline"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        query = urlencode(
            {
                "dag_id": ti_key.dag_id,
                "run_id": ti_key.run_id,
                "task_id": ti_key.task_id,
                "map_index": getattr(ti_key, "map_index", -1),
            }
        )
        return f"/spot-training/timeline?{query}"
