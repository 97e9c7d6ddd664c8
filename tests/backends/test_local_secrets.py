"""``LocalBackend(extra_env=...)`` holds secrets (the trainer's S3 keys, a token): they reach the
training process through the supervisor's environment only, never a file. A whole job runs
through the operator with a secret planted; every file it writes (attempt folders, checkpoints,
the task state), its logs and its XCom are scanned for it. The attempt folders are this user's
only: folders 0700, files 0600."""

from __future__ import annotations

import hashlib
import json
import logging
import stat
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.exceptions import ConfigError
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

SECRET = "sk-planted-" + hashlib.sha256(b"airflow-spot issue 34 finding 7").hexdigest()[:24]
STEPS = 20


def _command() -> list[str]:
    """The example training, started only if the secret reached it (its hash is in the
    command, never the secret: the command is written down)."""
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    code = (
        "import hashlib, os, runpy, sys\n"
        "got = os.environ.get('SPOT_TEST_SECRET', '').encode()\n"
        f"if hashlib.sha256(got).hexdigest() != {digest!r}:\n"
        "    sys.exit('the secret did not reach the training process')\n"
        f"sys.argv = ['train_logreg', '--steps', '{STEPS}', '--step-seconds', '0.01',"
        " '--save-every', '5']\n"
        "runpy.run_module('airflow_spot.examples.train_logreg', run_name='__main__')\n"
    )
    return [sys.executable, "-c", code]


def test_a_secret_in_extra_env_reaches_the_trainer_and_no_file_or_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    trace = scripted_trace(tmp_path / "market.json", [(True, 5000)])
    backend = LocalBackend(
        trace=str(trace),
        polarity="available",
        time_scale=60.0,
        work_dir=str(tmp_path / "runs"),
        extra_env={"SPOT_TEST_SECRET": SECRET},
    )
    op = SpotTrainingOperator(
        task_id="train",
        command=_command(),
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=2),
        total_steps=STEPS,
        deadline=timedelta(seconds=60),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=backend,
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.05,
        deferrable=False,
    )
    summary = op.execute(make_context(FileTaskStateStore(tmp_path / "task_state.json")))
    assert summary["final_checkpoint"]["step"] == STEPS  # the trainer had the secret
    assert [a["outcome"] for a in summary["attempts"]] == ["succeeded"]

    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    written = {p.relative_to(tmp_path).as_posix() for p in files}
    assert {"task_state.json", "runs/dag/run/train/-1/attempt-001/spec.json"} <= written
    assert any(name.startswith("ckpt/ckpt-") for name in written)
    assert any(name.endswith("attempt.log") for name in written)
    leaked = [
        p.relative_to(tmp_path).as_posix() for p in files if SECRET.encode() in p.read_bytes()
    ]
    assert leaked == [], f"the secret is written in {leaked}"
    out, err = capfd.readouterr()
    for where, text in (("log records", caplog.text), ("stdout", out), ("stderr", err)):
        assert SECRET not in text, f"the secret is in the {where}"
    assert SECRET not in json.dumps(summary) + repr(backend) + json.dumps(backend.to_dict())

    runs = tmp_path / "runs"
    for path in [runs, *runs.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        want = 0o700 if path.is_dir() else 0o600
        assert mode == want, f"{path.relative_to(tmp_path)} is {mode:o}, not {want:o}"


def test_a_wrong_extra_env_is_refused_without_showing_its_values() -> None:
    with pytest.raises(ConfigError, match="backend.extra_env") as err:
        LocalBackend(extra_env={"TOKEN": SECRET, "SEED": 1})
    assert "'SEED': int" in str(err.value) and SECRET not in str(err.value)
