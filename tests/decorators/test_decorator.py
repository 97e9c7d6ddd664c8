"""``@task.spot_training``: registered through the provider info, every argument check of the
operator (and the decorator's own) made when the DAG is parsed, mapping with
``.partial(...).expand(...)``, and the function run from its source in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG, task

from airflow_spot.exceptions import ConfigError

STEPS = 20  # a module constant: a decorated function may not use it (see below)
GOOD: dict[str, Any] = dict(
    checkpoint_uri="/tmp/spot-decorator-tests/{{ run_id }}",
    expected_compute=timedelta(seconds=2),
    total_steps=20,
    deadline="1h",
)


def _dag(dag_id: str = "decorated") -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC))


def train(session, lr: float = 0.1, epochs: int = 1):
    """A training function that needs nothing from its module."""
    start, _ = session.resume()
    for step in range(start, session.total_steps):
        session.step_done(step + 1, lambda: {"w.txt": f"{lr}".encode()})
    return {"lr": lr, "epochs": epochs}


def uses_a_module_constant(session):
    return STEPS


def no_session(lr: float):
    return lr


def star_args(session, *values):
    return values


def context_name(session, ti=None):
    return ti


def test_the_provider_registers_the_decorator() -> None:
    """``task.spot_training`` is found through the provider info's ``task-decorators``."""
    from airflow_spot import get_provider_info
    from airflow_spot.decorators.spot_training import spot_training_task

    assert get_provider_info()["task-decorators"] == [
        {
            "name": "spot_training",
            "class-name": "airflow_spot.decorators.spot_training.spot_training_task",
        }
    ]
    assert task.spot_training is spot_training_task


def test_a_decorated_call_builds_the_operator_with_its_arguments() -> None:
    """The task is a SpotTrainingOperator: the operator's arguments and defaults, the
    function's arguments templated, one dict of XCom (not the function's return annotation)."""
    from airflow_spot.operators import SpotTrainingOperator

    with _dag() as dag:
        task.spot_training(**GOOD, save_every=5)(train)(lr=0.5)
    op = dag.get_task("train")
    assert isinstance(op, SpotTrainingOperator)
    assert op.op_kwargs == {"lr": 0.5} and op.save_every == 5 and op.retries == 3
    assert {"op_kwargs", "checkpoint_uri", "deadline"} <= set(op.template_fields)
    assert op.multiple_outputs is False


BAD_DECORATOR = [
    ({"deadline": "soon"}, "deadline"),
    ({"policy": "nope"}, "policy"),
    ({"max_failures": -1}, "max_failures"),
    ({"command": ["python", "train.py"]}, "command"),
    ({"save_every": 0}, "save_every"),
    ({"deadline": timedelta(seconds=1)}, "deadline"),  # shorter than the work
]


@pytest.mark.parametrize(("change", "field"), BAD_DECORATOR)
def test_a_bad_decorator_argument_fails_where_the_dag_is_parsed(change, field) -> None:
    """Refused by ``@task.spot_training(...)`` itself, naming the field."""
    with pytest.raises(ConfigError) as e:
        task.spot_training(**{**GOOD, **change})
    assert e.value.field == field


BAD_CALL = [
    ({k: v for k, v in GOOD.items() if k != "checkpoint_uri"}, train, {}, "checkpoint_uri"),
    ({k: v for k, v in GOOD.items() if k != "total_steps"}, train, {}, "total_steps"),
    (GOOD, uses_a_module_constant, {}, "uses_a_module_constant()"),
    (GOOD, no_session, {"lr": 1.0}, "no_session()"),
    (GOOD, star_args, {}, "star_args()"),
    (GOOD, context_name, {}, "context_name()"),
    (GOOD, train, {"lr": datetime(2026, 1, 1)}, "argument 'lr'"),
    ({**GOOD, "python": ""}, train, {}, "python"),
]


@pytest.mark.parametrize(("kwargs", "fn", "call", "field"), BAD_CALL)
def test_a_bad_task_fails_where_the_dag_is_parsed(kwargs, fn, call, field) -> None:
    """Calling the decorated function (building the task) checks the rest, naming the field."""
    with _dag(), pytest.raises(ConfigError) as e:
        task.spot_training(**kwargs)(fn)(**call)
    assert e.value.field == field


def test_the_error_says_which_module_names_the_function_uses() -> None:
    """The function travels as its source: a module constant is named, with the fix."""
    with _dag(), pytest.raises(ConfigError) as e:
        task.spot_training(**GOOD)(uses_a_module_constant)()
    assert "uses STEPS from outside its body" in str(e.value)


