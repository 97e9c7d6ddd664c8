"""A local ``checkpoint_uri`` is confined: whoever may trigger the DAG fills ``dag_run.conf``,
and a location templated from it must not let them choose where the worker writes checkpoints
and claims, or where the trainer's retention deletes ``ckpt-*`` folders. ``..`` is refused
(at parse time, and once rendered), and the rendered path, symlinks followed, must lie inside
the provider setting ``[spot_training] allowed_local_checkpoint_roots`` (read when the task
starts). What lies at the chosen place is left exactly as it was."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.exceptions import ConfigError
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command

ROOTS_ENV = "AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS"
STEPS = 20


def _op(tmp_path: Path, uri: str) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    return SpotTrainingOperator(
        task_id="train",
        command=train_command(STEPS, step_seconds=0.01, save_every=5),
        checkpoint_uri=uri,
        expected_compute=timedelta(seconds=1),
        total_steps=STEPS,
        deadline=timedelta(seconds=60),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=1.0, work_dir=str(tmp_path / "runs")
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.05,
        deferrable=False,
    )


def _rendered(op: SpotTrainingOperator, conf: dict) -> SpotTrainingOperator:
    """The operator's templates rendered as Airflow renders them for a run with ``conf``."""
    op.render_template_fields({"dag_run": SimpleNamespace(conf=conf), "run_id": "manual_1"})
    return op


def _files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def _victim(folder: Path) -> dict[str, str]:
    """Another job's checkpoints (the example training's, steps 5 to 15 of 20), what a killed
    save left, and a file of theirs."""
    env = {"AIRFLOW_SPOT_CHECKPOINT_URI": str(folder), "PATH": "/usr/bin:/bin"}
    subprocess.run(train_command(STEPS, save_every=5), env=env, check=True, capture_output=True)
    shutil.rmtree(folder / f"ckpt-{STEPS:012d}")  # stopped before its end
    killed = folder / "ckpt-000000000001"  # a save of theirs killed before its manifest
    killed.mkdir()
    (killed / "model.bin").write_bytes(b"their model")
    (killed / ".airflow-spot-tmp.model.bin.1.abcd").write_bytes(b"their upload")
    (folder / "notes.txt").write_text("not ours")
    return _files(folder)


def _execute(op: SpotTrainingOperator, store: FileTaskStateStore) -> Exception | None:
    try:
        op.execute(make_context(store))
    except Exception as e:  # noqa: BLE001 - judged by the test, after what it touched
        return e
    return None


def test_dotdot_from_dag_run_conf_is_refused_once_rendered(tmp_path: Path) -> None:
    """``{"name": "../../../x"}`` in dag_run.conf: refused when the task starts, naming the
    field and the fix; no job, no attempt, nothing written where it pointed."""
    base = tmp_path / "allowed" / "team" / "ckpt"
    op = _rendered(_op(tmp_path, str(base) + "/{{ dag_run.conf['name'] }}"), {"name": "../../../x"})
    assert op.checkpoint_uri == f"{base}/../../../x"
    store = FileTaskStateStore(tmp_path / "state.json")
    err = _execute(op, store)
    escaped = sorted(p.name for p in (tmp_path / "x").glob("*"))
    assert escaped == [], f"written where dag_run.conf pointed: {escaped}"
    assert isinstance(err, ConfigError), err
    assert re.match(r"checkpoint_uri: .*must not contain '\.\.'", str(err)), err
    assert store.get(STATE_KEY) is None and not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match=r"^checkpoint_uri: .*must not contain '\.\.'"):
        _op(tmp_path, "file://" + str(base) + "/../../other")  # a literal: when parsed


@pytest.mark.parametrize("how", ["absolute path in conf", "symlink inside the root"])
def test_a_rendered_path_outside_the_allowed_roots_is_refused_and_left_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Another job's checkpoints at the chosen place: refused before the worker claims the
    location or a trainer (whose retention deletes older ``ckpt-*``) starts there; the error
    names the resolved path, the allowed roots, the setting and its environment variable."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    victim = tmp_path / "victim"
    before = _victim(victim)
    monkeypatch.setenv(ROOTS_ENV, str(allowed))
    if how == "symlink inside the root":
        (allowed / "shared").symlink_to(victim)
        uri, conf = str(allowed) + "/{{ dag_run.conf['name'] }}", {"name": "shared"}
    else:
        uri, conf = "{{ dag_run.conf['path'] }}", {"path": str(victim)}
    op = _rendered(_op(tmp_path, uri), conf)
    store = FileTaskStateStore(tmp_path / "state.json")
    err = _execute(op, store)
    after = _files(victim)
    written, deleted = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    assert (written, deleted) == ([], []), (
        f"at the chosen place: wrote {written}, deleted {deleted}"
    )
    assert after == before
    assert isinstance(err, ConfigError) and err.field == "checkpoint_uri", err
    text = str(err)
    assert f"resolves to {victim}," in text and str(allowed) in text
    assert "[spot_training] allowed_local_checkpoint_roots" in text and ROOTS_ENV in text
    assert store.get(STATE_KEY) is None and not (tmp_path / "runs").exists()


def test_the_setting_its_default_and_an_empty_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not set: ``$AIRFLOW_HOME/spot_checkpoints`` (the provider's declared default). Several
    roots, comma-separated; empty: no local location at all; a relative root is refused
    naming the setting. S3 is not affected."""
    from airflow.configuration import AIRFLOW_HOME

    from airflow_spot.operators.roots import allowed_roots, check_local_root

    monkeypatch.delenv(ROOTS_ENV, raising=False)
    home = Path(AIRFLOW_HOME).resolve()
    assert allowed_roots() == [home / "spot_checkpoints"]
    check_local_root(str(home / "spot_checkpoints" / "job" / "run-1"))
    with pytest.raises(ConfigError, match="outside the allowed local checkpoint roots"):
        check_local_root(str(home / "dags"))
    monkeypatch.setenv(ROOTS_ENV, f" {tmp_path / 'a'} , {tmp_path / 'b'}/ ,")
    assert allowed_roots() == [tmp_path / "a", tmp_path / "b"]
    check_local_root("file://" + str(tmp_path / "b" / "x"))
    check_local_root("s3://bucket/anywhere")
    monkeypatch.setenv(ROOTS_ENV, "")
    with pytest.raises(ConfigError, match=r"none \(the setting is empty: s3:// only\)"):
        check_local_root(str(tmp_path / "a"))
    monkeypatch.setenv(ROOTS_ENV, "spot_checkpoints")
    with pytest.raises(ConfigError, match=r"^\[spot_training\] allowed_local_checkpoint_roots: "):
        check_local_root(str(tmp_path / "a"))
