"""A new job whose checkpoint_uri already holds work from before it (a URI not templated per
run): complete work is an error naming the field, partial work is resumed with a warning, and
a task instance that already finished returns its own summary instead of a new empty job."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.checkpoint import Checkpoints, LocalStore
from airflow_spot.exceptions import ConfigError
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command

STEPS = 20


def _step(ckpts: Checkpoints) -> int:
    m = ckpts.latest_manifest()
    return m.step if m else 0


def _op(tmp_path: Path) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    return SpotTrainingOperator(
        task_id="train",
        command=train_command(STEPS, step_seconds=0.01, save_every=5),
        checkpoint_uri=str(tmp_path / "ckpt"),
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


def test_complete_work_from_an_earlier_run_is_an_error_and_a_finished_ti_reports_itself(
    tmp_path: Path,
) -> None:
    first = FileTaskStateStore(tmp_path / "run1.json")
    summary = _op(tmp_path).execute(make_context(first))
    assert summary["final_checkpoint"]["step"] == STEPS
    # the same task instance again (retried or cleared after success): its own job, not a new one
    assert _op(tmp_path).execute(make_context(first)) == summary
    assert len(first.get(STATE_KEY)["attempts"]) == 1
    # the next DAG run with the same, untemplated URI: nothing would be trained
    second = FileTaskStateStore(tmp_path / "run2.json")
    with pytest.raises(
        ConfigError, match=r"checkpoint_uri: .* complete checkpoint \(step 20 of 20"
    ):
        _op(tmp_path).execute(make_context(second))
    assert second.get(STATE_KEY) is None
    assert Checkpoints(LocalStore(tmp_path / "ckpt")).latest_valid().step == STEPS  # kept


def test_partial_work_from_an_earlier_run_is_resumed_with_a_warning(tmp_path: Path, capfd) -> None:
    op = _op(tmp_path)
    store = FileTaskStateStore(tmp_path / "run1.json")
    # an earlier run's training was stopped part-way (SIGTERM: it saves and exits 143)
    earlier = [*op.command]
    earlier[earlier.index("--step-seconds") + 1] = "0.05"
    env = {"AIRFLOW_SPOT_CHECKPOINT_URI": str(tmp_path / "ckpt"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(earlier, env=env)
    ckpts = Checkpoints(LocalStore(tmp_path / "ckpt"))
    until = time.time() + 30
    while time.time() < until and _step(ckpts) < 5:
        time.sleep(0.02)
    proc.terminate()
    assert proc.wait(30) == 143
    done = ckpts.latest_valid().step
    assert 5 <= done < STEPS
    summary = op.execute(make_context(store))
    out, err = capfd.readouterr()
    assert f"already holds step {done} of 20" in out + err
    assert summary["attempts"][0]["step_start"] == done
    assert summary["final_checkpoint"]["step"] == STEPS


def test_total_steps_that_disagree_with_the_scripts_checkpoints_are_an_error(
    tmp_path: Path,
) -> None:
    """The operator says 10 steps, the script checkpoints a 20-step job: the job would be
    declared done half-way. A ConfigError names total_steps instead."""
    op = _op(tmp_path)
    op.total_steps = 10
    with pytest.raises(ConfigError, match="total_steps: the operator says 10 but the training"):
        op.execute(make_context(FileTaskStateStore(tmp_path / "s.json")))


def test_mapped_instances_sharing_one_location_is_an_error(tmp_path: Path) -> None:
    """Map index 1 finds map index 0 training into the same untemplated checkpoint_uri: a
    ConfigError suggesting ``{{ ti.map_index }}`` (it would resume from the other's
    checkpoints). The same location in the next run is taken over, saying whose it was."""
    first = FileTaskStateStore(tmp_path / "m0.json")
    summary = _op(tmp_path).execute(make_context(first, map_index=0))
    assert summary["final_checkpoint"]["step"] == STEPS
    sibling = FileTaskStateStore(tmp_path / "m1.json")
    with pytest.raises(ConfigError, match=r"already used by map index 0 .*\{\{ ti.map_index \}\}"):
        _op(tmp_path).execute(make_context(sibling, map_index=1))
    assert sibling.get(STATE_KEY) is None
    # the next run: complete work from run "run" (named), the fix per map index
    with pytest.raises(
        ConfigError,
        match=r"saved .* by task dag\.train \[map index 0\] of run run\).*\{\{ ti.map_index",
    ):
        _op(tmp_path).execute(
            make_context(FileTaskStateStore(tmp_path / "n.json"), run_id="next", map_index=1)
        )


def test_an_earlier_runs_record_does_not_hide_a_sibling(tmp_path: Path) -> None:
    """A location an earlier run trained into (its record left behind): of two map indexes
    of the next run checking it before either trains, exactly the second is refused."""
    Checkpoints(LocalStore(tmp_path / "ckpt")).set_owner(
        {"dag_id": "dag", "task_id": "train", "run_id": "earlier", "map_index": 0}
    )
    from airflow_spot.operators.location import claim_store

    op = _op(tmp_path)

    def claim(store: str, map_index: int) -> None:
        ti = make_context(FileTaskStateStore(tmp_path / store), map_index=map_index)["ti"]
        claim_store(op.checkpoint_store(), ti, op.checkpoint_uri, op)

    claim("a", 0)
    with pytest.raises(ConfigError, match="already used by map index 0"):
        claim("b", 1)
    claim("c", 0)


def test_a_corrupt_complete_checkpoint_does_not_block_the_valid_one_before_it(
    tmp_path: Path, capfd
) -> None:
    """The newest checkpoint says 'complete' but a file of it is corrupt: the new job resumes
    from the valid one before it and trains to the end (it refused to start, and the
    controller took the manifest for finished work and looked again for ever)."""
    op = _op(tmp_path)
    env = {"AIRFLOW_SPOT_CHECKPOINT_URI": str(tmp_path / "ckpt"), "PATH": "/usr/bin:/bin"}
    subprocess.run(op.command, env=env, check=True, timeout=60)
    ckpts = Checkpoints(LocalStore(tmp_path / "ckpt"))
    newest = ckpts.manifests()[0]
    data = next(k for k in ckpts.store.list(newest) if not k.endswith("MANIFEST.json"))
    ckpts.store.put(data, b"garbage")
    assert ckpts.latest_manifest().step == STEPS and ckpts.latest_valid().step == 15
    summary = op.execute(make_context(FileTaskStateStore(tmp_path / "s.json")))
    assert "already holds step 15 of 20" in "".join(capfd.readouterr())
    assert summary["final_checkpoint"]["step"] == STEPS and len(summary["attempts"]) == 1
    assert ckpts.latest_valid().step == STEPS


@pytest.mark.parametrize(
    ("who", "state", "refused"),
    [
        ({"run_id": "day1"}, "deferred", True),  # an overlapping run of the same task
        ({"task_id": "train_copy"}, "running", True),  # another task with the same URI
        ({"run_id": "day1"}, "up_for_retry", True),  # it will train again
        ({"run_id": "day1"}, "failed", False),  # ended: its partial work is resumed
        ({"run_id": "day1"}, None, False),  # Airflow cannot say (a deleted run)
    ],
)
def test_a_location_in_use_by_a_live_job_of_another_task_instance_is_refused(
    tmp_path: Path, who: dict, state: str | None, refused: bool, capfd
) -> None:
    """Before, only map indexes of one run were told apart: an overlapping run, or a copy of
    the task with the same URI, trained into the same location with a warning."""
    ckpts = Checkpoints(LocalStore(tmp_path / "ckpt"))
    theirs = {"dag_id": "dag", "task_id": "train", "run_id": "run", "map_index": -1, **who}
    ckpts.claim(theirs)
    key = f"{theirs['task_id']}" + ("" if theirs["map_index"] < 0 else f"_{theirs['map_index']}")
    states = {theirs["run_id"]: {key: state}} if state else {}
    store = FileTaskStateStore(tmp_path / "run2.json")
    ctx = make_context(store, run_id="day2", states=states)
    if refused:
        with pytest.raises(
            ConfigError,
            match=rf"checkpoint_uri: .* is in use by task dag\.{theirs['task_id']} of run {theirs['run_id']}, which is {state}",
        ):
            _op(tmp_path).execute(ctx)
        assert store.get(STATE_KEY) is None
        assert ckpts.owner() == theirs  # nothing changed
        records = sorted(f.name for f in (tmp_path / "ckpt").glob("job-owner*"))
        assert records == ["job-owner.json"]  # not even this run's claim
    else:
        summary = _op(tmp_path).execute(ctx)
        assert summary["final_checkpoint"]["step"] == STEPS
        assert ckpts.owner()["run_id"] == "day2"


def test_a_finish_seen_late_is_dated_when_the_attempt_ended(tmp_path: Path) -> None:
    """Under a real deployment a try that ended early (Airflow's deferral race) was retried 5
    minutes later, re-attached, found the attempt done and reported "deadline met: False": the
    finish was dated when it was seen. It is dated when the attempt ended. The finished state
    keeps one copy of the decisions and no live snapshot."""
    from airflow_spot.jobstate import JobState

    store = FileTaskStateStore(tmp_path / "s.json")
    ctx = make_context(store)
    op = _op(tmp_path)
    summary = op.execute(ctx)
    raw = store.get(STATE_KEY)
    assert "decisions" not in raw["finished"] and raw["snapshot"] is None and raw["decisions"]
    state = JobState.from_dict(raw)
    ctl = op.turn(state, ctx)
    seen_late = time.time() + 600  # seen 10 min later
    late = ctl.report.summary(seen_late, ctl.checkpoints.latest_valid())
    assert late["finished_hours"] == pytest.approx(summary["finished_hours"], abs=0.01)
    assert late["deadline_met"] is True and late["cost"] == pytest.approx(summary["cost"])
    # the task instance run again returns its summary, decisions included
    again = op.execute(ctx)
    assert again["decisions"] == summary["decisions"]
