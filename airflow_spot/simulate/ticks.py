"""The tick rules every replay shares (:mod:`.engine`'s and :mod:`.pools`'): one tick, the
changeover it pays."""

from __future__ import annotations

from functools import lru_cache

from airflow_spot.policy import JobSpec
from airflow_spot.policy.base import EPS

Step = tuple[float, float, float]  # (progress, seconds launching, changeover left after it)


def check_tick(job: JobSpec, gap: float, whose: str = "the trace's") -> None:
    """A job is replayed on ticks of its own ``tick_s`` only."""
    if abs(job.tick_s - gap) > 1e-9:
        raise ValueError(f"job.tick_s={job.tick_s} must equal {whose} tick {gap}")


def changeover(gap: float, left: float) -> Step:
    """A tick of ``gap`` seconds on capacity with ``left`` seconds of changeover still to pay:
    ``(progress, seconds launching, changeover left after it)``. The changeover is paid first
    and the rest of the tick progresses; less than :data:`EPS` left counts as none."""
    w = gap - left if gap > left else 0.0
    launching = gap - w
    left = left - launching
    if left < EPS:
        left = 0.0
    return w, launching, left


@lru_cache(maxsize=64)  # a sweep replays one job shape over many windows
def changeover_steps(gap: float, changeover_s: float) -> dict[float, Step]:
    """:func:`changeover` for every changeover a replay's tick can start with: none, the job's
    ``changeover_s`` (a launch) and what each tick leaves of it. The replay reads this table
    at every tick, a lookup cheaper than the arithmetic or a call (shared: read it only)."""
    steps = {0.0: changeover(gap, 0.0)}
    left = changeover_s
    while left not in steps:
        steps[left] = step = changeover(gap, left)
        left = step[2]
    return steps
