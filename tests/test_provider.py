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


def test_airflow_providers_list_shows_us(tmp_path: Path) -> None:
    """`airflow providers list` in this environment lists airflow-provider-spot."""
    exe = Path(sys.executable).with_name("airflow")
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "PATH": str(exe.parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    r = subprocess.run(
        [str(exe), "providers", "list", "-o", "plain"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "airflow-provider-spot" in r.stdout
