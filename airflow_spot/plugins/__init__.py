"""The Airflow 3 plugin (entry point ``airflow.plugins``): the "Spot training" page, the
per-task-instance timeline tab, the app behind Airflow's authentication, and the listener that
stops the attempt of a task instance Airflow ended without the operator (``listener.py``)."""

from __future__ import annotations

from airflow.sdk.plugins_manager import AirflowPlugin

from airflow_spot.plugins import listener

URL_PREFIX = "/spot-training"


class _BuiltOnFirstUse:
    """``fastapi_apps``, built when first read. Every Airflow process loads plugins (each task
    process does, for its macros), but only the API server reads ``fastapi_apps``; building
    the app when the class is defined imported Airflow's whole FastAPI app everywhere
    (1.2-1.5 s per task start)."""

    def __init__(self) -> None:
        self._apps: list[dict] | None = None

    def __get__(self, obj: object, owner: type) -> list[dict]:
        if self._apps is None:
            from airflow_spot.plugins.app import app

            self._apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Spot training"}]
        return self._apps


class SpotTrainingPlugin(AirflowPlugin):
    """Registers the app at ``/spot-training``, a top-level "Spot training" page and a task
    instance tab "Spot timeline"."""

    name = "spot_training"
    # stops the attempt of a task instance Airflow ended without the operator (issue 34, 2)
    listeners = [listener]
    fastapi_apps = _BuiltOnFirstUse()
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
