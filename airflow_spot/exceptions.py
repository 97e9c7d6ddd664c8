"""Every error airflow-spot raises, in one place.

::

    SpotError
    ├── ConfigError                 a value a user gave is wrong; names the field and the fix
    │   ├── InvalidJobSpec          work, deadline, changeover or price out of range
    │   ├── InfeasibleDeadline      work + changeover does not fit before the deadline
    │   ├── UnknownPolicy           no policy registered under that name
    │   └── TraceFormatError        a trace file is malformed or ambiguous
    ├── BudgetExhausted             a run stopped because a budget is spent
    │   ├── PreemptionBudgetExhausted
    │   └── FailureBudgetExhausted
    ├── CheckpointError             a checkpoint could not be written or read
    └── BackendError                the place where attempts run misbehaved

A preemption is never an application failure: they live in different branches and spend
different budgets.
"""

from __future__ import annotations

import math
import numbers
from typing import TypeGuard


class SpotError(Exception):
    """Base of every airflow-spot error."""


class ConfigError(SpotError, ValueError):
    """A value given by the user is wrong. The message names the field and the fix."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class InvalidJobSpec(ConfigError):
    """A job's work, deadline, changeover or prices are out of range."""


class InfeasibleDeadline(ConfigError):
    """Even all on-demand, the remaining work plus one changeover misses the deadline."""


class UnknownPolicy(ConfigError):
    """No policy is registered under the given name."""


class TraceFormatError(ConfigError):
    """A trace file is malformed, or ambiguous without more information."""


class BudgetExhausted(SpotError):
    """A run stopped because one of its budgets is spent."""


class PreemptionBudgetExhausted(BudgetExhausted):
    """More preemptions than ``max_preemptions`` allows."""


class FailureBudgetExhausted(BudgetExhausted):
    """More application failures than ``max_failures`` allows."""


class CheckpointError(SpotError):
    """A checkpoint could not be written, listed or read."""


class BackendError(SpotError):
    """The backend that runs attempts failed (not the training code, not a preemption)."""


def finite_number(v: object) -> TypeGuard[float]:
    """A real, finite number (numpy's too; not a bool, not a string like "1.10")."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
