"""Job validation: every bad value is rejected naming the field."""

from __future__ import annotations

import pytest

from airflow_spot.exceptions import ConfigError, InfeasibleDeadline, InvalidJobSpec
from airflow_spot.policy import HOUR, JobSpec

OK = dict(work_s=48 * HOUR, deadline_s=60 * HOUR, changeover_s=0.2 * HOUR)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("work_s", 0),
        ("work_s", -1.0),
        ("deadline_s", -5.0),
        ("changeover_s", -0.1),
        ("on_demand_price", 0),
        ("spot_price", -1.0),
        ("tick_s", 0),
        ("max_preemptions", -1),
        ("work_s", float("nan")),
    ],
)
def test_invalid_values_name_the_field(field: str, value: float) -> None:
    """A negative, zero or non-finite value raises InvalidJobSpec naming the field."""
    with pytest.raises(InvalidJobSpec) as e:
        JobSpec(**{**OK, field: value})
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}:")


def test_deadline_before_work_is_rejected() -> None:
    """A deadline shorter than the work is rejected naming deadline_s and both figures."""
    with pytest.raises(
        InvalidJobSpec, match=r"deadline_s: the deadline \(40.00 h\) is before .* \(48.00 h"
    ):
        JobSpec(**{**OK, "deadline_s": 40 * HOUR})


def test_infeasible_job_gives_the_figures() -> None:
    """Work plus changeover beyond the deadline raises InfeasibleDeadline with all three figures."""
    with pytest.raises(InfeasibleDeadline) as e:
        JobSpec(work_s=48 * HOUR, deadline_s=48.1 * HOUR, changeover_s=0.2 * HOUR)
    msg = str(e.value)
    assert "48.00 h of work" in msg and "0.20 h" in msg and "48.20 h > deadline 48.10 h" in msg
    assert isinstance(e.value, ConfigError)


def test_valid_job_keeps_its_values() -> None:
    """A valid job is built as given and exposes its slack."""
    job = JobSpec(**OK)
    assert job.slack_s == 12 * HOUR
