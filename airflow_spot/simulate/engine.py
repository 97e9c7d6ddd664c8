"""Replay a policy over a trace, tick by tick, with the rules of *Can't Be Late*'s simulator.

At every tick boundary ``t`` (``now = t * gap``):

1. The interval ``[t-1, t)`` is billed in full at the price of the capacity that ran in it
   (idle is free). Its progress is ``gap`` minus what was left of the launch's changeover.
2. If spot ran in it and spot is down at ``t``, the instance is reclaimed (preemption at the
   tick boundary: the interval's progress counts).
3. The job ends when the work is done (deadline met) or when ``now`` reaches the deadline.
4. The policy decides for ``[t, t+1)``. Any launch (a capacity other than the one held,
   and not idle), the first one included, starts a changeover of ``changeover_s`` that
   delays progress and is billed at the new capacity's price.

The policy called here is the same :class:`~airflow_spot.policy.Policy` the operator calls.

Two observation models (``observe``):

* ``oracle``: the paper's. Every look sees spot's true state, and a return to spot is
  break-before-make (on-demand stops when the spot launch starts). The cross-check against
  the paper's published results runs with it.
* ``cluster`` (the default): what a cluster shows. The policy sees spot's state only while
  the job holds spot, while its spot request waits (a pending spot pod), or through a probe it
  asked for (:attr:`~airflow_spot.policy.Decision.look`); otherwise ``spot_available`` is
  ``None`` and the observation says what was seen last and how long ago.

  - A request or probe asked at ``t`` waits, unbilled, while spot is down and shows spot's
    state at ``t + 1``; asking for spot when its state is unknown is a request that is
    granted at ``t`` if spot is up then.
  - Capacity found by a request or probe that the job does not use at that look is billed
    ``probe_hold_s`` (default: one changeover) at the spot price: the node it brought up,
    until it is given back (ledger phase ``probe``).
  - A return from on-demand to spot is make-before-break: on-demand trains on while the spot
    launch pays its changeover, both billed for that overlap (on-demand by the second, until
    spot is ready), and no progress is lost. If spot is reclaimed before it is ready,
    on-demand was never stopped.

Fast-forward (``fast``, on by default; the module's :data:`FAST` sets the default): where the
state is steady (the capacity held is kept, with less than a tick of changeover left, and
spot's state as seen does not change), a policy that offers
:meth:`~airflow_spot.policy.Policy.steady` says for how many looks its decision is certain to
stay the same (asked at a launch of spot from idle too); the replay then jumps to the next
change of spot's state, that many looks, the end of the work or the deadline, whichever comes
first, billing and crediting the ticks it skips one by one in the same order (the result,
ledger and all, is the same as with every look taken). On on-demand, a policy whose
:meth:`~airflow_spot.policy.Policy.blind` says its decision reads nothing of spot lets an
oracle replay jump over spot's changes too.

``keep_ledger=False`` (what a sweep asks): the figures are summed segment by segment as they
close, in the order a ledger would hold them, and no ledger is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from airflow_spot.exceptions import ConfigError, finite_number
from airflow_spot.ledger import Ledger, Phase, Segment
from airflow_spot.policy import Capacity, Decision, JobSpec, Observation, Policy
from airflow_spot.policy.base import EPS
from airflow_spot.policy.model import HOUR
from airflow_spot.simulate.traces import Trace

NONE, SPOT, OD = Capacity.NONE, Capacity.SPOT, Capacity.ON_DEMAND
RUNNING, LAUNCHING, IDLE = Phase.RUNNING, Phase.LAUNCHING, Phase.IDLE


OBSERVE = ("cluster", "oracle", "cluster-bbm")  # the last: an ablation (benchmarks only)
_EXACT = float(1 << 52)  # whole numbers of seconds below this add up exactly
FAST = True  # fast-forward steady stretches (see the module's notes); replay(fast=...) overrides


def check_replay_options(observe: str, probe_hold_s: float | None) -> None:
    """The replay's options, each named with its fix (checked before any replay runs)."""
    if observe not in OBSERVE:
        raise ConfigError(
            "observe",
            f"{observe!r} is not an observation model; choose one of {', '.join(OBSERVE)} "
            "('cluster': spot seen as a cluster shows it; 'oracle': the paper's replay)",
        )
    if probe_hold_s is not None and not (finite_number(probe_hold_s) and probe_hold_s > 0):
        raise ConfigError(
            "probe_hold_s",
            f"must be a number of seconds > 0 (how long a node a probe found and the job did "
            f"not use is billed before it is given back), got {probe_hold_s!r}; leave it out "
            "(None) to bill one changeover",
        )


