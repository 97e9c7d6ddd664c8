"""``@task.spot_training(...)``: the TaskFlow form of :class:`SpotTrainingOperator`.

::

    @task.spot_training(checkpoint_uri=..., expected_compute=timedelta(hours=4),
                        total_steps=4000, deadline="6h", outlets=[model])
    def train(session, lr: float):
        import numpy as np                      # everything it uses, imported inside
        start, files = session.resume()
        ...
        for step in range(start, session.total_steps):
            ...
            session.step_done(step + 1, lambda: {"w.npy": ...})
        return {"accuracy": acc}                # a small JSON value, in the XCom's "result"

    train(lr=0.1)                               # or train.partial(...).expand(lr=[...])

The decorator takes the operator's arguments (all but ``command``: the function is the training
entry point), checked as the operator checks them, when the DAG is parsed; and three of its
own: ``save_every`` and ``keep`` (the session's), and ``python`` (the interpreter that runs
the function: by default the worker's own where attempts run on the worker, ``python`` in the
image on Kubernetes). Each attempt runs ``python -m airflow_spot.decorators.entry PAYLOAD``,
the payload holding the function's source and its rendered arguments
(:mod:`airflow_spot.decorators.source`): a fresh interpreter on the local backend, a container
of the user's image in a pod. The task's XCom is the ledger summary with the function's return
value under ``result``; a job that ends waits for the function to return after its last step.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attr
from airflow.sdk.bases.decorator import DecoratedOperator, _TaskDecorator

from airflow_spot.exceptions import ConfigError
from airflow_spot.operators.arguments import ARGUMENTS, check_arguments
from airflow_spot.operators.spot_training import SpotTrainingOperator

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator

    from airflow_spot.operators.job import JobArgs

ENTRY_COMMAND = ["python", "-m", "airflow_spot.decorators.entry"]  # + the payload, at launch


class SpotTrainingDecoratedOperator(DecoratedOperator, SpotTrainingOperator):
    """The operator behind ``@task.spot_training``: its command runs the decorated function."""

    custom_operator_name = "@task.spot_training"
    template_fields: Sequence[str] = ("op_args", "op_kwargs", "checkpoint_uri", "deadline")
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable",)
    returns_result = True

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Sequence[Any] | None = None,
        op_kwargs: dict[str, Any] | None = None,
        python: str | None = None,
        save_every: int = 50,
        keep: int = 3,
        **kwargs: Any,
    ) -> None:
        from airflow_spot.decorators.source import (
            check_function,
            check_literal_arguments,
            check_session_options,
        )

        if kwargs.get("command") is not None:
            raise ConfigError("command", _NO_COMMAND)
        sig = check_function(python_callable)
        check_session_options(save_every, keep, kwargs.get("total_steps"))
        if python is not None and (not isinstance(python, str) or not python.strip()):
            raise ConfigError("python", f"must be an interpreter's path or name, got {python!r}")
        self.python, self.save_every, self.keep = python, save_every, keep
        super().__init__(
            python_callable=_without_session(python_callable, sig),
            op_args=op_args,
            op_kwargs=op_kwargs,
            command=list(ENTRY_COMMAND),
            **kwargs,
        )
        check_literal_arguments(sig, self.op_args, self.op_kwargs)

    def job_args(self) -> JobArgs:
        """The loop's arguments; the command carries the function and its rendered arguments."""
        self.command = [*self._interpreter(), *ENTRY_COMMAND[1:], self._payload]
        return super().job_args()

    def _interpreter(self) -> list[str]:
        if self.python:
            return [self.python]
        on_worker = isinstance(self.backend, str) or self.backend.runs_on_worker
        return [sys.executable if on_worker else ENTRY_COMMAND[0]]

    @functools.cached_property
    def _payload(self) -> str:
        from airflow_spot.decorators.source import named, payload

        sig = inspect.signature(self.python_callable)
        session = {
            "total_steps": self.total_steps,
            "save_every": self.save_every,
            "keep": self.keep,
        }
        return payload(self.python_callable, named(sig, self.op_args, self.op_kwargs), session)


