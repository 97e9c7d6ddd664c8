"""The TaskFlow example shipped in ``airflow_spot/examples/dags`` runs end to end under the
local backend (``dag.test()``): the function's result in the XCom beside the summary, and one
event of the model Asset whose extra names the final checkpoint. (That both examples parse is
tests/test_provider.py's test of the shipped DAG folder.)"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from airflow_spot.demo import DAGS

pytestmark = pytest.mark.usefixtures("airflow_db")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", DAGS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_taskflow_example_trains_and_publishes_its_model(monkeypatch, tmp_path: Path) -> None:
    """The decorated function trains to the last step on replayed spot, meeting the deadline;
    the XCom holds the summary and the function's return value; the model Asset gets one
    event, its extra the final checkpoint's step, manifest hash and URI, cost, savings and
    whether the deadline was met."""
    monkeypatch.setenv("AIRFLOW_SPOT_DEMO_DIR", str(tmp_path))
    from airflow import settings

    monkeypatch.setattr(settings, "DAGS_FOLDER", str(DAGS))  # dag.test() syncs that folder
    dag = _load("spot_training_taskflow").dag
    dr = dag.test()
    assert dr.state == "success"
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        xcom = s.scalars(
            select(XComModel).where(XComModel.run_id == dr.run_id, XComModel.key == "return_value")
        ).one()
        summary = xcom.value if isinstance(xcom.value, dict) else json.loads(xcom.value)
        events = s.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == "spot_logreg_model", AssetEvent.source_run_id == dr.run_id)
        ).all()
    final = summary["final_checkpoint"]
    assert final["step"] == 120 and summary["deadline_met"] is True
    assert summary["result"]["seed"] == 0
    assert summary["result"]["accuracy"] == pytest.approx(final["metrics"]["accuracy"])
    assert len(events) == 1
    extra = events[0].extra
    manifest = Path(final["uri"]) / "MANIFEST.json"
    assert extra["checkpoint_step"] == 120 and extra["uri"] == final["uri"]
    assert extra["manifest_hash"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert extra["cost"] == summary["cost"] and extra["savings"] == summary["savings"]
    assert extra["deadline_met"] is True