def _observation_maker() -> Callable[..., Observation]:
    """``Observation(*all fields)``, built without a frozen dataclass's ``object.__setattr__``
    per field (the replay builds one per look); the plain class where its fields are not the
    14 expected."""
    names = tuple(f.name for f in fields(Observation))
    if names != _OBS_FIELDS or hasattr(Observation, "__post_init__"):
        return Observation
    new = object.__new__
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13 = (
        getattr(Observation, n).__set__ for n in names
    )

    def make(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13):  # type: ignore[no-untyped-def]
        o = new(Observation)
        s0(o, a0), s1(o, a1), s2(o, a2), s3(o, a3), s4(o, a4), s5(o, a5), s6(o, a6)
        s7(o, a7), s8(o, a8), s9(o, a9), s10(o, a10), s11(o, a11), s12(o, a12), s13(o, a13)
        return o

    return make


_OBS_FIELDS = (
    "now",
    "done_s",
    "capacity",
    "spot_available",
    "changeover_left_s",
    "preemptions",
    "spot_age_s",
    "spot_down_s",
    "last_up_s",
    "last_down_s",
    "spot_unseen_s",
    "spot_seen",
    "spot_source",
    "overlap",
)
_observation = _observation_maker()


class SpotRuns:
    """What a replay has seen of spot's runs: the current one's state and start, and the
    length of the last spot run and outage seen whole (never the run the job starts in).

    Seen through gaps (``observe="cluster"``), a run's start is when it was first seen and a
    run's length what was seen of it: from its first sighting to its last."""

    __slots__ = ("up", "since", "last", "seen_at", "source")

    def __init__(self) -> None:
        self.up: bool | None = None
        self.since = 0.0
        self.last: dict[bool, float | None] = {True: None, False: None}
        self.seen_at = 0.0
        self.source = ""

    def see(self, now: float, up: bool, watched: bool = True) -> None:
        """Spot is ``up`` (or not) at ``now``; ``watched``: it was seen at the previous look
        too (a change then happened since; else only the part seen counts)."""
        if up != self.up:
            if self.up is not None and self.since > 0:
                self.last[self.up] = (now if watched else self.seen_at) - self.since
            self.up, self.since = up, now
        self.seen_at = now

    def observation(
        self,
        now: float,
        done: float,
        cur: Capacity,
        up: bool,
        rro: float,
        preemptions: int,
        down: float,
        overlap: bool = False,
    ) -> Observation:
        """The observation while spot's state is seen now (``up``)."""
        return _observation(
            now,
            done,
            cur,
            up,
            rro,
            preemptions,
            now - self.since,
            down,
            self.last[True],
            self.last[False],
            0.0,
            up,
            self.source,
            overlap,
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """One policy on one trace for one job."""

    trace: str
    policy: str
    deadline_h: float
    changeover_h: float
    cost: float
    met: bool
    spot_hours: float  # billed hours on spot (changeover included)
    on_demand_hours: float
    spot_work_hours: float  # progress made on spot
    on_demand_work_hours: float
    preemptions: int
    finished_h: float
    on_demand_cost: float
    ledger: Ledger | None = None
    observe: str = "oracle"
    probes: int = 0  # probes asked (spot requests are not counted)
    probe_cost: float = 0.0  # capacity found by a request or probe and not used
    overlap_hours: float = 0.0  # on-demand training on while a spot return launched

    @property
    def normalized_cost(self) -> float:
        return self.cost / self.on_demand_cost

    def row(self) -> dict:
        return {
            "trace": self.trace,
            "policy": self.policy,
            "deadline_h": self.deadline_h,
            "changeover_h": self.changeover_h,
            "cost": round(self.cost, 6),
            "normalized_cost": round(self.normalized_cost, 6),
            "met": self.met,
            "spot_hours": round(self.spot_hours, 6),
            "on_demand_hours": round(self.on_demand_hours, 6),
            "spot_work_hours": round(self.spot_work_hours, 6),
            "on_demand_work_hours": round(self.on_demand_work_hours, 6),
            "preemptions": self.preemptions,
            "finished_h": round(self.finished_h, 6),
            "observe": self.observe,
            "probes": self.probes,
            "probe_cost": round(self.probe_cost, 6),
            "overlap_hours": round(self.overlap_hours, 6),
        }


def replay(
    policy: Policy,
    trace: Trace,
    job: JobSpec,
    *,
    use_trace_prices: bool = False,
    observe: str = "cluster",
    probe_hold_s: float | None = None,
    fast: bool | None = None,
    keep_ledger: bool = True,
) -> RunResult:
    """Replay ``policy`` on ``trace`` for ``job``; ticks are the trace's ``gap_s``.

    ``observe``: ``"cluster"`` (what a cluster shows) or ``"oracle"`` (the paper's model); see
    the module's notes; ``"cluster-bbm"``: the cluster's view with break-before-make returns,
    an ablation). ``probe_hold_s``: how long capacity a probe found and the job did not
    use is billed (default: the job's changeover). ``fast``: fast-forward steady stretches
    where the policy offers a hint (default :data:`FAST`; off, every look is taken).
    ``keep_ledger=False``: the result's figures without its ledger (``ledger`` is ``None``;
    the figures are the same to the last bit), as a sweep, which reads only rows, asks."""
    check_replay_options(observe, probe_hold_s)
    steady = getattr(policy, "steady", None) if (FAST if fast is None else fast) else None
    blind = getattr(policy, "blind", None) if steady is not None else None
    if observe != "oracle":
        return _replay_cluster(
            policy,
            trace,
            job,
            use_trace_prices,
            probe_hold_s,
            steady,
            observe == "cluster",
            keep_ledger,
        )
    gap = trace.gap_s
    if abs(job.tick_s - gap) > 1e-9:
        raise ValueError(f"job.tick_s={job.tick_s} must equal the trace's tick {gap}")
    avail = trace.available.tolist()
    n = len(avail)
    spot_prices = trace.prices.tolist() if (use_trace_prices and trace.prices is not None) else None
    work, deadline, d = job.work_s, job.deadline_s, job.changeover_s
    ledger, totals, emit = _sink(job, keep_ledger)
    seg = _SegmentBuilder(emit, totals=totals)
    cur, rro, done, preemptions = NONE, 0.0, 0.0, 0
    work_on = [0.0, 0.0]  # work done on spot, on on-demand: work_on[cap is OD]
    down = 0.0
    # what SpotRuns.see keeps, every look watched (inlined: the replay's hottest lines)
    up: bool | None = None
    since = 0.0
    last_run: dict[bool, float | None] = {True: None, False: None}
    if steady is not None:
        flips, tlast = _flips(trace), _last_tick(deadline, gap)
        whole = _whole_job(work, gap, tlast)
        flips.append(1 << 62)
        fi = 0  # flips[fi]: the first change of spot's state after t (t only grows)
        downs: list[int] | None = None  # downs[i]: ticks of avail[:i] with spot down
    t = 0
    met = False
    while True:
        now = t * gap
        has = avail[t] if t < n else False
        if has != up:
            if up is not None and since > 0:
                last_run[up] = now - since
            up, since = has, now
        if t > 0 and (t > n or not avail[t - 1]):
            down += gap
        last = cur
        if last is not NONE:
            w = gap - rro if gap > rro else 0.0
            launching = gap - w
            rro = rro - launching
            if rro < EPS:
                rro = 0.0
            if w > work - done:
                w = work - done
            done += w
            work_on[last is OD] += w
            price = (
                job.on_demand_price
                if last is OD
                else (spot_prices[t - 1] if spot_prices else job.spot_price)
            )
            seg.tick(last, now - gap, launching, gap, done - w, done, price)
            if last is SPOT and not has:
                cur = NONE
                preemptions += 1
                seg.close("preempted")
        elif t > 0:
            seg.tick(NONE, now - gap, 0.0, gap, done, done, 0.0)
        if work - done <= EPS:
            met = True
            seg.close("completed")
            break
        if now >= deadline:
            seg.close("deadline")
            break
        obs = _observation(
            now,
            done,
            cur,
            has,
            rro,
            preemptions,
            now - since,
            down,
            last_run[True],
            last_run[False],
            0.0,
            has,
            "market",
            False,
        )
        decision = policy.decide(job, obs)
        req = decision.capacity
        k = 0  # looks the policy is certain of (its steady hint), where it is asked
        jump = False  # over changes of spot's state too (the policy's blind hint)
        if req is not cur:
            if req is not NONE:
                rro = d
            if cur is not NONE:
                seg.close("switched")
            elif req is SPOT and steady is not None and not spot_prices:  # a launch from idle
                while flips[fi] <= t:
                    fi += 1
                m = min(tlast - t, flips[fi] - 1 - t)
                if m > 0:
                    k = steady(job, obs, decision)
        elif steady is not None and rro < gap and not (spot_prices and cur is SPOT):
            while flips[fi] <= t:
                fi += 1
            m = min(tlast - t, flips[fi] - 1 - t)
            on_demand = cur is OD and blind is not None
            if m > 0 or (on_demand and tlast > t):
                k = steady(job, obs, decision)
                if k > m and on_demand and blind(job, obs, decision):  # type: ignore[misc]
                    m, jump = tlast - t, True
        if k > 0:
            # the ticks t+1 .. t+m: spot as at t (or, jumping, whatever it does: on-demand
            # runs on), the same decision at each look
            m = min(k, m)
            m, done, won, down, rro = _advance(
                seg,
                req,
                t,
                m,
                gap,
                work,
                done,
                work_on[req is OD] if req is not NONE else 0.0,
                down,
                not has and not jump,
                job.on_demand_price if req is OD else job.spot_price,
                rro,
                whole,
            )
            if req is not NONE:
                work_on[req is OD] = won
            if jump and m > 0:  # what the looks skipped would have seen of spot
                if downs is None:
                    downs = _downs(trace.available)
                down = _add_ticks(down, gap, _down_ticks(downs, t, t + m))
                while flips[fi] <= t + m:
                    f = flips[fi] * gap
                    if since > 0:
                        last_run[up] = f - since  # type: ignore[index]
                    up, since = not up, f
                    fi += 1
            t += m
        cur = req
        t += 1
    _finish(ledger, totals, t * gap if met else None, 0)
    return _result(
        trace, policy, job, ledger, totals, met, t * gap, work_on, preemptions, "oracle", 0.0
    )


def _replay_cluster(
    policy: Policy,
    trace: Trace,
    job: JobSpec,
    use_trace_prices: bool,
    probe_hold_s: float | None,
    steady: Callable[[JobSpec, Observation, Decision], int] | None = None,
    make_before_break: bool = True,
    keep_ledger: bool = True,
) -> RunResult:
    """:func:`replay` under ``observe="cluster"`` (the rules are in the module's notes);
    ``make_before_break=False`` (``observe="cluster-bbm"``, an ablation for the benchmarks):
    the same view of spot, but a return stops on-demand when the spot launch starts."""
    gap = trace.gap_s
    if abs(job.tick_s - gap) > 1e-9:
        raise ValueError(f"job.tick_s={job.tick_s} must equal the trace's tick {gap}")
    avail = trace.available.tolist()
    n = len(avail)
    spot_prices = trace.prices.tolist() if (use_trace_prices and trace.prices is not None) else None
    work, deadline, d = job.work_s, job.deadline_s, job.changeover_s
    hold = d if probe_hold_s is None else probe_hold_s
    od_price = job.on_demand_price
    ledger, totals, emit = _sink(job, keep_ledger)
    seg = _SegmentBuilder(emit, totals=totals)
    ovl = _SegmentBuilder(emit, overlap=True, totals=totals)
    cur, rro, done, preemptions = NONE, 0.0, 0.0, 0
    overlap = False  # on-demand trains on while the spot launch (cur) pays its changeover
    looking = ""  # what waits since the last look: "", "request" or "probe"
    probes, overlap_s = 0, 0.0
    work_on = [0.0, 0.0]  # work done on spot, on on-demand: work_on[cap is OD]
    runs, down = SpotRuns(), 0.0
    watched = was_down = False
    if steady is not None:
        flips, tlast = _flips(trace), _last_tick(deadline, gap)
        whole = _whole_job(work, gap, tlast)
        flips.append(1 << 62)
        fi = 0  # flips[fi]: the first change of spot's state after t (t only grows)
    t = 0
    met = False
    while True:
        now = t * gap
        has = avail[t] if t < n else False
        seen = cur is SPOT or bool(looking)
        if seen:  # runs.see(now, has, watched), inlined
            runs.source = "attempt" if cur is SPOT else looking
            if has != runs.up:
                if runs.up is not None and runs.since > 0:
                    runs.last[runs.up] = (now if watched else runs.seen_at) - runs.since
                runs.up, runs.since = has, now
            runs.seen_at = now
        if was_down:
            down += gap
        last = cur
        if last is not NONE:
            w = gap - rro if gap > rro else 0.0
            launching = gap - w
            rro = rro - launching
            if rro < EPS:
                rro = 0.0
            if overlap:  # on-demand trained while spot launched
                wo = launching if launching < work - done else work - done
                ovl.tick(OD, now - gap, 0.0, launching, done, done + wo, od_price)
                done += wo
                work_on[1] += wo
                overlap_s += launching
                if rro == 0.0:
                    overlap = False
                    ovl.close("handover")
            if w > work - done:
                w = work - done
            done += w
            work_on[last is OD] += w
            price = (
                od_price if last is OD else (spot_prices[t - 1] if spot_prices else job.spot_price)
            )
            seg.tick(last, now - gap, launching, gap, done - w, done, price)
            if last is SPOT and not has:
                preemptions += 1
                seg.close("preempted")
                cur = NONE
                if overlap:  # reclaimed before it was ready: on-demand was never stopped
                    overlap, cur, rro = False, OD, 0.0
                    ovl.close("spot_lost")
        elif t > 0:
            seg.tick(NONE, now - gap, 0.0, gap, done, done, 0.0)
        if work - done <= EPS:
            met = True
            seg.close("completed")
            ovl.close("completed")
            break
        if now >= deadline:
            seg.close("deadline")
            ovl.close("deadline")
            break
        # the observation, seen (as runs.observation(...) builds it) or unseen: spot's state
        # and age as last seen, and how long ago; inlined (the replay's hottest lines)
        if seen:
            obs = _observation(
                now,
                done,
                cur,
                has,
                rro,
                preemptions,
                now - runs.since,
                down,
                runs.last[True],
                runs.last[False],
                0.0,
                has,
                runs.source,
                overlap,
            )
        else:
            obs = _observation(
                now,
                done,
                cur,
                None,
                rro,
                preemptions,
                runs.seen_at - runs.since,
                down,
                runs.last[True],
                runs.last[False],
                now - runs.seen_at,
                runs.up,
                runs.source,
                overlap,
            )
        decision = policy.decide(job, obs)
        req = decision.capacity
        held = cur
        found = bool(looking) and has
        looked, looking = looking, ""
        if req is SPOT and cur is not SPOT:
            if has:  # granted now (a found request or probe becomes the launch)
                if cur is OD and d > 0 and make_before_break:
                    overlap = True
                seg.close("handover" if cur is OD else "switched")
                cur, rro = SPOT, d
            else:  # waits for capacity: on-demand, if held, trains on
                looking = "request"
        elif req is not SPOT:
            if found:
                price = spot_prices[min(t, n - 1)] if spot_prices else job.spot_price
                emit(SPOT, Phase.PROBE, now, now + hold, done, done, price)
            if req is not cur:
                if overlap and req is OD:  # the return is called off; on-demand goes on
                    seg.close("cancelled")
                    ovl.close("cancelled")
                    overlap, cur, rro = False, OD, 0.0
                else:
                    if overlap:
                        ovl.close("cancelled")
                        overlap = False
                    if req is not NONE:
                        rro = d
                    if cur is not NONE:
                        seg.close("switched")
                    cur = req
            if decision.look:
                looking = "probe" if cur is OD else "request"
                if looking == "probe" and (looked != "probe" or found):
                    probes += 1
        k = 0  # looks the policy is certain of (its steady hint), where it is asked
        launch = held is NONE and cur is SPOT  # spot granted at this look, launched from idle
        if (
            steady is not None
            and (req is held or launch)
            and not overlap
            and (rro < gap or launch)
            and (cur is SPOT or bool(looking)) == seen  # seen (or unseen) at the next look too
            and not (looking and has)  # a request or probe that would find spot at once
            and not (spot_prices and cur is SPOT)
        ):
            if seen:  # until spot's state changes
                while flips[fi] <= t:
                    fi += 1
                m = min(tlast - t, flips[fi] - 1 - t)
            else:
                m = tlast - t
            if m > 0:
                k = steady(job, obs, decision)
        if k > 0:
            # the ticks t+1 .. t+m: spot as at t where it is seen, the same decision at each
            m = min(k, m)
            if m > 0:
                m, done, won, down, rro = _advance(
                    seg,
                    cur,
                    t,
                    m,
                    gap,
                    work,
                    done,
                    work_on[cur is OD] if cur is not NONE else 0.0,
                    down,
                    seen and not has,
                    od_price if cur is OD else job.spot_price,
                    rro,
                    whole,
                )
                if cur is not NONE:
                    work_on[cur is OD] = won
                t += m
                if seen:
                    runs.source = "attempt" if cur is SPOT else looking
                    runs.seen_at = t * gap
        watched, was_down = seen, seen and not has
        t += 1
    _finish(ledger, totals, t * gap if met else None, probes)
    observe = "cluster" if make_before_break else "cluster-bbm"
    return _result(
        trace, policy, job, ledger, totals, met, t * gap, work_on, preemptions, observe, overlap_s
    )


def _sink(job: JobSpec, keep_ledger: bool) -> tuple[Ledger | None, _Totals | None, Callable]:
    """Where a replay's segments go: ``(ledger, None, its add)`` or ``(None, totals, ...)``."""
    if keep_ledger:
        ledger = Ledger(job.work_s, job.deadline_s, job.on_demand_price)
        return ledger, None, _ledger_sink(ledger)
    totals = _Totals()
    return None, totals, totals.segment


def _finish(ledger: Ledger | None, totals: _Totals | None, end: float | None, probes: int) -> None:
    """A replay's end (``None``: the work was not done) and probes, where its figures go."""
    sink = ledger if ledger is not None else totals
    assert sink is not None
    sink.finished_s = end
    sink.probes = probes


def _result(
    trace: Trace,
    policy: Policy,
    job: JobSpec,
    ledger: Ledger | None,
    totals: _Totals | None,
    met: bool,
    end_s: float,
    work_on: list[float],
    preemptions: int,
    observe: str,
    overlap_s: float,
) -> RunResult:
    """The figures of one replay, from its ledger or its totals (both observation models)."""
    if ledger is not None:  # one pass over the segments, summed as Ledger's properties sum
        totals = _Totals()
        for sg in ledger.segments:
            totals.segment(sg.capacity, sg.phase, sg.start_s, sg.end_s, 0.0, 0.0, sg.price_per_h)
        totals.probes = ledger.probes
    assert totals is not None
    return RunResult(
        trace=trace.name,
        policy=policy.name,
        deadline_h=job.deadline_s / 3600.0,
        changeover_h=job.changeover_s / 3600.0,
        cost=totals.cost,
        met=met,
        spot_hours=totals.spot_h - totals.spot_probe_h,
        on_demand_hours=totals.od_h,
        spot_work_hours=work_on[0] / 3600.0,
        on_demand_work_hours=work_on[1] / 3600.0,
        preemptions=preemptions,
        finished_h=end_s / 3600.0,
        on_demand_cost=job.work_s / HOUR * job.on_demand_price,
        ledger=ledger,
        observe=observe,
        probes=totals.probes,
        probe_cost=totals.probe_cost,
        overlap_hours=overlap_s / 3600.0,
    )


def _flips(trace: Trace) -> list[int]:
    """The ticks at which spot's state differs from the tick before (after the trace, spot
    is down)."""
    a = np.asarray(trace.available, dtype=bool)
    ext = np.concatenate([a, [False]])
    return (np.flatnonzero(ext[1:] != ext[:-1]) + 1).tolist()


def _downs(avail: np.ndarray) -> list[int]:
    """``downs[i]``: how many of the first ``i`` ticks have spot down."""
    return [0, *np.cumsum(~np.asarray(avail, dtype=bool)).tolist()]


def _down_ticks(downs: list[int], t: int, u: int) -> int:
    """How many of the ticks ``t .. u-1`` have spot down (after the trace, all)."""
    n = len(downs) - 1

    def before(x: int) -> int:
        return downs[x] if x <= n else downs[n] + x - n

    return before(u) - before(t)


def _add_ticks(total: float, gap: float, count: int) -> float:
    """``total`` with ``gap`` added ``count`` times, as the per-tick loop adds it."""
    if gap.is_integer() and total.is_integer() and total + (count + 1) * gap < _EXACT:
        return total + count * gap  # whole seconds: every partial sum is exact
    for _ in range(count):
        total += gap
    return total


def _last_tick(deadline: float, gap: float) -> int:
    """The last tick ``t`` with ``t * gap < deadline`` (the replay's own test)."""
    t = max(int(deadline // gap), 0)
    while t > 0 and t * gap >= deadline:
        t -= 1
    while (t + 1) * gap < deadline:
        t += 1
    return t


def _advance(
    seg: _SegmentBuilder,
    cur: Capacity,
    t: int,
    m: int,
    gap: float,
    work: float,
    done: float,
    won: float,
    down: float,
    spot_down: bool,
    price: float,
    rro: float,
    whole: bool,
) -> tuple[int, float, float, float, float]:
    """Bill and credit the steady ticks ``t+1 .. t+m`` (fewer where the work would end) as
    the per-tick loop does: ``(m, done, work on cur, down, changeover left)``. ``rro``: the
    changeover still to pay on ``cur``, tick by tick first. The sums are those of the loop,
    one tick at a time, or, where ``whole`` (:func:`_whole_job`) and the running figures are
    whole seconds, so that every partial sum is exact, in one step."""
    if cur is NONE:
        seg.tick(NONE, (t + 1) * gap - gap, 0.0, gap, done, done, 0.0)
        if m > 1:
            seg.end, seg.p1 = (t + m) * gap - gap + gap, done
        if spot_down:
            down = _add_ticks(down, gap, m)
        return m, done, won, down, rro
    j = 0  # ticks taken
    while rro > 0.0 and j < m:  # the changeover's ticks, one by one, as the loop takes them
        w = gap - rro if gap > rro else 0.0
        nd = done + w
        if work - nd <= EPS:  # that tick ends the work: the loop takes it
            m = j
            break
        launching = gap - w
        rro = rro - launching
        if rro < EPS:
            rro = 0.0
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
        down = _add_ticks(down, gap, m)
    return m, done, won, down, rro


def _whole_job(work: float, gap: float, tlast: int) -> bool:
    """Work and ticks in whole seconds, small enough that every sum a replay makes of them
    (work done, time down: never more than the work or the ticks) is exact."""
    return gap.is_integer() and work.is_integer() and work + 2 * (tlast + 2) * gap < _EXACT


class _Totals:
    """The figures a :class:`Ledger` gives a :class:`RunResult`, summed segment by segment in
    the order the ledger would hold them (so equal to the last bit) without keeping the
    segments: what a sweep, which reads only the rows, needs."""

    __slots__ = ("cost", "spot_h", "spot_probe_h", "od_h", "probe_cost", "finished_s", "probes")

    def __init__(self) -> None:
        # int 0 to start, as sum() starts: an empty run's figures are those of an empty ledger
        self.cost: float = 0
        self.spot_h: float = 0
        self.spot_probe_h: float = 0
        self.od_h: float = 0
        self.probe_cost: float = 0
        self.finished_s: float | None = None
        self.probes = 0

    def segment(
        self,
        cap: Capacity,
        phase: Phase,
        start: float,
        end: float,
        p0: float,
        p1: float,
        price: float,
        ended_by: str = "",
        overlap: bool = False,
    ) -> None:
        """As ``Ledger.add(Segment(...))``, with ``Segment.hours`` and ``Segment.cost``."""
        if end < start:
            raise ValueError(f"segment ends ({end}) before it starts ({start})")
        if end == start:
            return
        hours = (end - start) / HOUR
        cost = 0.0 if phase is Phase.IDLE or cap is NONE else hours * price
        self.cost += cost
        if cap is SPOT:
            self.spot_h += hours
            if phase is Phase.PROBE:
                self.spot_probe_h += hours
        elif cap is OD:
            self.od_h += hours
        if phase is Phase.PROBE:
            self.probe_cost += cost


def _ledger_sink(ledger: Ledger) -> Callable[..., None]:
    """``segment(...)`` for a kept ledger: a :class:`Segment` added to ``ledger``."""
    add = ledger.add

    def segment(
        cap: Capacity,
        phase: Phase,
        start: float,
        end: float,
        p0: float,
        p1: float,
        price: float,
        ended_by: str = "",
        overlap: bool = False,
    ) -> None:
        add(Segment(cap, phase, start, end, p0, p1, price, ended_by=ended_by, overlap=overlap))

    return segment


class _SegmentBuilder:
    """Merges consecutive ticks of the same capacity, phase and price into segments, handed
    to ``emit`` (a ledger's ``segment``) as each closes, or, given ``totals``, summed into
    them (as :meth:`_Totals.segment` sums: the replay's hottest lines, inlined)."""

    __slots__ = ("emit", "totals", "cap", "phase", "price", "start", "end", "p0", "p1", "overlap")

    def __init__(
        self, emit: Callable[..., None], overlap: bool = False, totals: _Totals | None = None
    ) -> None:
        self.emit = emit
        self.totals = totals
        self.overlap = overlap
        self.cap: Capacity | None = None  # None: no segment open
        self.phase = Phase.IDLE
        self.price = self.start = self.end = self.p0 = self.p1 = 0.0

    def tick(
        self,
        cap: Capacity,
        t0: float,
        launching: float,
        gap: float,
        p0: float,
        p1: float,
        price: float,
    ) -> None:
        """One tick from ``t0``: ``launching`` seconds of changeover, then the rest of ``gap``
        running (progress ``p0`` to ``p1``), or idle where ``cap`` is none."""
        if launching > 0:
            if (
                cap is not self.cap
                or self.phase is not LAUNCHING
                or price != self.price
                or abs(t0 - self.end) > 1e-9
            ):
                self.close("")
                self.cap, self.phase, self.price, self.start, self.p0 = (
                    cap,
                    LAUNCHING,
                    price,
                    t0,
                    p0,
                )
            t1 = t0 + launching
            self.end, self.p1 = t1, p0
            if launching >= gap:
                return
        else:
            t1 = t0
        phase = IDLE if cap is NONE else RUNNING
        if (
            cap is not self.cap
            or phase is not self.phase
            or price != self.price
            or abs(t1 - self.end) > 1e-9
        ):
            self.close("")
            self.cap, self.phase, self.price, self.start, self.p0 = cap, phase, price, t1, p0
        self.end, self.p1 = t0 + gap, p1

    def close(self, ended_by: str) -> None:
        cap = self.cap
        if cap is None:
            return
        self.cap = None
        totals = self.totals
        if totals is None:
            self.emit(
                cap,
                self.phase,
                self.start,
                self.end,
                self.p0,
                self.p1,
                self.price,
                ended_by,
                self.overlap,
            )
            return
        start, end = self.start, self.end  # totals.segment(...), inlined (no probe phase here)
        if end < start:
            raise ValueError(f"segment ends ({end}) before it starts ({start})")
        if end == start:
            return
        hours = (end - start) / HOUR
        cost = 0.0 if self.phase is IDLE or cap is NONE else hours * self.price
        totals.cost += cost
        if cap is SPOT:
            totals.spot_h += hours
        elif cap is OD:
            totals.od_h += hours
