"""The omniscient optimum: the cheapest schedule that knows the whole trace in advance.

Exact dynamic programming over the replay's own tick model (:mod:`.engine`), for many
windows at once. At each tick boundary the state is the capacity that ran in the last
interval with the number of intervals its launch has run (capped once the changeover is
paid), and the progress made. Progress is counted in integer units ``gcd(tick, changeover,
work)`` so that it is exact; only the band of progress from which the deadline is still
reachable is kept. Every schedule it considers is one the replay could run: a launch pays
the changeover at the new capacity's price, spot runs only in intervals where it is up, and
the job is done at the first boundary where all the work is.

A gang (:mod:`.gang`) on its polarized trace: every node billed (``job.nodes`` times a
node's prices), and, given ``acquire`` (whole ticks an on-demand launch at each tick waits
for its nodes, billed), states for an on-demand launch still acquiring; a launch of
on-demand then comes from idle or spot only (the replay cannot relaunch what it holds). A
partial gang never forms: the optimum never waits on a request.
"""

from __future__ import annotations

import math

import numpy as np

from airflow_spot.policy import JobSpec

INF = np.float64(1e18)


MAX_BYTES = 4 * 2**30


def omniscient_costs(
    available: np.ndarray,
    job: JobSpec,
    spot_prices: np.ndarray | None = None,
    acquire: np.ndarray | None = None,
) -> np.ndarray:
    """Minimum cost per window. ``available``: (windows, ticks) bool, True = spot up.

    ``spot_prices`` (same shape, per hour) overrides ``job.spot_price`` tick by tick.
    Ticks past the end of a window count as spot down. ``acquire`` (same shape, whole ticks):
    how long an on-demand launch at each tick waits for its nodes (none past the end).
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
    if job.nodes != 1:  # every node of the gang billed
        od_tick, spot_tick = od_tick * job.nodes, spot_tick * job.nodes
    acq = None
    if acquire is not None:
        acq = np.zeros((n_win, t_max + 1), dtype=np.int64)
        a = np.asarray(acquire, dtype=np.int64).reshape(n_win, -1)[:, : t_max + 1]
        acq[:, : a.shape[1]] = a

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
    n_acq = 0 if acq is None else int(acq.max())
    # 0 idle; 1..J spot after j intervals; J+1..2J on-demand; then on-demand acquiring, with
    # 0..n_acq-1 intervals of acquisition still to come
    n_states = 1 + 2 * j_cap + n_acq
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
        if acq is None:
            nxt[:, j_cap + 1] = launch + od_tick
        else:
            _acquiring(value, nxt, acq[:, t], j_cap, n_acq, od_tick, fresh_units(0), lo, lo1, hi1)
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


def _acquiring(
    value: np.ndarray,
    nxt: np.ndarray,
    a_t: np.ndarray,
    j_cap: int,
    n_acq: int,
    od_tick: float,
    w0: int,
    lo: int,
    lo1: int,
    hi1: int,
) -> None:
    """On-demand launches for a gang whose nodes take ``a_t`` ticks to come (per window): from
    idle or spot only, into the first on-demand state (none to wait) or the acquiring state
    with ``a_t - 1`` intervals still to come; an acquisition runs down to the launch's first
    interval of changeover."""
    base = 1 + 2 * j_cap
    src = value[:, : j_cap + 1].min(axis=1)  # idle or spot: not relaunching on-demand
    start = _shift(src, w0, lo, lo1, hi1) + od_tick
    wait = _shift(src, 0, lo, lo1, hi1) + od_tick
    now = a_t == 0
    nxt[:, j_cap + 1] = np.where(now[:, None], start, INF)
    if n_acq:
        ended = _shift(value[:, base], w0, lo, lo1, hi1) + od_tick  # acquired: changeover
        nxt[:, j_cap + 1] = np.minimum(nxt[:, j_cap + 1], ended)
        for m in range(n_acq):  # m intervals still to come after this one
            cont = (
                _shift(value[:, base + m + 1], 0, lo, lo1, hi1) + od_tick
                if m + 1 < n_acq
                else np.full_like(wait, INF)
            )
            nxt[:, base + m] = np.minimum(np.where((a_t - 1 == m)[:, None], wait, INF), cont)


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
