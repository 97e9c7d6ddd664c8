"""The shipped production settings (``airflow_spot.production``): the outages they survive,
computed from the same wait rules Airflow uses, and a real publish to a broker that is down,
with Airflow's defaults and with the shipped Celery settings.

tests/deployment/test_deployment_outages.py proves them on a real CeleryExecutor deployment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_spot import production

DEFAULT_RETRIES, DEFAULT_WAIT_MIN, DEFAULT_WAIT_MAX = 5, 1.0, 90.0  # Airflow 3.3's [workers]


def wait_bounds(retries: int, wait_min: float, wait_max: float) -> tuple[float, float]:
    """The least and the most a Task SDK client waits in all before it gives up a call: the
    ``retries - 1`` waits of tenacity's ``wait_random_exponential`` (as ``Client.request``
    builds it), each drawn between ``wait_min`` and the bound tenacity computes for it."""
    from tenacity import wait_exponential

    bound = wait_exponential(min=wait_min, max=wait_max)
    highs = [bound(SimpleNamespace(attempt_number=n)) for n in range(1, retries)]
    return wait_min * len(highs), sum(highs)


def test_airflow_defaults_are_what_the_settings_are_measured_against() -> None:
    """Airflow's own defaults are still 5 tries 1 to 90 s apart, and 3 publish re-sends after
    a timeout of 1 s: the figures the docstrings compare with."""
    from airflow.configuration import conf

    assert int(conf.get_default_value("workers", "execution_api_retries")) == DEFAULT_RETRIES
    assert float(conf.get_default_value("workers", "execution_api_retry_wait_min")) == 1.0
    assert float(conf.get_default_value("workers", "execution_api_retry_wait_max")) == 90.0
    assert float(conf.get_default_value("celery", "operation_timeout")) == 1.0
    assert int(conf.get_default_value("celery", "task_publish_max_retries")) == 3


def test_airflow_defaults_give_up_within_15_s_of_an_api_server_outage() -> None:
    """With Airflow's defaults a worker gives up starting a try after 4 to 15 s of waiting:
    any api-server restart longer than that costs the try (finding 1)."""
    least, most = wait_bounds(DEFAULT_RETRIES, DEFAULT_WAIT_MIN, DEFAULT_WAIT_MAX)
    assert (least, most) == (4.0, 15.0)
    assert production.api_outage_survived_s(DEFAULT_RETRIES, DEFAULT_WAIT_MIN) == least


def test_the_shipped_worker_settings_wait_out_five_minutes_of_api_server_outage() -> None:
    """31 tries 10 to 20 s apart: a worker waits at least 300 s, at most ~556 s, and calls
    again within 20 s of the api-server's return."""
    least, most = wait_bounds(
        production.EXECUTION_API_RETRIES,
        production.EXECUTION_API_RETRY_WAIT_MIN_S,
        production.EXECUTION_API_RETRY_WAIT_MAX_S,
    )
    assert least == 300.0 and 550.0 < most < 560.0, (least, most)
    survived = production.api_outage_survived_s(
        production.EXECUTION_API_RETRIES, production.EXECUTION_API_RETRY_WAIT_MIN_S
    )
    assert survived == least
    assert production.EXECUTION_API_RETRY_WAIT_MAX_S <= 20.0


def test_the_shipped_broker_settings_wait_out_five_minutes_of_broker_outage() -> None:
    """151 sends of 2 s each: a Redis outage of at least 302 s costs no try; and kombu's own
    retries outlast the send's timeout, so a send ends in the timeout the executor retries."""
    survived = production.broker_outage_survived_s(
        production.TASK_PUBLISH_MAX_RETRIES, production.OPERATION_TIMEOUT_S
    )
    assert survived == 302.0
    policy = production.PUBLISH_RETRY_POLICY
    kombu_s = policy["interval_start"] + (policy["max_retries"] - 1) * policy["interval_max"]
    assert kombu_s > 10 * production.OPERATION_TIMEOUT_S


