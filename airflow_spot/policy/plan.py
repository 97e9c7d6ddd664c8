"""The plan: stochastic dynamic programming over slack, time left, capacity and spot's state.

State at a decision point: whole decision intervals left ``tau``, slack ``s`` (time left
minus work left, in units of a tenth of an interval, coarser for very large slack), the
capacity held with the changeover still to pay on it, whether spot is up, the context (were
the last spot run and the last outage short) and the bucket of the current run's age
(:mod:`.hazard`). The work left is ``tau * interval - s``, so the deadline and the work need
not be stored: one plan serves every job with the same interval, changeover and prices.
The tick rules are the simulator's (:mod:`airflow_spot.simulate.engine`): every interval is
billed in full at the price of the capacity that ran in it, a launch loses the changeover,
a spot instance that ran in an interval keeps that interval's progress and is reclaimed if
spot is down at its end, and a job whose slack would fall below zero misses its deadline
(charged ``miss_penalty`` times the all-on-demand cost).

A job whose returns to spot are make-before-break (``JobSpec.make_before_break``: the
operator's on a cluster, the replay's under ``observe="cluster"``) gets a plan with the states
of such a return: on-demand trains on while the spot launch pays its changeover, both billed,
no progress lost, and a reclaim while it launches leaves on-demand running. Priced as a
break-before-make return, a return needs two changeovers of slack (one lost on the way, one
kept for a fallback) where it needs one, so the plan stayed on on-demand too long: gangs on
the 4-node traces 5.68 -> 4.76 % from the optimum, one node 0.2-0.3 points more saved.

In each state the plan keeps two choices: the cheap one (spot when spot is up, nothing when
it is down; a running spot instance is kept) and on-demand. It stores one bit per state,
slack included: is the cheap choice optimal? (Not a slack threshold per state: near the
deadline the best choice is not monotone in the slack, and thresholds cost 2 %.) A decision
is then a table lookup.

Solving takes 0.1 to 6 seconds (numpy, imported only here and only when a plan is solved);
plans are cached per job shape and model, in memory and (zlib-compressed) on disk.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from airflow_spot.policy.hazard import HazardModel

UNITS_PER_TICK = 10
# slack levels at most; a job with more slack than 204.8 intervals gets coarser units
MAX_SLACK_UNITS = 2048


@dataclass(frozen=True)
class Plan:
    """A solved plan: one bit per state, set where the cheap choice is optimal."""

    tick_s: float
    unit_s: float
    rro: tuple[int, ...]  # changeover left (units) per running-capacity state, 0 first
    max_slack: int
    max_tau: int
    bits: bytes  # packed bools: cheap is best, shape (max_tau + 1, states, 2, buckets, slack)
    # (``buckets``: contexts x age buckets, context-major)
    row: int  # bytes per row of ``bits``
    states: int
    buckets: int
    values: tuple = ()  # expected cost-to-go (on-demand intervals), idle, spot up, fresh run, top slack
    overlap: bool = False  # returns are make-before-break: states of spot launching over on-demand

    def cheap(self, tau: int, state: int, up: bool, bucket: int, slack: int) -> bool:
        """Whether the cheap choice is optimal in this state."""
        tau = min(max(tau, 0), self.max_tau)
        slack = min(slack, self.max_slack)
        if slack < 0:
            return False
        i = (((tau * self.states + state) * 2 + int(up)) * self.buckets + bucket) * self.row
        return bool(self.bits[i + (slack >> 3)] & (0x80 >> (slack & 7)))

    def state(self, capacity: str, changeover_left_s: float, overlap: bool = False) -> int:
        """Index of a capacity state: 0 idle, then spot by changeover left, then on-demand,
        then (a plan of make-before-break returns) spot launching while on-demand trains on,
        by changeover left."""
        if capacity == "none":
            return 0
        left = int(round(changeover_left_s / self.unit_s))
        nr = len(self.rro)
        if overlap and self.overlap and capacity == "spot" and nr > 1:
            k = min(range(1, nr), key=lambda i: abs(self.rro[i] - left))
            return 2 * nr + k
        k = min(range(nr), key=lambda i: abs(self.rro[i] - left))
        return 1 + k if capacity == "spot" else 1 + nr + k


def shape(
    model: HazardModel,
    tick_s: float,
    changeover_s: float,
    spot_price: float,
    on_demand_price: float,
    max_slack_s: float,
    max_tau: int,
    miss_penalty: float = 10.0,
    overlap: bool = False,
) -> tuple:
    """The key of the plan for one job shape (what :func:`solve_shape` solves).

    The slack range and the intervals to plan for are rounded up to a step of a geometric
    grid (an eighth of an octave) and the price ratio to two decimals, so that a job whose
    measured throughput, guard or spot price drifts a little between looks reuses its plan
    instead of solving it again. Slack is kept in tenths of an interval, coarser (down to
    halves) when that would take more than :data:`MAX_SLACK_UNITS` levels.
    """
    g = UNITS_PER_TICK
    if max_slack_s / tick_s * g > MAX_SLACK_UNITS:
        g = max(2, int(MAX_SLACK_UNITS * tick_s // max_slack_s))
    unit = tick_s / g
    smax = max(g, grid_up(max(int(max_slack_s // unit), 1)))
    return (
        model,
        float(tick_s),
        int(round(changeover_s / unit)),
        round(spot_price / on_demand_price, 2),
        smax,
        grid_up(max(int(max_tau), 1)),
        float(miss_penalty),
        g,
        bool(overlap),
    )


def grid_up(n: float) -> int:
    """``n`` rounded up to the next step of a geometric grid of eight steps per octave."""
    return math.ceil(2 ** (math.ceil(8 * math.log2(n)) / 8))


def same_but_slack(have: tuple, want: tuple) -> bool:
    """Whether two plan shapes differ at most in their slack range."""
    return have[:4] == want[:4] and have[5:] == want[5:]


def serves(have: tuple, want: tuple) -> bool:
    """Whether the plan of shape ``have`` answers every look of shape ``want`` as that shape's
    own plan would: the same shape with at least its slack range (a plan's bit for a slack
    never depends on the larger slacks the table also holds)."""
    return same_but_slack(have, want) and have[4] >= want[4]


def solve(*args: Any, cache_dir: str | None = None, **kwargs: Any) -> Plan:
    """The plan for one job shape: :func:`solve_shape` of :func:`shape` (same arguments)."""
    return solve_shape(shape(*args, **kwargs), cache_dir=cache_dir)


def solve_shape(key: tuple, room: float = 1.0, cache_dir: str | None = None) -> Plan:
    """The plan of shape ``key``: from memory, from the folder ``cache_dir`` when given (the
    caller's: a deferred task resumes in a new process, and plans outlive it), or solved
    (with ``room`` times the slack range, for a slack that will grow).

    A cached file is named by the shape less its slack range and is used when its range
    covers the job's (:func:`serves`); otherwise the plan is solved and the file replaced.
    """
    if room != 1.0:
        key, need = (*key[:4], grid_up(key[4] * room), *key[5:]), key[4]
    else:
        need = key[4]
    if cache_dir is None:
        return _solve(*key)
    return _stored(key, need, cache_dir)


@lru_cache(maxsize=8)
def _stored(key: tuple, need: int, cache_dir: str) -> Plan:
    """The plan of shape ``key`` read from (or solved and written to) ``cache_dir``; kept in
    memory too, so that asking again costs no read."""
    path = Path(cache_dir) / f"plan-{_digest(key)}.bin"
    try:
        plan = load(path)
        if plan.max_slack >= need and plan.max_tau == key[5]:
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: kept longest by prune()
            return plan
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: solve it again
    plan = _solve(*key)
    with contextlib.suppress(OSError):  # a read-only or full cache costs the next process a solve
        save(plan, path)
        prune(Path(cache_dir), keep=path)
    return plan


FORMAT = 2  # of the files in a cache folder (1: uncompressed bits, keyed with the slack range)


def _digest(key: tuple) -> str:
    import hashlib

    model, *rest = key
    del rest[3]  # the slack range: a file of the same shape with a wider range serves
    text = json.dumps([FORMAT, model.to_json(), *rest], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def save(plan: Plan, path: Path) -> None:
    """Write a plan as a JSON header line and its bits, zlib-compressed (no pickle: safe to
    load; a 51 MB table of a 60 h job on 60 s looks takes about 0.8 MB)."""
    head = {
        f: getattr(plan, f)
        for f in (
            "tick_s",
            "unit_s",
            "rro",
            "max_slack",
            "max_tau",
            "states",
            "buckets",
            "row",
            "values",
            "overlap",
        )
    }
    packed = zlib.compress(plan.bits, 6)
    head["bits"], head["format"] = len(packed), FORMAT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(json.dumps(head).encode() + b"\n" + packed)
    os.replace(tmp, path)


def load(path: Path) -> Plan:
    """Read a plan written by :func:`save`; ``ValueError`` when the file is not one."""
    with open(path, "rb") as fh:
        head = json.loads(fh.readline())
        if head.pop("format", None) != FORMAT:
            raise ValueError(f"{path}: not a plan of format {FORMAT}")
        try:
            bits = zlib.decompress(fh.read(head.pop("bits")))
        except zlib.error as e:
            raise ValueError(f"{path}: damaged plan ({e})") from e
    if len(bits) != (head["max_tau"] + 1) * head["states"] * 2 * head["buckets"] * head["row"]:
        raise ValueError(f"{path}: truncated plan")
    head["rro"], head["values"] = tuple(head["rro"]), tuple(head["values"])
    return Plan(bits=bits, **head)


def prune(cache: Path, keep: Path, max_bytes: int = 256 << 20, max_files: int = 64) -> None:
    """Delete the least recently used plan files beyond ``max_files`` or ``max_bytes``."""
    files = []
    for f in cache.glob("plan-*.bin"):
        with contextlib.suppress(OSError):
            st = f.stat()
            files.append((st.st_mtime, st.st_size, f))
    files.sort(reverse=True)
    total = 0
    for n, (_, size, f) in enumerate(files):
        total += size
        if f != keep and (n >= max_files or total > max_bytes):
            with contextlib.suppress(OSError):
                f.unlink()


@lru_cache(maxsize=8)
def _solve(
    model: HazardModel,
    tick_s: float,
    d: int,
    price_ratio: float,
    smax: int,
    tmax: int,
    miss_penalty: float,
    g: int = UNITS_PER_TICK,
    overlap: bool = False,
) -> Plan:
    import numpy as np

    unit = tick_s / g
    # changeover left in the states of a running capacity: d - k*g > 0, then 0
    rro = [0] + [d - k * g for k in range(1, math.ceil(d / g)) if d - k * g > 0]
    nr = len(rro)
    # make-before-break returns: a state per changeover left (> 0) of a spot launch over
    # on-demand, which trains on (and is billed) until spot is ready
    n_states = 1 + 2 * nr + (nr - 1 if overlap else 0)
    nb = len(model.edges)
    nbx = model.contexts * nb  # buckets of every context, context-major
    od_tick, spot_tick = 1.0, price_ratio  # cost of one interval, on-demand = 1
    pen = miss_penalty * (tmax + 1)
    # per (down/up, context-and-bucket): hazard, where the run's end leads (the first bucket of
    # the other kind, in the context updated with this run's length), chance of ageing a bucket
    h = np.zeros((2, nbx))
    flip_to = np.zeros((2, nbx), dtype=np.intp)
    adv = np.zeros(nbx)
    for k in range(model.contexts):
        for b in range(nb):
            x = k * nb + b
            h[0, x], h[1, x] = model.table(False, k)[b], model.table(True, k)[b]
            adv[x] = model.advance(b)
            short = (model.edges[b] + 1) * tick_s <= model.short_s + 1e-6
            flip_to[0, x] = model.after_run(k, False, short) * nb
            flip_to[1, x] = model.after_run(k, True, short) * nb

    def nxt_rro(r: int) -> int:
        return rro.index(max(r - g, 0))

    launch_loss, launch_to = min(d, g), nxt_rro(d)
    keep = [(min(r, g), nxt_rro(r)) for r in rro]

    size = smax + 1
    s_idx = np.arange(size)
    v = np.zeros((n_states, 2, nbx, size))  # tau = 0: the deadline; any stored slack >= 0 is done
    row = (size + 7) // 8
    bits = np.zeros((tmax + 1, n_states, 2, nbx, row), dtype=np.uint8)
    top = np.zeros(tmax + 1)

    def older(vc: np.ndarray) -> np.ndarray:
        """V(next) when the run goes on one interval (it may move to the next age bucket)."""
        stay = vc * (1 - adv)[None, :, None]
        stay[:, :-1] += vc[:, 1:] * adv[:-1][None, :, None]
        return stay

    def expect(vc: np.ndarray) -> np.ndarray:
        """E[V(next)] for a capacity that stays (vc: [2, nbx, size]) from each (a, b)."""
        flip = np.stack([vc[1][flip_to[0]], vc[0][flip_to[1]]])
        return h[:, :, None] * flip + (1 - h[:, :, None]) * older(vc)

    def expect_spot(vs: np.ndarray, v_gone: np.ndarray) -> np.ndarray:
        """From spot up in bucket b: reclaimed (``v_gone``, down, age 0: idle, or on-demand
        under a make-before-break return, which trains on) or on (``vs``, up)."""
        return h[1][:, None] * v_gone[0][flip_to[1]] + (1 - h[1][:, None]) * older(vs)[1]

    def shift(w: np.ndarray, loss: int) -> np.ndarray:
        out = np.full_like(w, pen)
        if loss < size:
            out[..., loss:] = w[..., : size - loss]
        return out

    for tau in range(1, tmax + 1):
        done_from = tau * g  # slack >= time left: no work left
        w_idle = expect(v[0])
        w_od = [expect(v[1 + nr + k]) for k in range(nr)]
        w_spot = [expect_spot(v[1 + k], v[0]) for k in range(nr)]
        # actions from each state: (cost, W shifted) for cheap and for on-demand
        od_launch = od_tick + shift(w_od[launch_to], launch_loss)
        spot_launch = spot_tick + shift(w_spot[launch_to], launch_loss)[None]
        wait = shift(w_idle, g)
        if overlap:  # w_ret[k]: a return launching with rro[k] left after this interval
            w_ret = [expect_spot(v[1] if k == 0 else v[2 * nr + k], v[1 + nr]) for k in range(nr)]
            back = (spot_tick + od_tick * launch_loss / g + w_ret[launch_to])[None]
            cancel = od_tick + w_od[0]  # the return called off: on-demand trains on
        new = np.empty_like(v)
        for state in range(n_states):
            if state == 0:
                q_od = od_launch
                cheap = np.concatenate([wait[:1], spot_launch], axis=0)
            elif state <= nr:  # spot running (only ever with spot up)
                loss, to = keep[state - 1]
                q_od = od_launch
                run = spot_tick + shift(w_spot[to], loss)[None]
                cheap = np.concatenate([wait[:1], run], axis=0)
            elif state <= 2 * nr:  # on-demand
                loss, to = keep[state - 1 - nr]
                q_od = od_tick + shift(w_od[to], loss)
                cheap = np.concatenate([wait[:1], back if overlap else spot_launch], axis=0)
            else:  # a return launching over on-demand (only ever with spot up)
                loss, to = keep[state - 2 * nr]
                q_od = cancel
                go_on = (spot_tick + od_tick * loss / g + w_ret[to])[None]
                cheap = np.concatenate([cancel[:1], go_on], axis=0)
            better = cheap < q_od - 1e-12
            better[..., done_from:] = True  # no work left: nothing to buy
            new[state] = np.where(better, cheap, q_od)
            bits[tau, state] = np.packbits(better, axis=-1)
        new[..., s_idx >= done_from] = 0.0
        v = new
        top[tau] = float(v[0, 1, 0, min(smax, done_from - 1)]) if done_from > 0 else 0.0
    return Plan(
        tick_s=tick_s,
        unit_s=unit,
        rro=tuple(rro),
        max_slack=smax,
        max_tau=tmax,
        bits=bits.tobytes(),
        row=row,
        states=n_states,
        buckets=nbx,
        values=tuple(top.tolist()),
        overlap=overlap,
    )
