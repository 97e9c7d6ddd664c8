"""Bad input is rejected when the DAG is parsed (or, for templated values, when the task starts),
with an error naming the argument."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.exceptions import ConfigError, UnknownPolicy
from airflow_spot.operators import SpotTrainingOperator

OK = dict(
    task_id="t",
    command=["python", "train.py"],
    checkpoint_uri="/tmp/ckpt",
    expected_compute=timedelta(hours=4),
    total_steps=100,
    deadline=timedelta(hours=6),
)


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"command": None}, "command", "give the training command"),
        ({"command": []}, "command", "give the training command"),
        ({"checkpoint_uri": "s3://"}, "checkpoint_uri", "s3://bucket/prefix"),
        ({"checkpoint_uri": "gs2x://b/p"}, "checkpoint_uri", "unsupported scheme"),
        ({"checkpoint_uri": "s3://b/../x"}, "checkpoint_uri", "bucket name"),
        ({"checkpoint_uri": "s3://bucket/a/../b"}, "checkpoint_uri", "'..'"),
        ({"checkpoint_uri": "/data/ckpt/../../etc"}, "checkpoint_uri", "must not contain '..'"),
        ({"checkpoint_uri": "file:///data/ckpt/.."}, "checkpoint_uri", "must not contain '..'"),
        ({"deadline": timedelta(hours=3)}, "deadline", "shorter than the work"),
        ({"deadline": timedelta(hours=-1)}, "deadline", "shorter than the work"),
        ({"deadline": None}, "deadline", "give a deadline"),
        ({"deadline": datetime(2030, 1, 1)}, "deadline", "timezone-aware"),
        ({"max_preemptions": -1}, "max_preemptions", ">= 0"),
        ({"max_failures": -2}, "max_failures", ">= 0"),
        ({"expected_compute": None}, "expected_compute", "positive timedelta"),
        ({"total_steps": 0}, "total_steps", "positive integer"),
        ({"on_demand_price": 0}, "on_demand_price", "> 0"),
        ({"on_preemption_budget": "retry"}, "on_preemption_budget", "must be one of"),
        ({"backend": "mars"}, "backend", "unknown backend"),
        ({"policy": "cheapest"}, "policy", "unknown policy 'cheapest'"),
        ({"policy": None}, "policy", "must be a policy name"),
        ({"command": "   "}, "command", "is blank"),
        ({"command": "python 'train.py"}, "command", "cannot be split like a shell"),
        ({"command": ["python", None]}, "command", "item 1 is None (NoneType)"),
        ({"command": {"python": 1}}, "command", "must be a list of strings or a string"),
        ({"checkpoint_uri": 5}, "checkpoint_uri", "must be a string"),
        ({"backend": {"name": "kubernetes"}}, "backend", "dict is not a backend"),
        ({"backend": LocalBackend}, "backend", "LocalBackend is a class: give an instance"),
        ({"aws_conn_id": 3}, "aws_conn_id", "must be an Airflow connection id"),
        ({"spot_price": float("nan")}, "spot_price", ">= 0"),
        ({"on_demand_price": float("inf")}, "on_demand_price", "> 0"),
        ({"on_demand_price": "3.06"}, "on_demand_price", "> 0"),
        ({"max_failures": True}, "max_failures", "integer >= 0"),
        ({"max_failures": None}, "max_failures", "got None"),
        ({"max_preemptions": 2.0}, "max_preemptions", "integer >= 0"),
        ({"total_steps": True}, "total_steps", "positive integer"),
        ({"decision_interval": timedelta(microseconds=1)}, "decision_interval", "at least 0.1 s"),
        ({"poll_interval": 1e-6}, "poll_interval", ">= 0.01"),
        ({"poll_interval": float("nan")}, "poll_interval", ">= 0.01"),
        ({"deadline": "3h"}, "deadline", "shorter than the work"),
        ({"deadline": "soon"}, "deadline", "neither an ISO datetime nor a duration"),
        ({"deadline": "2030-01-01T00:00:00"}, "deadline", "has no timezone"),
        ({"deadline": "3600"}, "deadline", "has no unit; write e.g. '3600h' or '3600s'"),
        ({"deadline": 6}, "deadline", "got int"),
        (
            {"decision_interval": timedelta(minutes=40)},
            "decision_interval",
            "more than a quarter of the slack",
        ),
    ],
)
def test_bad_arguments_are_named_at_parse_time(changes: dict, field: str, fragment: str) -> None:
    """Each bad argument raises ConfigError naming it, before any task runs."""
    with pytest.raises(ConfigError) as e:
        SpotTrainingOperator(**{**OK, **changes})
    assert e.value.field == field
    assert fragment in str(e.value)


def test_unknown_policy_is_an_unknown_policy_error() -> None:
    """An unknown policy raises UnknownPolicy (a ConfigError) listing the choices."""
    with pytest.raises(UnknownPolicy, match="deadline_aware"):
        SpotTrainingOperator(**{**OK, "policy": "nope"})


def test_templated_values_are_checked_when_the_task_starts() -> None:
    """A templated deadline passes parsing and is checked once rendered, naming the field."""
    op = SpotTrainingOperator(
        **{**OK, "deadline": "{{ params.deadline }}", "checkpoint_uri": "{{ params.uri }}"}
    )
    now = datetime(2026, 6, 1, tzinfo=UTC).timestamp()
    op.deadline = "2026-05-01T00:00:00+00:00"  # as rendered: in the past
    with pytest.raises(
        ConfigError, match="deadline: 2026-05-01T00:00:00\\+00:00 is already in the past"
    ):
        op._resolve_deadline(now)
    op.deadline = "2026-07-01T00:00:00"  # no timezone: never guessed
    with pytest.raises(ConfigError, match="deadline: '2026-07-01T00:00:00' has no timezone"):
        op._resolve_deadline(now)
    op.deadline = "2h"
    with pytest.raises(
        ConfigError, match="deadline: 2.00 h from the start is shorter than the work"
    ):
        op._resolve_deadline(now)
    op.deadline = "whenever"
    with pytest.raises(ConfigError, match="neither an ISO datetime nor a duration"):
        op._resolve_deadline(now)
    op.deadline = "8h"
    assert op._resolve_deadline(now) == now + 8 * 3600


def test_default_retry_policy_fails_fast_on_config_and_retries_backend_errors() -> None:
    """The operator's retry policy fails configuration errors at once and retries backend errors."""
    from airflow.sdk import RetryAction

    from airflow_spot.exceptions import BackendError, FailureBudgetExhausted

    policy = SpotTrainingOperator(**OK).retry_policy
    assert policy.evaluate(ConfigError("deadline", "x"), 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(FailureBudgetExhausted("x"), 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(BackendError("x"), 1, 3).action is RetryAction.RETRY


def test_values_resolved_later_pass_parsing() -> None:
    """Templates and XComArgs are checked when the task starts; a Path is taken as a path."""
    from pathlib import Path

    from airflow.sdk import DAG, task

    with DAG("resolved_later", schedule=None):

        @task
        def where() -> str:
            return "/tmp/ckpt"

        op = SpotTrainingOperator(
            **{**OK, "checkpoint_uri": where(), "command": "python {{ params.script }}"}
        )
    assert op.checkpoint_uri is not None
    jinja = "{% if params.long %}8h{% else %}6h{% endif %}"
    assert SpotTrainingOperator(**{**OK, "deadline": jinja}).deadline == jinja
    assert (
        SpotTrainingOperator(**{**OK, "checkpoint_uri": Path("/tmp/x")}).checkpoint_uri == "/tmp/x"
    )


def test_partial_arguments_are_checked_at_parse_time() -> None:
    """``partial()`` checks what it is given at once (mapped instances are only built when
    they run); what ``expand()`` supplies later is not required yet."""
    from airflow.sdk import DAG

    with DAG("mapped", schedule=None):
        with pytest.raises(ConfigError) as e:
            SpotTrainingOperator.partial(
                task_id="bad", command="python train.py", on_demand_price=float("nan")
            )
        assert e.value.field == "on_demand_price"
        with pytest.raises(ConfigError) as e:
            SpotTrainingOperator.partial(
                task_id="bad2",
                expected_compute=timedelta(hours=4),
                changeover=timedelta(0),
                deadline="3h",
            )
        assert e.value.field == "deadline"
        with pytest.raises(ConfigError, match="deadline: 3.00 h from the start is shorter"):
            SpotTrainingOperator.partial(  # no changeover given: the work alone does not fit
                task_id="bad3", expected_compute=timedelta(hours=4), deadline="3h"
            )
        # literal values given to expand() are checked item by item, with partial()'s
        for mapped, match in (
            (
                {"command": [["python", "t.py"], ["python", None]]},
                "command: expand\\(\\) item 1: item 1 is None",
            ),
            ({"policy": ["greedy", "nope"]}, "policy: expand\\(\\) item 1: unknown policy 'nope'"),
            ({"deadline": ["10h", "3h"]}, "deadline: expand\\(\\) item 1: 3.00 h from the start"),
        ):
            with pytest.raises(ConfigError, match=match):
                SpotTrainingOperator.partial(
                    task_id=f"exp_{next(iter(mapped))}",
                    expected_compute=timedelta(hours=4),
                    **({"deadline": "10h"} if "deadline" not in mapped else {}),
                ).expand(**mapped)
        # the changeover may still come from expand(): the span is checked when it runs
        SpotTrainingOperator.partial(
            task_id="later", expected_compute=timedelta(hours=4), deadline="4.02h"
        ).expand(changeover=[timedelta(0), timedelta(seconds=30)])
        from pathlib import Path

        SpotTrainingOperator.partial(task_id="path", checkpoint_uri=Path("/tmp/x")).expand(
            command=[["python", "a.py"]]
        )
        mapped = SpotTrainingOperator.partial(
            task_id="ok",
            command="python train.py",
            expected_compute=timedelta(hours=4),
            deadline="6h",
        ).expand(checkpoint_uri=["/tmp/a", "/tmp/b"])
    assert mapped.task_id == "ok"


def test_decision_interval_too_coarse_for_a_rendered_deadline_is_a_warning(capfd) -> None:
    """A deadline known only when the task starts (rendered, or a datetime) may leave little
    slack; an interval too coarse for it only costs money then: a warning, not a failure."""
    op = SpotTrainingOperator(**{**OK, "deadline": "{{ params.deadline }}"})
    op.deadline = "4.5h"  # slack 25 min: a 60 s interval fits, 10 min does not
    assert op._resolve_deadline(0.0) == 4.5 * 3600
    assert "decision_interval" not in "".join(capfd.readouterr())
    op.decision_interval = timedelta(minutes=10)
    assert op._resolve_deadline(0.0) == 4.5 * 3600
    assert "decision_interval: 0.17 h is more than a quarter of the slack" in "".join(
        capfd.readouterr()
    )


def test_a_relative_checkpoint_path_with_kubernetes_is_an_error() -> None:
    """The pod and the worker resolve a relative path in different places."""
    from airflow_spot.backends.kubernetes.backend import KubernetesBackend

    kube = KubernetesBackend(image="img")
    with pytest.raises(ConfigError, match="checkpoint_uri: 'ckpt/run' is a relative path"):
        SpotTrainingOperator(**{**OK, "checkpoint_uri": "ckpt/run", "backend": kube})
    SpotTrainingOperator(**{**OK, "checkpoint_uri": "s3://bucket/run", "backend": kube})


def test_an_xcomarg_only_where_airflow_resolves_it() -> None:
    """Airflow resolves XComArgs in template fields only: elsewhere one is refused at parse
    time (it would reach the job unresolved); partial() stays refused on a task."""
    from airflow.sdk import DAG, task

    with DAG("xcom_args", schedule=None):

        @task
        def hours() -> int:
            return 4

        with pytest.raises(ConfigError) as e:
            SpotTrainingOperator(**{**OK, "task_id": "x", "expected_compute": hours()})
        assert e.value.field == "expected_compute"
        op = SpotTrainingOperator(**{**OK, "task_id": "y"})
    with pytest.raises(TypeError, match="only be called on Operator classes"):
        op.partial(task_id="z")


def test_rendered_values_are_checked_when_the_task_starts(tmp_path) -> None:
    """What templates render to (natively too) is checked before anything runs: numbers in
    the command become strings; a number as the deadline and a relative path for Kubernetes
    are ConfigErrors naming the field."""
    from airflow_spot.backends.kubernetes.backend import KubernetesBackend
    from airflow_spot.testing import FileTaskStateStore, make_context

    store = FileTaskStateStore(tmp_path / "s.json")
    op = SpotTrainingOperator(**{**OK, "deadline": "{{ params.dl }}"})
    op.deadline = 30  # render_template_as_native_obj=True
    with pytest.raises(ConfigError, match="deadline: must be a datetime, a timedelta or a string"):
        op.execute(make_context(store))
    op.deadline = "6h"
    op.command = ["python", "train.py", "--steps", 100, "--lr", 0.05]
    op._check_rendered()
    assert op.command == ["python", "train.py", "--steps", "100", "--lr", "0.05"]
    kube = SpotTrainingOperator(
        **{**OK, "checkpoint_uri": "{{ params.p }}", "backend": KubernetesBackend(image="i")}
    )
    kube.checkpoint_uri = "ckpt/x"
    with pytest.raises(ConfigError, match="checkpoint_uri: 'ckpt/x' is a relative path"):
        kube.execute(make_context(store))
    with pytest.raises(ConfigError, match="'ckpt/{{ run_id }}' is a relative path"):
        SpotTrainingOperator(
            **{
                **OK,
                "checkpoint_uri": "ckpt/{{ run_id }}",
                "backend": KubernetesBackend(image="i"),
            }
        )
    assert store.get("airflow_spot_job") is None


@pytest.mark.parametrize(
    ("changes", "warned"),
    [
        ({}, "spot_price ($0.9731/h) and on_demand_price ($3.06/h) not given"),
        ({"on_demand_price": 32.77}, "spot_price ($0.9731/h) not given"),
        ({"spot_price": 9.8, "on_demand_price": 32.77}, None),
    ],
)
def test_a_kubernetes_job_on_the_reference_prices_says_so(changes, warned, capfd) -> None:
    """On real capacity, prices not given are the benchmark's p3.2xlarge ones: costs and
    savings in the UI would be made up, so the task log says which and how to fix it. The
    simulated local market is not warned about."""
    from airflow_spot.backends.kubernetes.backend import KubernetesBackend

    op = SpotTrainingOperator(
        **{**OK, "checkpoint_uri": "s3://bucket/run", "backend": KubernetesBackend(image="i")},
        **changes,
    )
    assert (op.spot_price, op.on_demand_price) == (
        changes.get("spot_price", 0.9731),
        changes.get("on_demand_price", 3.06),
    )
    capfd.readouterr()
    op._new_state(0.0)
    text = "".join(capfd.readouterr())
    if warned:
        assert warned in text and "Give the prices of your instance type" in text
    else:
        assert "not given" not in text
    SpotTrainingOperator(**OK)._new_state(0.0)
    assert "not given" not in "".join(capfd.readouterr())


def test_a_third_party_backend_is_checked_against_the_protocol_at_parse_time() -> None:
    """A backend object that implements every member of Backend is accepted; one that lacks a
    method or a property is refused when the DAG is parsed, naming what it lacks."""
    from airflow_spot.backends.base import BACKEND_ATTRIBUTES, BACKEND_METHODS, Backend

    def member(name: str):
        return lambda self, *a, **k: None

    values = {
        "kind": "mine",
        "time_scale": 1.0,
        "spot_cooldown_s": 60.0,
        "notice_to_kill_s": None,
        "runs_on_worker": False,
        "node_pools": (),
    }
    assert set(values) == set(BACKEND_ATTRIBUTES)
    members = {**values, **{m: member(m) for m in BACKEND_METHODS}}
    complete = type("Complete", (), members)()
    assert isinstance(complete, Backend)
    SpotTrainingOperator(**{**OK, "checkpoint_uri": "s3://my-bucket/p", "backend": complete})
    for missing in (*BACKEND_METHODS, *BACKEND_ATTRIBUTES):
        lacking = type("Lacking", (), {k: v for k, v in members.items() if k != missing})()
        with pytest.raises(ConfigError, match=f"lacks {missing}") as e:
            SpotTrainingOperator(**{**OK, "checkpoint_uri": "s3://my-bucket/p", "backend": lacking})
        assert e.value.field == "backend" and "Backend interface" in str(e.value)


def test_retries_default_to_a_few_and_a_given_value_is_kept() -> None:
    """Retries default to 3 (spent on the orchestration's own errors only, each try
    re-attaching); ``retries`` given to the operator or through ``default_args`` wins."""
    from airflow.sdk import DAG

    from airflow_spot.operators.retry import DEFAULT_RETRIES

    assert DEFAULT_RETRIES == 3
    assert SpotTrainingOperator(**OK).retries == 3
    assert SpotTrainingOperator(**OK, retries=0).retries == 0
    with DAG("with_defaults", schedule=None, default_args={"retries": 1}):
        assert SpotTrainingOperator(**OK).retries == 1
