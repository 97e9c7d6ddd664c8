"""Replay a policy over several spot pools (zones) at once, choosing the cheapest pool with
capacity at every launch, with a cool-down for a recently preempted pool (as SkyPilot does
across regions).

The rules are those of :mod:`.engine`, with spot being "up" when any pool out of cool-down has
capacity. A running spot instance stays in its pool until that pool is reclaimed (no
migration: it would pay a changeover). Every tick is billed at its own pool's price.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_spot.policy import Capacity, JobSpec, Policy
from airflow_spot.policy.base import EPS
from airflow_spot.simulate.spot_runs import SpotRuns
from airflow_spot.simulate.ticks import changeover, check_tick
from airflow_spot.simulate.traces import Trace

NONE, SPOT, OD = Capacity.NONE, Capacity.SPOT, Capacity.ON_DEMAND


@dataclass(frozen=True)
class PoolRun:
    cost: float
    met: bool
    preemptions: int
    launches_per_pool: dict[str, int]
    on_demand_cost: float

    @property
    def normalized_cost(self) -> float:
        return self.cost / self.on_demand_cost


def choose_pool(up: Sequence[bool], prices: Sequence[float], cooling: Sequence[bool]) -> int | None:
    """The cheapest pool that has capacity and is not cooling down (None if there is none)."""
    best = None
    for i, (u, p, c) in enumerate(zip(up, prices, cooling, strict=True)):
        if u and not c and (best is None or p < prices[best]):
            best = i
    return best


def replay_pools(
    policy: Policy, pools: Sequence[Trace], job: JobSpec, *, cooldown_ticks: int = 6
) -> PoolRun:
    """Replay ``policy`` with spot from the cheapest available pool of ``pools`` (aligned traces)."""
    if not pools:
        raise ValueError("replay_pools needs at least one pool")
    gap = pools[0].gap_s
    ticks = sorted({p.gap_s for p in pools})
    if len(ticks) > 1:
        raise ValueError(f"pools must share one tick; got {ticks} s (resample them)")
    check_tick(job, gap, "the pools'")
    n = min(len(p) for p in pools)
    avail = [p.available[:n].tolist() for p in pools]
    prices = [
        (p.prices[:n].tolist() if p.prices is not None else [job.spot_price] * n) for p in pools
    ]
    k = len(pools)
    cur, pool, rro, done, cost = NONE, None, 0.0, 0.0, 0.0
    preemptions, cool_until = 0, [-1] * k
    launches = {p.name: 0 for p in pools}
    runs, down = SpotRuns(), 0.0
    t = 0
    while True:
        now = t * gap
        up = [avail[i][t] if t < n else False for i in range(k)]
        cooling = [t < cool_until[i] for i in range(k)]
        any_up = any(u and not c for u, c in zip(up, cooling, strict=True))
        runs.see(now, any_up)
        if t > 0 and not runs.up:
            down += gap
        last = cur
        if last is not NONE:
            w, _, rro = changeover(gap, rro)
            done += min(w, job.work_s - done)
            if last is OD:
                cost += gap / 3600.0 * job.on_demand_price
            else:
                assert pool is not None  # spot always runs in a pool
                cost += gap / 3600.0 * prices[pool][t - 1]
                if not up[pool]:
                    cur = NONE
                    preemptions += 1
                    cool_until[pool] = t + cooldown_ticks
                    pool = None
        if job.work_s - done <= EPS:
            return PoolRun(
                cost, True, preemptions, launches, job.work_s / 3600 * job.on_demand_price
            )
        if now >= job.deadline_s:
            return PoolRun(
                cost, False, preemptions, launches, job.work_s / 3600 * job.on_demand_price
            )
        cooling = [t < cool_until[i] for i in range(k)]
        any_up = any(u and not c for u, c in zip(up, cooling, strict=True))
        obs = runs.observation(now, done, cur, any_up, rro, preemptions, down)
        req = policy.decide(job, obs).capacity
        if req is not cur:
            if req is SPOT:
                pool = choose_pool(up, [prices[i][t] if t < n else 1e9 for i in range(k)], cooling)
                assert pool is not None  # the policy asks for spot only when a pool is up
                launches[pools[pool].name] += 1
            if req is not NONE:
                rro = job.changeover_s
            if req is not SPOT:
                pool = None
        cur = req
        t += 1
