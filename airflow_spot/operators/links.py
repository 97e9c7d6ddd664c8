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
        return f"{_base_path()}/spot-training/timeline?{query}"


def _base_path() -> str:
    """The path of ``[api] base_url`` (``https://host/airflow`` -> ``/airflow``): an Airflow
    served under a sub-path mounts the plugin there too."""
    from urllib.parse import urlparse

    from airflow.configuration import conf

    return urlparse(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
