"""airflow-spot is a provider Airflow discovers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from airflow_spot import get_provider_info


def test_provider_info_keys() -> None:
    """The provider info has the keys ProvidersManager reads, with the distribution's name."""
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-spot"
    assert {"name", "description", "versions"} <= set(info)


def test_the_provider_declares_its_settings_as_airflow_reads_them(monkeypatch) -> None:
    """The ``config`` section validates against Airflow's provider schema, and Airflow's
    configuration gives its default (``{AIRFLOW_HOME}`` expanded) when nothing sets it."""
    import json

    import airflow
    import jsonschema
    from airflow.configuration import AIRFLOW_HOME, conf

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    option = info["config"]["spot_training"]["options"]["allowed_local_checkpoint_roots"]
    assert option["default"] == "{AIRFLOW_HOME}/spot_checkpoints" and option["type"] == "string"
    monkeypatch.delenv("AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS", raising=False)
    got = conf.get("spot_training", "allowed_local_checkpoint_roots")
    assert got == f"{AIRFLOW_HOME}/spot_checkpoints"


def test_airflow_lists_the_provider_its_decorator_and_its_settings(tmp_path: Path) -> None:
    """`airflow providers list` lists airflow-provider-spot, `airflow providers get` its
    TaskFlow decorator, and `airflow config list` its [spot_training] settings with defaults."""
    exe = Path(sys.executable).with_name("airflow")
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "PATH": str(exe.parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }

    def airflow(*argv: str) -> str:
        r = subprocess.run([str(exe), *argv], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    assert "airflow-provider-spot" in airflow("providers", "list", "-o", "plain")
    got = airflow("providers", "get", "airflow-provider-spot", "--full", "-o", "yaml")
    assert "class-name: airflow_spot.decorators.spot_training.spot_training_task" in got
    assert "name: spot_training" in got
    listed = airflow("config", "list", "--section", "spot_training", "--show-values")
    for line in (
        "default_backend = local",
        "plan_cache = ",
        f"allowed_local_checkpoint_roots = {tmp_path}/spot_checkpoints",
        "kube_api_retry_s = 30",
        "s3_retry_s = 60",
        "default_lease = ",
    ):
        assert line in listed.splitlines(), listed


def test_the_wheel_ships_what_the_package_reads_and_the_demo_dag(tmp_path: Path) -> None:
    """A non-editable install has only what the wheel holds: the trace samples with their
    licenses, the priors, the demo DAG (``python -m airflow_spot.demo`` runs it from
    site-packages), the project's LICENSE; not the tests."""
    import shutil
    import zipfile

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    shutil.copytree(
        root,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", ".demo", "build", "*.egg-info", "__pycache__", "docs"
        ),
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("airflow_provider_spot-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = root / "airflow_spot"
    for path in package.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            assert path.relative_to(root).as_posix() in names, path
    assert "airflow_spot/examples/dags/spot_training_demo.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert sum(n.endswith("/LICENSE") and "data/traces" in n for n in names) >= 3
    assert not any(n.startswith("tests/") for n in names)
    meta = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        .decode()
    )
    assert "Requires-Python: >=3.11" in meta and "License-Expression: Apache-2.0 AND MIT" in meta


def test_the_demo_dag_shipped_in_the_package_parses() -> None:
    """The demo's default DAG folder is inside the package, and its DAGs import cleanly: the
    demo's and the examples' (TaskFlow training, the evaluation scheduled on its model)."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_spot.demo import DAGS

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert sorted(bag.dags) == [
        "spot_training_demo",
        "spot_training_evaluate",
        "spot_training_taskflow",
    ]
    from airflow.sdk import Asset

    train = bag.dags["spot_training_taskflow"].get_task("train_logreg")
    assert type(train).__name__ == "SpotTrainingDecoratedOperator"
    assert train.outlets == [Asset("spot_logreg_model")]
    evaluate = bag.dags["spot_training_evaluate"]
    assert [a.name for a in evaluate.timetable.asset_condition.objects] == ["spot_logreg_model"]
