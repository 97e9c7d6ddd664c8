"""airflow-spot: run ML training on spot / preemptible GPUs from Airflow and still meet the deadline.

Importing this package is cheap: it holds the version and the provider metadata Airflow reads.
The pure core lives in :mod:`airflow_spot.policy` and :mod:`airflow_spot.ledger`; the trace
simulator in :mod:`airflow_spot.simulate`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-spot",
        "name": "Spot training",
        "description": "Runs ML training on spot / preemptible GPU capacity and meets the deadline: "
        "preemption-aware budgets, checkpoint resume, deadline-driven on-demand fallback, cost ledger.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Spot training",
                "external-doc-url": "https://github.com/airflow-spot/airflow-spot#readme",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "Spot training",
                "python-modules": ["airflow_spot.operators.spot_training"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Spot training",
                "python-modules": [
                    "airflow_spot.triggers.attempt",
                    "airflow_spot.triggers.local",
                    "airflow_spot.triggers.milestones",
                    "airflow_spot.triggers.sensors",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Spot training",
                "python-modules": ["airflow_spot.sensors.spot", "airflow_spot.sensors.checkpoint"],
            }
        ],
        "extra-links": ["airflow_spot.operators.links.SpotTimelineLink"],
        "hooks": [
            {"integration-name": "Spot training", "python-modules": ["airflow_spot.hooks.aws"]}
        ],
        "task-decorators": [
            {
                "name": "spot_training",
                "class-name": "airflow_spot.decorators.spot_training.spot_training_task",
            }
        ],
        # the [spot_training] section (airflow_spot.settings, imported here only: importing
        # the package stays free of it)
        "config": _provider_config(),
    }


def _provider_config() -> dict[str, Any]:
    from airflow_spot.settings import provider_config

    return provider_config()
