"""Spot's availability as the operator may know it: the one place it is decided, for the
controller's turn (``operators/``) and for the watcher (``triggers/``, in the triggerer or the
worker). It sits below both so that they run the same code, not two copies that agree by luck.

Pure: no Airflow, no clock (``now`` is an argument). ``attempts`` are the job's
:class:`~airflow_spot.jobstate.AttemptRecord` list (read for capacity, pool, outcome, ended_at).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from airflow_spot.backends.local.market import Pools

# outcomes that keep a pool out for its cool-down: on a replayed market only a preemption (the
# market says when a waiting request is granted); on node pools a spot pod pending too long too
LOST_ON_MARKET: tuple[str, ...] = ("preempted",)
LOST_ON_NODES: tuple[str, ...] = ("preempted", "spot_unavailable")


def cooling_until(
    attempts: Sequence[Any], now: float, *, market: Pools | None, cooldown_s: float
) -> dict[str, float]:
    """The spot pools kept out now, each with the wall time its cool-down ends (a replayed
    market's own cool-down, else ``cooldown_s``)."""
    if market is not None:
        cool, lost = market.cooldown_wall_s, LOST_ON_MARKET
    else:
        cool, lost = cooldown_s, LOST_ON_NODES
    out: dict[str, float] = {}
    for a in attempts:
        ended = a.ended_at
        if a.capacity == "spot" and a.pool and a.outcome in lost and ended:
            until = ended + cool
            if now < until:
                out[a.pool] = max(out.get(a.pool, 0.0), until)
    return out


def replayed_spot(market: Pools, now: float, cooling: dict[str, float] | None) -> bool:
    """A replayed market: some pool not cooling down has capacity now."""
    return market.available_at(now, {p for p, until in (cooling or {}).items() if now < until})


def spot_available(
    now: float,
    *,
    market: Pools | None,
    cooling: dict[str, float],
    node_pools: Iterable[str],
    attempts: Sequence[Any],
    cooldown_s: float,
) -> bool:
    """Whether spot counts as available now. A replayed market answers; without one (real
    capacity) spot counts as down while every node pool cools down, or, with one spot
    placement, for ``cooldown_s`` after it was last lost."""
    if market is not None:
        return replayed_spot(market, now, cooling)
    names = set(node_pools)
    if names:
        return bool(names - set(cooling))
    for a in reversed(attempts):
        if a.capacity == "spot" and a.outcome in LOST_ON_NODES and a.ended_at:
            return now - a.ended_at >= cooldown_s
    return True