def test_partial_expand_maps_over_the_function_arguments() -> None:
    """``.partial(...).expand(...)``: one mapped task, literal values checked at parse time."""
    with _dag() as dag:
        task.spot_training(**GOOD)(train).partial(epochs=2).expand(lr=[0.1, 0.2])
    mapped = dag.get_task("train")
    assert type(mapped).__name__ == "DecoratedMappedOperator"
    assert mapped.partial_kwargs["op_kwargs"] == {"epochs": 2}
    assert mapped.op_kwargs_expand_input.value == {"lr": [0.1, 0.2]}


@pytest.mark.parametrize(
    ("kwargs", "partial", "expand", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "deadline"}, {}, {"lr": [0.1]}, "deadline"),
        ({**GOOD, "deadline": "4m"}, {}, {"lr": [0.1]}, "deadline"),  # + the default changeover
        (GOOD, {}, {"lr": [0.1, object()]}, "argument 'lr'"),
        (GOOD, {"epochs": {1, 2}}, {"lr": [0.1]}, "argument 'epochs'"),
    ],
)
def test_a_mapped_task_is_checked_at_parse_time(kwargs, partial, expand, field) -> None:
    """A mapped task is built only when it runs: ``expand()`` checks it now, as a call would."""
    with _dag(), pytest.raises(ConfigError) as e:
        task.spot_training(**kwargs)(train).partial(**partial).expand(**expand)
    assert e.value.field == field


def _payload(fn, **call: Any) -> str:
    with _dag() as dag:
        task.spot_training(**GOOD, save_every=5)(fn)(**call)
    op = dag.get_task(fn.__name__)
    op.checkpoint_uri = "/unused"
    return op._payload