def test_worker_settings_are_airflow_variables_of_the_shipped_values() -> None:
    """WORKER_SETTINGS holds both halves, each an ``AIRFLOW__SECTION__KEY`` Airflow knows,
    naming this module's CELERY_CONFIG for the Celery app."""
    from airflow.configuration import conf

    settings = production.WORKER_SETTINGS
    assert settings == {**production.EXECUTION_API_SETTINGS, **production.BROKER_SETTINGS}
    for name in settings:
        _, section, key = name.split("__")
        assert conf.get_default_value(section.lower(), key.lower()) is not None or (
            key == "CELERY_CONFIG_OPTIONS"
        ), name
    module, _, attr = settings["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"].rpartition(".")
    assert module == production.__name__ and attr == "CELERY_CONFIG"


def test_importing_the_module_imports_neither_airflow_nor_celery() -> None:
    """Only the Celery app's first use of CELERY_CONFIG imports Airflow's Celery provider."""
    code = (
        "import sys, airflow_spot.production as p\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('airflow', 'celery', 'kombu')]\n"
        "assert 'CELERY_CONFIG' not in vars(p)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_celery_config_is_airflows_default_plus_the_publish_policy() -> None:
    """CELERY_CONFIG is Airflow's DEFAULT_CELERY_CONFIG, key for key, plus the policy; built
    once (the Celery app reads it as an attribute of the module)."""
    pytest.importorskip("airflow.providers.celery")
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    config = production.CELERY_CONFIG
    assert config is production.CELERY_CONFIG
    assert config == {
        **DEFAULT_CELERY_CONFIG,
        "task_publish_retry_policy": production.PUBLISH_RETRY_POLICY,
    }
    with pytest.raises(AttributeError):
        production.NOT_A_SETTING  # noqa: B018


# -- a real publish to a broker that is down ----------------------------------------------
PUBLISH_PROBE = """
import json, time
from airflow.providers.celery.executors import celery_executor_utils as utils

class Workload:  # what send_workload_to_executor reads of an ExecuteTask
    ti = None
    def model_dump_json(self):
        return "{}"

started = time.monotonic()
_, _, result = utils.send_workload_to_executor(("probe", Workload(), "probe", None))
error = getattr(result, "exception", None)
print(json.dumps({"s": time.monotonic() - started, "error": type(error).__name__}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _publish(tmp_path: Path, name: str, settings: dict[str, str]) -> subprocess.Popen:
    """Airflow's own send_workload_to_executor (what the CeleryExecutor calls for each try)
    in a process of its own (Airflow reads these settings at import), to a Redis port nothing
    listens on: a broker that is down."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(tmp_path / name),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CELERY__BROKER_URL=f"redis://127.0.0.1:{_free_port()}/0",
        AIRFLOW__CELERY__RESULT_BACKEND=f"db+sqlite:///{tmp_path / name}.db",  # never opened
        **settings,
    )
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISH_PROBE], env=env, stdout=subprocess.PIPE, text=True
    )


def test_a_broker_outage_fails_a_default_publish_but_times_out_a_shipped_one(
    tmp_path: Path,
) -> None:
    """Redis down: with Airflow's defaults the publish fails in about 0.7 s with kombu's
    OperationalError, which the CeleryExecutor turns into a failed try (finding 1); with the
    shipped settings it ends after operation_timeout (2 s) in AirflowTaskTimeout, the one
    error the executor sends again (up to task_publish_max_retries times)."""
    pytest.importorskip("airflow.providers.celery")
    probes = {
        # Airflow's defaults, but 10 s to time out in: kombu's OperationalError comes in about
        # 0.7 s, before the default 1 s, on an idle machine; a loaded one (CI) may be slower
        "default": _publish(tmp_path, "default", {"AIRFLOW__CELERY__OPERATION_TIMEOUT": "10"}),
        "shipped": _publish(tmp_path, "shipped", production.BROKER_SETTINGS),
    }
    seen = {}
    for name, proc in probes.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, (name, out)
        seen[name] = json.loads(out.strip().splitlines()[-1])
    assert seen["default"]["error"] == "OperationalError", seen
    assert seen["default"]["s"] < 10, seen
    assert seen["shipped"]["error"] == "AirflowTaskTimeout", seen
    assert seen["shipped"]["s"] >= production.OPERATION_TIMEOUT_S - 0.1, seen
