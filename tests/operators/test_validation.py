"""Bad input is rejected when the DAG is parsed (or, for templated values, when the task starts),
with an error naming the argument."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

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
    now = datetime(2026, 6, 1, tzinfo=timezone.utc).timestamp()
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