_NO_COMMAND = (
    "the decorated function is the training entry point: leave command out (use "
    "SpotTrainingOperator to run a command)"
)


def _without_session(fn: Callable[..., Any], sig: inspect.Signature) -> Callable[..., Any]:
    """``fn`` as the task is called (without ``session``, which the training process gives);
    its source is still ``fn``'s (``__wrapped__``)."""

    @functools.wraps(fn)
    def task_function(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{fn.__name__}() runs in the training process, not in the worker")

    task_function.__signature__ = sig  # type: ignore[attr-defined]
    return task_function


def check_decorator_arguments(kwargs: dict[str, Any], *, complete: bool) -> None:
    """The operator's arguments given to the decorator, checked as the operator checks them
    (``complete``: all of them are there, as when a mapped task expands)."""
    if kwargs.get("command") is not None:
        raise ConfigError("command", _NO_COMMAND)
    from airflow_spot.decorators.source import check_session_options

    given = {k: v for k, v in kwargs.items() if k in ARGUMENTS and k != "command"}
    if complete:  # as the operator will be built: its defaults where nothing is given
        given = {**_operator_defaults(), **given}
    else:  # the work alone must fit, whatever changeover override() may bring
        given.setdefault("changeover", timedelta(0))
    check_arguments({**given, "command": ENTRY_COMMAND}, partial=not complete)
    check_session_options(
        kwargs.get("save_every", 50),
        kwargs.get("keep", 3),
        kwargs.get("total_steps"),
        required=complete,
    )


@functools.cache
def _operator_defaults() -> dict[str, Any]:
    """The operator's own defaults of its checked arguments (None ones left out: resolved
    when it is built)."""
    params = inspect.signature(SpotTrainingOperator.__init__).parameters
    return {
        k: p.default
        for k, p in params.items()
        if k in ARGUMENTS and p.default is not p.empty and p.default is not None
    }


@attr.define(slots=False)
class _SpotTrainingTaskDecorator(_TaskDecorator):
    """Airflow's task decorator, whose ``expand()`` checks what a mapped instance would be
    built with now, at parse time (a mapped operator is only built when it runs)."""

    def _expand(self, expand_input: Any, *, strict: bool) -> Any:
        from airflow_spot.decorators.source import check_function, check_literal_arguments

        check_decorator_arguments(self.kwargs, complete=True)
        sig = check_function(self.function)
        check_literal_arguments(sig, (), self.kwargs.get("op_kwargs") or {})
        mapped = getattr(expand_input, "value", None)
        if isinstance(mapped, dict):
            for name, values in mapped.items():
                if isinstance(values, (list, tuple)):
                    for v in values:
                        check_literal_arguments(sig, (), {name: v})
        from airflow_spot.operators.retry import mapped_retries

        self.kwargs = mapped_retries(self.kwargs)  # what the scheduler counts tries from
        return super()._expand(expand_input, strict=strict)


def spot_training_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """``@task.spot_training(...)``: see the module's docstring. The XCom is one dict (the
    summary and ``result``) unless ``multiple_outputs=True``, whatever the function's return
    annotation says (its return value is only a part of it)."""
    check_decorator_arguments(kwargs, complete=False)

    def decorate(fn: Callable[..., Any]) -> Any:
        return _SpotTrainingTaskDecorator(
            function=fn,
            multiple_outputs=bool(multiple_outputs),
            operator_class=SpotTrainingDecoratedOperator,
            kwargs=kwargs,
            decorator_name="task.spot_training",
        )

    if python_callable is not None:
        if not callable(python_callable):
            raise TypeError("@task.spot_training takes no positional argument but the function")
        return decorate(python_callable)  # type: ignore[return-value]
    return decorate  # type: ignore[return-value]
