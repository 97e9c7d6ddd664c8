"""``airflow-spot simulate`` prints the comparison and writes the rows it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_spot.cli import main, parse_hours
from airflow_spot.exceptions import ConfigError
from airflow_spot.simulate.traces import bundled


def test_simulate_prints_table_and_writes_json_and_plot(tmp_path: Path, capsys) -> None:
    """The table lists every policy per deadline; the JSON has one row per trace, policy, deadline, changeover."""
    out, png = tmp_path / "rows.json", tmp_path / "cost.png"
    rc = main(
        [
            "simulate",
            str(bundled("cant-be-late/us-west-2a_v100_1")),
            "--polarity",
            "unavailable",
            "--work",
            "48h",
            "--deadline",
            "52h",
            "--deadline",
            "60h",
            "--changeover",
            "0.2h",
            "--policy",
            "greedy",
            "--policy",
            "uniform_progress",
            "--policy",
            "deadline_aware",
            "--policy",
            "omniscient",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    for p in ("greedy", "uniform_progress", "deadline_aware", "omniscient"):
        assert text.count(p) == 2
    rows = json.loads(out.read_text())
    assert len(rows) == 12 * 4 * 2
    need = {
        "trace",
        "policy",
        "deadline_h",
        "changeover_h",
        "cost",
        "normalized_cost",
        "met",
        "spot_hours",
        "on_demand_hours",
    }
    assert need <= set(rows[0])
    assert all(r["met"] for r in rows)
    assert png.stat().st_size > 10_000


def test_console_script_is_installed() -> None:
    """The ``airflow-spot`` command exists and reports a bad duration naming the flag."""
    exe = Path(sys.executable).with_name("airflow-spot")
    r = subprocess.run(
        [str(exe), "simulate", "x.json", "--deadline", "soon"], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert "--deadline: 'soon' is not a duration" in r.stderr


def test_infeasible_deadline_is_reported_before_the_sweep(capsys) -> None:
    """A deadline shorter than work + changeover stops the command with the figures."""
    rc = main(
        [
            "simulate",
            str(bundled("cant-be-late/us-west-2a_v100_1/0.json")),
            "--polarity",
            "unavailable",
            "--work",
            "48h",
            "--deadline",
            "48.1h",
            "--policy",
            "greedy",
        ]
    )
    assert rc == 2
    assert "infeasible" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "hours"), [("48h", 48), ("90m", 1.5), ("600s", 600 / 3600), ("2d", 48), ("0.2", 0.2)]
)
def test_parse_hours(text: str, hours: float) -> None:
    """Durations with units convert to hours."""
    assert parse_hours(text) == pytest.approx(hours)


def test_parse_hours_rejects_garbage() -> None:
    """A malformed duration names the field."""
    with pytest.raises(ConfigError, match="deadline: 'tomorrow'"):
        parse_hours("tomorrow", "deadline")
