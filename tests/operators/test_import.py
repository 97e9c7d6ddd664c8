"""Importing the operator (what every DAG parse does) loads nothing heavy."""

from __future__ import annotations

import subprocess
import sys


def test_operator_import_loads_no_heavy_modules() -> None:
    """airflow_spot.operators pulls in no numpy, Kubernetes, boto3 or trigger machinery."""
    code = (
        "import airflow.sdk, sys; before = set(sys.modules); import airflow_spot.operators; "
        "new = set(sys.modules) - before; "
        "print(','.join(sorted(m for m in new if m.split('.')[0] in ('numpy', 'kubernetes', 'boto3', 'botocore', 'matplotlib') "
        "or m.startswith('airflow.triggers') or m.startswith('airflow_spot.triggers.local'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
