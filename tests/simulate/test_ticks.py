"""The tick rules the replays share: the job's tick, the changeover a tick pays."""

from __future__ import annotations

import pytest

from airflow_spot.policy import JobSpec
from airflow_spot.simulate.ticks import changeover, check_tick


def test_a_tick_pays_the_changeover_first() -> None:
    """Less than a tick of changeover: paid, then the rest of the tick progresses; more: the
    whole tick launches; a remainder under a millisecond counts as none."""
    assert changeover(600.0, 720.0) == (0.0, 600.0, 120.0)
    assert changeover(600.0, 120.0) == (480.0, 120.0, 0.0)
    assert changeover(600.0, 0.0) == (600.0, 0.0, 0.0)
    assert changeover(600.0, 600.0 + 1e-4) == (0.0, 600.0, 0.0)


def test_the_tick_must_be_the_jobs() -> None:
    job = JobSpec(3600.0, 7200.0, 0.0, tick_s=600.0)
    check_tick(job, 600.0)
    with pytest.raises(ValueError, match="must equal the trace's tick 300.0"):
        check_tick(job, 300.0)
