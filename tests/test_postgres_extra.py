"""A PostgreSQL metadata DB works out of the lock (issue 21): the ``postgres`` extra names the
drivers Airflow opens, the lock pins them, and Airflow starts on a ``postgresql://`` URL."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
DRIVERS = ("psycopg2-binary", "asyncpg")  # Airflow's sync engine, and its async one
URL = "airflow:airflow@127.0.0.1:1/airflow"  # nothing listens on port 1: no test connects


def _lock() -> dict[str, str]:
    """The lock's pins, by normalised name."""
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def _extra(name: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"][name]]


def test_the_postgres_extra_names_both_drivers_and_the_lock_pins_them() -> None:
    """``pip install airflow-provider-spot[postgres]`` brings psycopg2 and asyncpg, and the
    lock (what ``make`` installs) pins versions the extra accepts."""
    extra = {r.name: r for r in _extra("postgres")}
    assert set(DRIVERS) <= set(extra)
    pins = _lock()
    for name, req in extra.items():
        assert name in pins, f"requirements.lock does not pin {name}"
        assert req.specifier.contains(pins[name]), (name, pins[name], str(req.specifier))


@pytest.mark.parametrize(
    ("url", "module"),
    [(f"postgresql+psycopg2://{URL}", "psycopg2"), (f"postgresql+asyncpg://{URL}", "asyncpg")],
)
def test_sqlalchemy_builds_an_engine_with_each_driver(url: str, module: str) -> None:
    """Both drivers import, and SQLAlchemy builds the sync and the async engine Airflow
    builds for a PostgreSQL metadata DB (without connecting)."""
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    __import__(module)
    engine = create_async_engine(url).sync_engine if module == "asyncpg" else create_engine(url)
    assert (engine.dialect.name, engine.dialect.driver) == ("postgresql", module)
    engine.dispose()


def test_airflow_starts_on_a_postgresql_url(tmp_path: Path) -> None:
    """``airflow version`` with ``sql_alchemy_conn`` on PostgreSQL: Airflow builds both
    engines when it loads its settings (it failed with ``No module named 'asyncpg'``)."""
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{URL}",
    }
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", None)  # derived: postgresql+asyncpg
    r = subprocess.run(
        [sys.executable, "-m", "airflow", "version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1].startswith("3.")
