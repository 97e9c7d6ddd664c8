"""Multi-pool replay: the cheapest pool with capacity, cool-down after a preemption, per-tick prices."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_spot.policy import HOUR, JobSpec, get_policy
from airflow_spot.simulate import Trace
from airflow_spot.simulate.pools import choose_pool, replay_pools


def test_choose_pool_takes_the_cheapest_up_and_not_cooling() -> None:
    """Down or cooling pools are skipped; among the rest the cheapest wins."""
    assert choose_pool([True, True, True], [3.0, 1.0, 2.0], [False, False, False]) == 1
    assert choose_pool([True, False, True], [3.0, 1.0, 2.0], [False, False, False]) == 2
    assert choose_pool([True, True, True], [3.0, 1.0, 2.0], [False, True, False]) == 2
    assert choose_pool([False, False], [1.0, 1.0], [False, False]) is None


def _trace(name: str, avail: list[bool], price: float) -> Trace:
    return Trace(name, 600.0, np.array(avail), np.full(len(avail), price))


def test_moves_to_another_pool_when_its_pool_is_reclaimed() -> None:
    """Pool a (cheap) is reclaimed at tick 10; the job continues in b (dearer), a cools down."""
    a = _trace("a", [True] * 10 + [False] * 300, 1.0)
    b = _trace("b", [True] * 310, 2.0)
    job = JobSpec(3 * HOUR, 10 * HOUR, 600.0, tick_s=600.0)
    r = replay_pools(get_policy("greedy"), [a, b], job, cooldown_ticks=6)
    assert r.met and r.preemptions == 1
    assert r.launches_per_pool == {"a": 1, "b": 1}
    # 10 ticks of a at $1/h, then 9 ticks of b at $2/h (one of changeover + 8 of work)
    assert r.cost == pytest.approx(10 * 600 / HOUR * 1.0 + 10 * 600 / HOUR * 2.0, rel=0.15)


def test_pools_on_different_ticks_are_refused() -> None:
    """Pools must share the job's tick, as a single-trace replay must."""
    from dataclasses import replace

    a = _trace("a", [True] * 20, 1.0)
    b = replace(_trace("b", [True] * 40, 2.0), gap_s=300.0)
    with pytest.raises(ValueError, match="share one tick"):
        replay_pools(get_policy("greedy"), [a, b], JobSpec(HOUR, 3 * HOUR, 600.0, tick_s=600.0))
    with pytest.raises(ValueError, match="must equal the pools' tick"):
        replay_pools(get_policy("greedy"), [a], JobSpec(HOUR, 3 * HOUR, 600.0, tick_s=60.0))


def test_multi_pool_is_no_dearer_than_its_best_pool_here() -> None:
    """Two pools that fail at different times: spreading over both beats either alone."""
    rng = np.random.default_rng(1)
    a = _trace("a", list(rng.random(554) > 0.4), 1.0)
    b = _trace("b", list(rng.random(554) > 0.4), 1.1)
    job = JobSpec(48 * HOUR, 60 * HOUR, 0.2 * HOUR)
    both = replay_pools(get_policy("deadline_aware"), [a, b], job)
    alone = [replay_pools(get_policy("deadline_aware"), [p], job) for p in (a, b)]
    assert both.met and all(r.met for r in alone)
    assert both.cost < min(r.cost for r in alone)


def test_sweep_keeps_policy_variants_apart() -> None:
    """Rows of ``deadline_aware@<prior>`` are named by the spec, not the class's name."""
    from airflow_spot.simulate.sweep import Setting, sweep

    trace = Trace("t", 600.0, np.array([True, False] * 60))
    rows = sweep(
        [trace],
        ["deadline_aware", "deadline_aware@gcp-h100"],
        [Setting(8.0, 12.0, 0.2, 0.9731, 3.06)],
        workers=1,
    )
    assert sorted(r["policy"] for r in rows) == ["deadline_aware", "deadline_aware@gcp-h100"]
