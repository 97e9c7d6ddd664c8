"""airflow-spot: run ML training on spot / preemptible GPUs from Airflow and still meet the deadline.

Importing this package is cheap: it holds the version and the provider metadata Airflow reads.
The pure core lives in :mod:`airflow_spot.policy` and :mod:`airflow_spot.ledger`; the trace
simulator in :mod:`airflow_spot.simulate`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# the provider's Airflow settings ([spot_training] in airflow.cfg, or AIRFLOW__SPOT_TRAINING__*)
CONFIG_SECTION = "spot_training"
LOCAL_ROOTS_OPTION = "allowed_local_checkpoint_roots"
LOCAL_ROOTS_DEFAULT = "{AIRFLOW_HOME}/spot_checkpoints"


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
        "config": {
            CONFIG_SECTION: {
                "description": "Settings of the spot training provider (airflow-spot).",
                "options": {
                    LOCAL_ROOTS_OPTION: {
                        "description": "Comma-separated absolute folders that a local (path or "
                        "file://) ``checkpoint_uri`` must lie inside once rendered, symlinks "
                        "followed; checked when the task starts. Anyone who may trigger a DAG "
                        "could otherwise choose, through a templated URI, where the worker writes "
                        "and deletes checkpoints. ``{AIRFLOW_HOME}`` is replaced by Airflow's "
                        "home. Empty: no local location at all (s3:// only). S3 URIs are not "
                        "affected.",
                        "version_added": __version__,
                        "type": "string",
                        "example": "/data/spot-checkpoints,/mnt/shared/ckpt",
                        "default": LOCAL_ROOTS_DEFAULT,
                    }
                },
            }
        },
    }
