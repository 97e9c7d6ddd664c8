"""The provider's settings (``[spot_training]``): declared in the provider info, read through
Airflow's configuration with its environment overrides, the earlier ``AIRFLOW_SPOT_*`` names
still winning where set, each bad value a ConfigError naming the setting; and each reaching
what it configures (the backend, the lease, the Kubernetes and S3 retry budgets)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot import settings
from airflow_spot.exceptions import ConfigError

NAMES = [
    "default_backend",
    "plan_cache",
    "allowed_local_checkpoint_roots",
    "kube_api_retry_s",
    "s3_retry_s",
    "default_lease",
]


@pytest.fixture(autouse=True)
def _clean(monkeypatch) -> None:
    for s in settings.SETTINGS:
        if s.name != "allowed_local_checkpoint_roots":  # the tests' roots (conftest) stay
            monkeypatch.delenv(s.env, raising=False)
        if s.earlier_env:
            monkeypatch.delenv(s.earlier_env, raising=False)


def test_every_setting_is_declared_with_its_default_and_read_through_airflow() -> None:
    """The provider info declares all six; Airflow's configuration gives their defaults."""
    from airflow.configuration import conf

    from airflow_spot import get_provider_info

    options = get_provider_info()["config"]["spot_training"]["options"]
    assert list(options) == NAMES
    assert all(o["description"] and o["version_added"] == "0.1.0" for o in options.values())
    for name in ("default_backend", "kube_api_retry_s", "s3_retry_s", "default_lease"):
        assert conf.get("spot_training", name) == settings.BY_NAME[name].default
    assert settings.kube_api_retry_s() == 30.0 and settings.s3_retry_s() == 60.0
    assert settings.default_lease() is None and settings.default_backend() == "local"


def test_the_environment_overrides_and_the_earlier_names_still_win(monkeypatch) -> None:
    """``AIRFLOW__SPOT_TRAINING__*`` overrides the default; an earlier ``AIRFLOW_SPOT_*``
    variable, where a deployment still sets it, wins over both."""
    from airflow_spot.backends.kubernetes import retry

    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__KUBE_API_RETRY_S", "5")
    assert retry.retry_s() == 5.0
    monkeypatch.setenv("AIRFLOW_SPOT_KUBE_RETRY_S", "7")
    assert retry.retry_s() == 7.0
    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__S3_RETRY_S", "9")
    assert settings.s3_retry_s() == 9.0
    assert settings.s3_retry_s(airflow=False) == 60.0  # a training process: its env only
    monkeypatch.setenv("AIRFLOW_SPOT_S3_RETRY_S", "3")
    assert settings.s3_retry_s() == settings.s3_retry_s(airflow=False) == 3.0


@pytest.mark.parametrize(
    ("env", "value", "call", "field"),
    [
        ("AIRFLOW__SPOT_TRAINING__KUBE_API_RETRY_S", "soon", settings.kube_api_retry_s,
         "[spot_training] kube_api_retry_s"),
        ("AIRFLOW__SPOT_TRAINING__S3_RETRY_S", "-1", settings.s3_retry_s,
         "[spot_training] s3_retry_s"),
        ("AIRFLOW_SPOT_S3_RETRY_S", "nan", settings.s3_retry_s, "AIRFLOW_SPOT_S3_RETRY_S"),
        ("AIRFLOW__SPOT_TRAINING__DEFAULT_LEASE", "a while", settings.default_lease,
         "[spot_training] default_lease"),
    ],
)  # fmt: skip
def test_a_bad_setting_names_itself_and_the_fix(monkeypatch, env, value, call, field) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as e:
        call()
    assert e.value.field == field


def _operator(tmp_path: Path, **changes):
    from airflow_spot.operators import SpotTrainingOperator

    args = dict(
        task_id="t",
        command=["python", "train.py"],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(minutes=10),
        total_steps=100,
        deadline="6h",
        poll_interval=5.0,
    )
    return SpotTrainingOperator(**{**args, **changes})


def test_a_task_without_a_backend_gets_the_default_backend(monkeypatch, tmp_path: Path) -> None:
    """``local`` unless set; a backend's JSON settings build that backend when the DAG is
    parsed; anything else fails there, naming the setting."""
    from airflow_spot.backends.kubernetes.backend import KubernetesBackend

    assert _operator(tmp_path).backend == "local"
    monkeypatch.setenv(
        "AIRFLOW__SPOT_TRAINING__DEFAULT_BACKEND",
        '{"kind": "kubernetes", "image": "ghcr.io/me/train:1", "namespace": "ml"}',
    )
    op = _operator(tmp_path, checkpoint_uri="s3://bucket/run")
    assert isinstance(op.backend, KubernetesBackend) and op.backend.namespace == "ml"
    with pytest.raises(ConfigError) as e:  # the backend's own checks hold too
        _operator(tmp_path, checkpoint_uri="relative/ckpt")
    assert e.value.field == "checkpoint_uri"
    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__DEFAULT_BACKEND", "kubernetes")
    with pytest.raises(ConfigError) as e:
        _operator(tmp_path)
    assert e.value.field == "[spot_training] default_backend"


def test_the_default_lease_is_the_tasks_unless_it_gives_one(monkeypatch, tmp_path: Path) -> None:
    """Three decision intervals (>= 5 min) unless set; the setting must leave 3 polls."""
    assert _operator(tmp_path).job_args().lease_s == 300.0
    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__DEFAULT_LEASE", "15m")
    assert _operator(tmp_path).job_args().lease_s == 900.0
    assert _operator(tmp_path, lease=timedelta(minutes=7)).job_args().lease_s == 420.0
    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__DEFAULT_LEASE", "10s")
    with pytest.raises(ConfigError) as e:
        _operator(tmp_path).job_args()
    assert e.value.field == "[spot_training] default_lease" and "3 poll_intervals" in str(e.value)


def test_the_training_process_gets_the_s3_retry_budget(monkeypatch, tmp_path: Path) -> None:
    """The training process has no Airflow configuration: the operator hands it the setting
    as ``AIRFLOW_SPOT_S3_RETRY_S`` at launch (here a decorated function returns what it got)."""
    from airflow.sdk import DAG, task

    from airflow_spot.backends.local import LocalBackend
    from airflow_spot.testing import FileTaskStateStore, make_context

    def report_env(session):
        import os

        session.step_done(session.total_steps, lambda: {"w.txt": b"x"})
        return os.environ.get("AIRFLOW_SPOT_S3_RETRY_S")

    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__S3_RETRY_S", "7")
    with DAG("settings_env", schedule=None) as dag:
        task.spot_training(
            checkpoint_uri=str(tmp_path / "ckpt"),
            expected_compute=timedelta(seconds=1),
            total_steps=1,
            deadline="1m",
            changeover=timedelta(seconds=0.1),
            backend=LocalBackend(work_dir=str(tmp_path / "runs"), time_scale=60.0),
            decision_interval=timedelta(seconds=1),
            poll_interval=0.1,
            deferrable=False,
        )(report_env)()
    op = dag.get_task("report_env")
    summary = op.execute(make_context(FileTaskStateStore(tmp_path / "state.json")))
    assert summary["result"] == "7", summary
    assert op.command[0] == sys.executable  # the worker's own interpreter, on the worker
