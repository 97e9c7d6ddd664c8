"""The tick rules the replays share: the job's tick, the changeover a tick pays (tabulated as
the replay's loop reads it)."""

from __future__ import annotations

import pytest

from airflow_spot.policy import JobSpec
from airflow_spot.simulate.ticks import changeover, changeover_steps, check_tick


@pytest.mark.parametrize(
    ("gap", "changeover_s"),
    [(600.0, 720.0), (600.0, 0.0), (600.0, 300.0), (600.0, 1200.0), (600.0, 442.8), (7.5, 0.0005)],
)
def test_the_table_holds_every_changeover_a_tick_starts_with(gap: float, changeover_s: float):
    """From a launch, each tick leaves a changeover the table holds, down to none, and every
    entry is what :func:`changeover` makes of it."""
    steps = changeover_steps(gap, changeover_s)
    left, met = changeover_s, {0.0}
    while left != 0.0:
        assert steps[left] == changeover(gap, left)
        met.add(left)
        w, launching, left = steps[left]
        assert w + launching == pytest.approx(gap) and left >= 0.0
    assert steps[0.0] == changeover(gap, 0.0) == (gap, 0.0, 0.0)
    assert set(steps) == met


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
