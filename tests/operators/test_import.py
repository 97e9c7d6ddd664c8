"""Importing the operator (what every DAG parse does) and the TaskFlow decorator loads nothing
heavy; the decorated function's training process imports no Airflow at all."""

from __future__ import annotations

import pytest

from airflow_spot.testing import modules_loaded


def _heavy(new: set[str]) -> list[str]:
    return sorted(
        m
        for m in new
        if m.split(".")[0] in ("numpy", "kubernetes", "boto3", "botocore", "matplotlib")
        or m.startswith(("airflow.triggers", "airflow_spot.triggers"))
    )


@pytest.mark.parametrize(
    ("module", "after"),
    [
        ("airflow_spot.operators", "import airflow.sdk"),
        (
            "airflow_spot.decorators.spot_training",
            "import airflow.sdk; from airflow.sdk import task",
        ),
    ],
)
def test_the_import_loads_no_heavy_modules(module: str, after: str) -> None:
    """No numpy, Kubernetes, boto3 or trigger machinery; the policy registry and the
    checkpoint stores wait until an operator is built."""
    new = modules_loaded(f"import {module}", after=after)
    assert _heavy(new) == []
    assert not {"airflow_spot.policy", "airflow_spot.checkpoint"} & new


def test_the_training_process_of_a_decorated_function_imports_no_airflow() -> None:
    """``python -m airflow_spot.decorators.entry`` runs in the user's image: Airflow may be
    absent there (and would cost seconds at every attempt's start)."""
    new = modules_loaded("import airflow_spot.decorators.entry")
    assert sorted(m for m in new if m == "airflow" or m.startswith("airflow.")) == []
