"""Fast-forward arithmetic: where a replay's state is steady, jump over the looks a policy is
certain of, billing and crediting the ticks skipped exactly as the per-tick loop would (see
:mod:`.engine`'s notes).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from airflow_spot.policy import Capacity
from airflow_spot.policy.base import EPS
from airflow_spot.simulate.segments import SegmentBuilder
from airflow_spot.simulate.spot_runs import SpotRuns
from airflow_spot.simulate.ticks import Step
from airflow_spot.simulate.traces import Trace

NONE, OD = Capacity.NONE, Capacity.ON_DEMAND
_EXACT = float(1 << 52)  # whole numbers of seconds below this add up exactly


def plan(trace: Trace, work: float, deadline: float, gap: float) -> tuple[list[int], int, bool]:
    """What a fast-forwarding replay reads at its looks: the ticks where spot's state changes
    (:func:`flips`, then one never reached), the last tick before the deadline
    (:func:`last_tick`), and whether its sums may be made in one step (:func:`whole_job`)."""
    changes, tlast = flips(trace), last_tick(deadline, gap)
    changes.append(1 << 62)
    return changes, tlast, whole_job(work, gap, tlast)


def flips(trace: Trace) -> list[int]:
    """The ticks at which spot's state differs from the tick before (after the trace, spot
    is down)."""
    a = np.asarray(trace.available, dtype=bool)
    ext = np.concatenate([a, [False]])
    return (np.flatnonzero(ext[1:] != ext[:-1]) + 1).tolist()


def downs_before(avail: np.ndarray) -> list[int]:
    """``downs[i]``: how many of the first ``i`` ticks have spot down."""
    return [0, *np.cumsum(~np.asarray(avail, dtype=bool)).tolist()]


def down_ticks(downs: list[int], t: int, u: int) -> int:
    """How many of the ticks ``t .. u-1`` have spot down (after the trace, all)."""
    n = len(downs) - 1

    def before(x: int) -> int:
        return downs[x] if x <= n else downs[n] + x - n

    return before(u) - before(t)


def add_ticks(total: float, gap: float, count: int) -> float:
    """``total`` with ``gap`` added ``count`` times, as the per-tick loop adds it."""
    if gap.is_integer() and total.is_integer() and total + (count + 1) * gap < _EXACT:
        return total + count * gap  # whole seconds: every partial sum is exact
    for _ in range(count):
        total += gap
    return total


def last_tick(deadline: float, gap: float) -> int:
    """The last tick ``t`` with ``t * gap < deadline`` (the replay's own test)."""
    t = max(int(deadline // gap), 0)
    while t > 0 and t * gap >= deadline:
        t -= 1
    while (t + 1) * gap < deadline:
        t += 1
    return t


def advance(
    seg: SegmentBuilder,
    cur: Capacity,
    t: int,
    m: int,
    gap: float,
    work: float,
    done: float,
    work_on: list[float],
    down: float,
    spot_down: bool,
    price: float,
    rro: float,
    steps: dict[float, Step],
    whole: bool,
) -> tuple[int, float, float, float]:
    """Bill and credit the steady ticks ``t+1 .. t+m`` (fewer where the work would end) as
    the per-tick loop does: ``(m, done, down, changeover left)``, the work done on ``cur``
    added to ``work_on[cur is OD]``. ``rro``: the
    changeover still to pay on ``cur``, tick by tick first (``steps``: as
    :func:`~.ticks.changeover_steps` tabulates them). The sums are those of the loop,
    one tick at a time, or, where ``whole`` (:func:`whole_job`) and the running figures are
    whole seconds, so that every partial sum is exact, in one step."""
    if cur is NONE:
        seg.tick(NONE, (t + 1) * gap - gap, 0.0, gap, done, done, 0.0)
        if m > 1:
            seg.end, seg.p1 = (t + m) * gap - gap + gap, done
        if spot_down:
            down = add_ticks(down, gap, m)
        return m, done, down, rro
    won = work_on[cur is OD]
    j = 0  # ticks taken
    while rro > 0.0 and j < m:  # the changeover's ticks, one by one, as the loop takes them
        w, launching, left = steps[rro]
        nd = done + w
        if work - nd <= EPS:  # that tick ends the work: the loop takes it
            m = j
            break
        rro = left
        j += 1
        seg.tick(cur, (t + j) * gap - gap, launching, gap, nd - w, nd, price)
        done = nd
        won += w
    r = m - j  # whole ticks of progress after it
    if r > 0:
        first = done + gap
        if whole and done.is_integer() and won.is_integer():
            # work - (done + i gap) > EPS  <=>  i gap <= work - done - 1
            r = min(r, int((work - done - 1.0) // gap))
            if r > 0:
                done += r * gap
                won += r * gap
        else:
            for i in range(r):
                nd = done + gap
                if work - nd <= EPS:  # that tick ends the work: the loop takes it
                    r = i
                    break
                done = nd
                won += gap
        if r > 0:
            seg.tick(cur, (t + j + 1) * gap - gap, 0.0, gap, first - gap, first, price)
            if r > 1:
                seg.end, seg.p1 = (t + j + r) * gap - gap + gap, done
        m = j + max(r, 0)
    if spot_down:
        down = add_ticks(down, gap, m)
    work_on[cur is OD] = won
    return m, done, down, rro


def jumped(
    runs: SpotRuns,
    changes: list[int],
    fi: int,
    downs: list[int] | None,
    trace: Trace,
    t: int,
    m: int,
    gap: float,
    down: float,
) -> tuple[int, list[int], float]:
    """What the looks a jump skips (ticks ``t+1 .. t+m``, spot changing as it will) would have
    seen of spot: its changes, told to ``runs`` in order, and the ticks it was down, added to
    ``down``: ``(the index in changes of the first change after, downs, down)``, ``downs``
    (:func:`downs_before`) made at the first jump."""
    if downs is None:
        downs = downs_before(trace.available)
    down = add_ticks(down, gap, down_ticks(downs, t, t + m))
    after = bisect_right(changes, t + m, fi)
    runs.see_changes([c * gap for c in changes[fi:after]])
    return after, downs, down


def whole_job(work: float, gap: float, tlast: int) -> bool:
    """Work and ticks in whole seconds, small enough that every sum a replay makes of them
    (work done, time down: never more than the work or the ticks) is exact."""
    return gap.is_integer() and work.is_integer() and work + 2 * (tlast + 2) * gap < _EXACT
