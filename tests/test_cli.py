"""``airflow-spot simulate`` prints the comparison and writes the rows it promises."""

from __future__ import annotations

import json
import re
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


def test_trace_prices_bill_on_demand_at_the_traces_own_price(capsys) -> None:
    """The GCP H100 sample has spot ~$19/h and on-demand $82.53/h: with --trace-prices both
    come from the trace (on-demand at the $3.06 default made spot look 6x dearer)."""
    gcp = str(bundled("gcp-h100/us-central1-a_h100_16.json"))
    args = ["simulate", gcp, "--polarity", "unavailable", "--window", "92h", "--windows", "5"]
    args += ["--policy", "greedy", "--workers", "1", "--trace-prices"]
    rc = main(args)
    assert rc == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "greedy" in x)
    norm_cost = float(line.split()[4])
    assert 0 < norm_cost < 1, line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--windows", "0", "--window", "10h"], "--windows: must be at least 1"),
        (["--window", "200h"], "--window: 200 h is longer than 1 trace"),
        (["--changeover", "0.123h"], "--changeover: omniscient needs whole seconds"),
        (["--gap", "700s"], "--gap: can only resample"),
        (["--deadline", "100h"], "--deadline: 100 h is longer than the shortest trace"),
        (["--json", "/nonexistent-dir/x.json"], "--json: cannot write /nonexistent-dir/x.json"),
        (["--policy", "nope"], "unknown policy 'nope'; choose one of "),
        (["--policy", "nope"], "uniform_progress, omniscient"),
        (
            ["--policy", "deadline_aware@mars"],
            "--policy: 'deadline_aware@mars': unknown availability prior 'mars'; choose one of "
            "aws-p3, default, gang, gcp-h100, us-west-2a (and gang-without-<zone>, the gang "
            "benchmark's held-out fits)\n",
        ),
        (["--deadline", "40h"], "--deadline: the deadline (40.00 h) is before the work"),
        (
            ["--work", "0"],
            "--work: must be a positive number (the compute time the job needs, e.g. 48h)",
        ),
        (["--spot-price", "-1"], "--spot-price: must be >= 0"),
    ],
)
def test_bad_sweep_settings_are_errors_naming_the_flag(extra, message, capsys) -> None:
    """Settings that cannot work stop the command before the sweep, with exit code 2."""
    rc = main(
        [
            "simulate",
            str(bundled("cant-be-late/us-west-2a_v100_1/0.json")),
            "--polarity",
            "unavailable",
            "--policy",
            "omniscient",
            *extra,
        ]
    )
    assert rc == 2
    assert message in capsys.readouterr().err


def test_cli_errors_speak_in_flags_and_plot_needs_matplotlib_before_the_sweep(
    capsys, monkeypatch
) -> None:
    """A JSON trace without --polarity names the flag (was "pass polarity='available'"); --plot
    without matplotlib (only in the dev extra) stops before the sweep (was a traceback after
    it, the JSON written)."""
    trace = str(bundled("cant-be-late/us-west-2a_v100_1/0.json"))
    assert main(["simulate", trace]) == 2
    err = capsys.readouterr().err
    assert "--polarity: " in err and "pass --polarity available (1 = spot up) or unavailable" in err
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(  # as in an install without matplotlib
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    rc = main(["simulate", trace, "--polarity", "unavailable", "--plot", "/tmp/x.png"])
    assert rc == 2 and "--plot: needs matplotlib" in capsys.readouterr().err


def test_bundled_samples_are_named_on_the_command_line(capsys) -> None:
    """``bundled:<name>`` (the LocalBackend's spelling) works on the command line, an unknown
    name lists the samples there are, and ``--help`` lists them too."""
    rc = main(
        [
            "simulate",
            "bundled:cant-be-late/us-west-2a_v100_1",
            "--polarity",
            "unavailable",
            "--policy",
            "greedy",
            "--quiet",
        ]
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "greedy" in line]
    assert rc == 0 and rows and rows[0][3] == "12"  # the folder's 12 windows
    assert main(["simulate", "bundled:cant-be-late/nope"]) == 2
    err = capsys.readouterr().err
    assert "no such bundled sample" in err and "bundled:cant-be-late/us-west-2a_k80_1" in err
    assert "bundled:gcp-h100/us-central1-a_h100_16.json" in err
    assert "price" not in err and "result" not in err  # the samples beside the traces
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = re.sub(r"-\s+", "-", capsys.readouterr().out)  # argparse wraps at hyphens
    assert "bundled:cant-be-late/us-west-2a_v100_1" in text
