"""What a replay has seen of spot's runs: a jump's changes, told at once, leave what each seen
one by one would leave."""

from __future__ import annotations

import random

import pytest

from airflow_spot.simulate.spot_runs import SpotRuns


def _runs(up: bool, since: float, last_up: float | None, last_down: float | None) -> SpotRuns:
    runs = SpotRuns()
    runs.up, runs.since, runs.seen_at = up, since, since
    runs.last[True], runs.last[False] = last_up, last_down
    return runs


@pytest.mark.parametrize("seed", range(40))
def test_changes_told_at_once_equal_changes_seen_one_by_one(seed: int) -> None:
    """Any number of changes (none, one, two, many), from a run that began at 0 (never
    measured) or later: the state, its start and the last run of each kind agree."""
    rng = random.Random(seed)
    up, since = rng.random() < 0.5, rng.choice([0.0, 600.0, 1234.5])
    count = rng.choice([0, 1, 2, 3, 4, rng.randrange(5, 40)])
    times, t = [], since
    for _ in range(count):
        t += rng.choice([600.0, 1200.0, 0.1 + rng.random() * 5000])
        times.append(t)
    last = (rng.choice([None, 42.0]), rng.choice([None, 7.5]))
    one_by_one, at_once = _runs(up, since, *last), _runs(up, since, *last)
    for now in times:
        one_by_one.see(now, not one_by_one.up)
    at_once.see_changes(times)
    assert (at_once.up, at_once.since, at_once.last) == (
        one_by_one.up,
        one_by_one.since,
        one_by_one.last,
    )
