"""Airflow's retries are spent on the orchestration's own errors only: a configuration error
or a spent budget fails the task at once; a backend error retries (and re-attaches)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_spot.exceptions import BackendError, BudgetExhausted, ConfigError

# Airflow's own default is 0: one api-server restart or lost worker then fails the job, its
# attempt left to its lease. The retry policy below spends retries only on the
# orchestration's errors (a configuration error or a spent budget fails at once), and a new
# try re-attaches to the live attempt, so a few retries cost nothing and save the run.
DEFAULT_RETRIES = 3

if TYPE_CHECKING:
    from airflow.sdk import Context


def tries_left(context: Context) -> bool:
    """Whether Airflow will run this task again after this try fails."""
    ti = context["ti"]
    return int(getattr(ti, "try_number", 1)) <= int(getattr(ti, "max_tries", 0) or 0)


def default_retry_policy():
    """Fail fast on configuration errors and spent budgets; retry the orchestration's own errors."""
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule

    return ExceptionRetryPolicy(
        rules=[
            RetryRule(
                exception=[ConfigError, BudgetExhausted],
                action=RetryAction.FAIL,
                reason="configuration error or spent budget: retrying cannot help",
            ),
            RetryRule(
                exception=BackendError,
                action=RetryAction.RETRY,  # after the task's own retry_delay / backoff
                reason="backend error: retry and re-attach",
            ),
        ]
    )


def mapped_retries(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A mapped task's arguments with the operator's :data:`DEFAULT_RETRIES` where neither
    they nor the DAG's ``default_args`` give ``retries``: the scheduler counts a mapped task's
    tries from them (the operator's ``__init__``, which sets the default, runs only later, in
    the worker), and Airflow's own default would be 0."""
    from airflow.sdk.definitions._internal.contextmanager import DagContext

    if "retries" in kwargs:
        return kwargs
    dag = kwargs.get("dag") or DagContext.get_current()
    given = {**(getattr(dag, "default_args", None) or {}), **(kwargs.get("default_args") or {})}
    return kwargs if "retries" in given else {**kwargs, "retries": DEFAULT_RETRIES}
