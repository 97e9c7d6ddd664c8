"""Importing the operator (what every DAG parse does) loads nothing heavy."""

from __future__ import annotations

from airflow_spot.testing import modules_loaded


def test_operator_import_loads_no_heavy_modules() -> None:
    """airflow_spot.operators pulls in no numpy, Kubernetes, boto3 or trigger machinery."""
    new = modules_loaded("import airflow_spot.operators", after="import airflow.sdk")
    heavy = sorted(
        m
        for m in new
        if m.split(".")[0] in ("numpy", "kubernetes", "boto3", "botocore", "matplotlib")
        or m.startswith(("airflow.triggers", "airflow_spot.triggers"))
    )
    assert heavy == []
