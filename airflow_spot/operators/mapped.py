"""Mapped tasks: ``SpotTrainingOperator.partial(...)`` checks the arguments it is given when the
DAG is parsed, and ``.expand()`` each literal value it maps over, with them."""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

from airflow_spot.exceptions import ConfigError
from airflow_spot.operators.arguments import ARGUMENTS, check_arguments
from airflow_spot.operators.retry import mapped_retries


def _checked_partial(cls: type, **kwargs: Any) -> Any:
    """As ``BaseOperator.partial``, but the arguments given here are checked now (at parse
    time), not first when a mapped instance runs."""
    from airflow.sdk.bases.operator import partial

    uri = kwargs.get("checkpoint_uri")
    if isinstance(uri, os.PathLike):
        kwargs["checkpoint_uri"] = os.fspath(uri)
    check_arguments(_partial_given(kwargs), partial=True)
    made = partial(cls, **mapped_retries(kwargs))
    made._expand_called = True  # replaced by the checked one below (no "never mapped" warning)
    return _checked_expand_class()(
        operator_class=made.operator_class, kwargs=made.kwargs, params=made.params
    )


def _partial_given(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The operator's arguments among ``partial()``'s, as checked at parse time: a deadline
    shorter than the work alone is wrong whatever changeover ``expand()`` may bring."""
    given = {k: v for k, v in kwargs.items() if k in ARGUMENTS}
    given.setdefault("changeover", timedelta(0))
    return given


@functools.cache
def _checked_expand_class() -> type:
    """``OperatorPartial`` whose ``expand()`` checks literal values (each list item) at parse
    time as well, with what ``partial()`` was given (a mapped instance is only built when it
    runs). XComArgs and templates are checked when the task starts."""
    import attrs
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    @attrs.define(kw_only=True, repr=False)
    class CheckedPartial(OperatorPartial):
        def expand(self, **mapped: Any) -> Any:
            given = _partial_given(self.kwargs)
            for name, values in mapped.items():
                if name not in ARGUMENTS or not isinstance(values, (list, tuple)):
                    continue
                for i, value in enumerate(values):
                    try:
                        check_arguments({**given, name: value}, partial=True)
                    except ConfigError as e:
                        self._expand_called = True  # refused, not forgotten
                        msg = str(e).partition(": ")[2]
                        raise ConfigError(e.field, f"expand() item {i}: {msg}") from None
            return super().expand(**mapped)

    return CheckedPartial


class CheckedPartialDescriptor:
    """``SpotTrainingOperator.partial``: checked, and refused on a task (as Airflow's is)."""

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is not None:

            def partial(**kwargs: Any) -> Any:
                raise TypeError(
                    "partial can only be called on Operator classes, not Tasks themselves"
                )

            return partial
        return functools.partial(_checked_partial, cls)