def _run_entry(payload: str, ckpt: Path) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "AIRFLOW_SPOT_CHECKPOINT_URI": str(ckpt)}
    return subprocess.run(
        [sys.executable, "-m", "airflow_spot.decorators.entry", payload],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_the_function_runs_from_its_source_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """The entry defines the function from its source, gives it a bound session and its
    arguments, and keeps its return value beside the checkpoints, tagged with the newest."""
    from airflow_spot.checkpoint.local import LocalStore
    from airflow_spot.decorators import result

    payload = _payload(train, lr=0.25)
    doc = json.loads(payload)
    assert doc["kwargs"] == {"lr": 0.25, "epochs": 1} and doc["session"]["save_every"] == 5
    assert doc["source"].startswith("def train(session") and "@" not in doc["source"]
    r = _run_entry(payload, tmp_path / "ckpt")
    assert r.returncode == 0, r.stderr
    store = LocalStore(str(tmp_path / "ckpt"))
    assert sorted(k for k in store.list("ckpt-") if k.endswith("MANIFEST.json"))[-1].startswith(
        "ckpt-000000000020"
    )
    assert result.read(store, "ckpt-000000000020") == (True, {"lr": 0.25, "epochs": 1})
    assert result.read(store, "ckpt-000000000015") == (False, None)  # another checkpoint's


def fails_on_step_3(session):
    start, _ = session.resume()
    for step in range(start, session.total_steps):
        if step == 3:
            raise RuntimeError("boom at step 3")
        session.step_done(step + 1, lambda: {"w.txt": b"x"})


def returns_a_set(session):
    session.step_done(session.total_steps, lambda: {"w.txt": b"x"})
    return {1, 2}


def test_an_error_is_an_application_failure_with_the_dag_files_lines(tmp_path: Path) -> None:
    """The function's exception exits 1 (an application failure), its traceback naming this
    file and the line that raised; a return value that is no JSON value exits 78 (the task
    fails at once: relaunching cannot fix it)."""
    r = _run_entry(_payload(fails_on_step_3), tmp_path / "a")
    assert r.returncode == 1
    line = next(
        i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if "boom at" in t
    )
    assert f'File "{__file__}", line {line}, in fails_on_step_3' in r.stderr, r.stderr
    assert 'raise RuntimeError("boom at step 3")' in r.stderr
    r = _run_entry(_payload(returns_a_set), tmp_path / "b")
    assert r.returncode == 78 and "return value: is not a JSON value" in r.stderr, r.stderr


MAPPED_DAG = """
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task

from airflow_spot.backends.local import LocalBackend

with DAG("spot_decorated_mapped", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)) as dag:

    @task.spot_training(
        checkpoint_uri={root!r} + "/ckpt-{{{{ ti.map_index }}}}",
        expected_compute=timedelta(seconds=1),
        total_steps=20,
        save_every=5,
        deadline="1m",
        changeover=timedelta(seconds=0.2),
        backend=LocalBackend(work_dir={root!r} + "/runs"),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.1,
    )
    def fit(session, seed: int, step_seconds: float = 0.0):
        from airflow_spot.examples.train_logreg import accuracy, make_data, train

        w = train(session, seed, step_seconds)
        return {{"seed": seed, "accuracy": accuracy(w, *make_data(seed))}}

    fit.partial(step_seconds=0.02).expand(seed=[1, 2])
"""


@pytest.mark.usefixtures("airflow_db")
def test_a_mapped_decorated_task_runs_each_instance(tmp_path: Path, monkeypatch) -> None:
    """``.partial(...).expand(...)`` at run time: each mapped instance trains in its own
    location and returns its own result, in its own XCom."""
    import importlib.util

    from airflow import settings
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    (tmp_path / "dags").mkdir()
    path = tmp_path / "dags" / "spot_decorated_mapped.py"
    path.write_text(MAPPED_DAG.format(root=str(tmp_path)))
    monkeypatch.setattr(settings, "DAGS_FOLDER", str(tmp_path / "dags"))
    spec = importlib.util.spec_from_file_location("spot_decorated_mapped", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dr = module.dag.test()
    assert dr.state == "success"
    with create_session() as s:
        rows = s.scalars(
            select(XComModel).where(XComModel.run_id == dr.run_id, XComModel.key == "return_value")
        ).all()
        got = {
            r.map_index: r.value if isinstance(r.value, dict) else json.loads(r.value) for r in rows
        }
    assert sorted(got) == [0, 1]
    assert [got[i]["result"]["seed"] for i in (0, 1)] == [1, 2]
    assert all(got[i]["final_checkpoint"]["step"] == 20 for i in (0, 1))
    assert got[0]["final_checkpoint"]["uri"].startswith(str(tmp_path / "ckpt-0"))


def evaluates_after_training(session):
    """The last step is saved, then an evaluation takes a while before the return."""
    import time

    start, _ = session.resume()
    for step in range(start, session.total_steps):
        session.step_done(step + 1, lambda: {"w.txt": b"x"})
    time.sleep(2.0)
    return {"evaluated": True}


def test_the_job_waits_for_the_function_to_return_after_its_last_step(tmp_path: Path) -> None:
    """All the work is checkpointed before the function returns: the job ends with the
    attempt's own exit (its return value kept), not by stopping it as soon as the work is
    saved (which a command's job does: it has no value to return)."""
    from airflow_spot.backends.local import LocalBackend
    from airflow_spot.testing import FileTaskStateStore, make_context

    with _dag() as dag:
        task.spot_training(
            checkpoint_uri=str(tmp_path / "ckpt"),
            expected_compute=timedelta(seconds=1),
            total_steps=5,
            deadline="1m",
            changeover=timedelta(seconds=0.1),
            # a stopped attempt is killed 0.5 s after its SIGTERM: before its return
            backend=LocalBackend(work_dir=str(tmp_path / "runs"), time_scale=60.0, grace_s=0.5),
            decision_interval=timedelta(seconds=0.2),
            poll_interval=0.1,
            deferrable=False,
        )(evaluates_after_training)()
    op = dag.get_task("evaluates_after_training")
    summary = op.execute(make_context(FileTaskStateStore(tmp_path / "state.json")))
    assert summary["result"] == {"evaluated": True}, summary.get("result_missing")
    assert summary["attempts"][-1]["outcome"] == "succeeded"


def test_a_mapped_task_gets_the_operators_default_retries() -> None:
    """The scheduler counts a mapped task's tries from its partial arguments: the operator's
    3 retries there, as an unmapped task has them, unless the task or the DAG gives some."""
    from airflow_spot.operators import SpotTrainingOperator

    with _dag() as dag:
        task.spot_training(**GOOD)(train).expand(lr=[0.1])
        SpotTrainingOperator.partial(task_id="classic", **GOOD).expand(command=[["python"]])
    assert dag.get_task("train").partial_kwargs["retries"] == 3
    assert dag.get_task("classic").partial_kwargs["retries"] == 3
    with DAG("given", schedule=None, default_args={"retries": 1}) as given:
        task.spot_training(**GOOD)(train).expand(lr=[0.1])
    assert given.get_task("train").partial_kwargs["retries"] == 1
