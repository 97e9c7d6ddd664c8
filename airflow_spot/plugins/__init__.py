"""The Airflow 3 plugin (entry point ``airflow.plugins``): the "Spot training" page, the
per-task-instance timeline tab, and the app behind Airflow's authentication."""

from __future__ import annotations

from airflow.sdk.plugins_manager import AirflowPlugin

URL_PREFIX = "/spot-training"


def _app():
    from airflow_spot.plugins.app import app

    return app


class SpotTrainingPlugin(AirflowPlugin):
    """Registers the app at ``/spot-training``, a top-level "Spot training" page and a task
    instance tab "Spot timeline"."""

    name = "spot_training"
    fastapi_apps = [{"app": _app(), "url_prefix": URL_PREFIX, "name": "Spot training"}]
    external_views = [
        {
            "name": "Spot training",
            "href": "spot-training/page",
            "url_route": "spot-training",
            "destination": "nav",
            "icon": None,
        },
        {
            "name": "Spot timeline",
            "destination": "task_instance",
            "url_route": "spot-timeline",
            "href": "spot-training/timeline?dag_id={DAG_ID}&run_id={RUN_ID}&task_id={TASK_ID}&map_index={MAP_INDEX}",
        },
    ]
