"""The omniscient optimum: the cheapest schedule that knows the whole trace in advance.

Exact dynamic programming over the replay's own tick model (:mod:`.engine`), for many
windows at once. At each tick boundary the state is the capacity that ran in the last
interval with the number of intervals its launch has run (capped once the changeover is
paid), and the progress made. Progress is counted in integer units ``gcd(tick, changeover,
work)`` so that it is exact; only the band of progress from which the deadline is still
reachable is kept. Every schedule it considers is one the replay could run: a launch pays
the changeover at the new capacity's price, spot runs only in intervals where it is up, and
the job is done at the first boundary where all the work is.
"""

from __future__ import annotations

import math

import numpy as np

from airflow_spot.policy import JobSpec

INF = np.float64(1e18)


MAX_BYTES = 4 * 2**30


def omniscient_costs(
    available: np.ndarray, job: JobSpec, spot_prices: np.ndarray | None = None
) -> np.ndarray:
    """Minimum cost per window. ``available``: (windows, ticks) bool, True = spot up.

    ``spot_prices`` (same shape, per hour) overrides ``job.spot_price`` tick by tick.
    Ticks past the end of a window count as spot down.
    """
    avail = np.asarray(available, dtype=bool)
    if avail.ndim == 1:
        avail = avail[None, :]
    n_win, n_ticks = avail.shape
    gap = int(round(job.tick_s))
    d = int(round(job.changeover_s))
    work = int(round(job.work_s))
    if abs(gap - job.tick_s) + abs(d - job.changeover_s) + abs(work - job.work_s) > 1e-6:
        raise ValueError("omniscient needs whole seconds of tick, changeover and work")
    unit = math.gcd(math.gcd(gap, d), work)
    p_total, g = work // unit, gap // unit
    j_cap = max(1, -(-d // gap))
    t_max = math.ceil(job.deadline_s / gap)
    od_tick = job.on_demand_price * gap / 3600.0
    if spot_prices is None:
        spot_tick = np.full((n_win, max(n_ticks, t_max)), job.spot_price * gap / 3600.0)
    else:
        sp = np.asarray(spot_prices, dtype=float).reshape(n_win, -1)
        spot_tick = (
            np.pad(sp, ((0, 0), (0, max(0, t_max - sp.shape[1]))), mode="edge") * gap / 3600.0
        )

    def fresh_units(j: int) -> int:  # progress in the (j+1)-th interval of a launch
        return (max((j + 1) * gap - d, 0) - max(j * gap - d, 0)) // unit

    def band(t: int) -> tuple[int, int]:
        return max(0, p_total - (t_max - t) * g), min(p_total, t * g)

    width = max(hi - lo + 1 for lo, hi in map(band, range(t_max + 1)))
    need = 3 * n_win * (1 + 2 * j_cap) * width * 8  # value, next and a temporary
    if need > MAX_BYTES:
        raise ValueError(
            f"omniscient would need {need / 2**30:.1f} GiB for {n_win} windows: the tick "
            f"({gap} s), changeover ({d} s) and work ({work} s) share only a {unit} s unit; "
            "round the changeover and work to whole minutes"
        )
    n_states = 1 + 2 * j_cap  # 0 idle; 1..J spot after j intervals; J+1..2J on-demand
    lo, hi = band(0)
    value = np.full((n_win, n_states, hi - lo + 1), INF)
    value[:, 0, 0] = 0.0
    best = np.full(n_win, INF)
    for t in range(t_max):
        lo1, hi1 = band(t + 1)
        up = (avail[:, t] if t < n_ticks else np.zeros(n_win, bool))[:, None]
        sp_cost = spot_tick[:, t][:, None]
        any_state = value.min(axis=1)
        nxt = np.full((n_win, n_states, hi1 - lo1 + 1), INF)
        nxt[:, 0] = _shift(any_state, 0, lo, lo1, hi1)
        launch = _shift(any_state, fresh_units(0), lo, lo1, hi1)
        nxt[:, j_cap + 1] = launch + od_tick
        nxt[:, 1] = np.where(up, launch + sp_cost, INF)
        for j in range(1, j_cap + 1):
            k = min(j + 1, j_cap)
            w = fresh_units(j)
            nxt[:, j_cap + k] = np.minimum(
                nxt[:, j_cap + k], _shift(value[:, j_cap + j], w, lo, lo1, hi1) + od_tick
            )
            run_spot = np.where(up, _shift(value[:, j], w, lo, lo1, hi1) + sp_cost, INF)
            nxt[:, k] = np.minimum(nxt[:, k], run_spot)
        if hi1 == p_total:  # done: record and stop paying
            col = nxt[:, :, p_total - lo1]
            best = np.minimum(best, col.min(axis=1))
            col[:] = INF
        value, lo, hi = np.minimum(nxt, INF), lo1, hi1
    return best


def _shift(src: np.ndarray, w: int, lo: int, lo1: int, hi1: int) -> np.ndarray:
    """``src`` over progress ``[lo, lo+len)`` moved up by ``w`` onto ``[lo1, hi1]``, capped at ``hi1``."""
    out = np.full(src.shape[:-1] + (hi1 - lo1 + 1,), INF)
    hi = lo + src.shape[-1] - 1
    a, b = max(lo1, lo + w), min(hi1, hi + w)
    if a <= b:
        out[..., a - lo1 : b - lo1 + 1] = src[..., a - w - lo : b - w - lo + 1]
    # progress beyond the band's top (only possible at the top: the work is done) is capped
    if hi + w > hi1 and hi1 >= lo1:
        first = max(hi1 - w + 1, lo)
        if first <= hi:
            out[..., hi1 - lo1] = np.minimum(
                out[..., hi1 - lo1], src[..., first - lo :].min(axis=-1)
            )
    return out
