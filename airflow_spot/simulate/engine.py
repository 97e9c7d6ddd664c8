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
The observation models below differ in what the policy sees and in how a decision takes
effect; one loop runs them all.

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

A gang (``job.nodes`` > 1, or a :class:`~.gang.Gang` given) bills every node and adds the
gang's own costs (:mod:`.gang`: a partial gang's wait, the on-demand acquisition); with
neither, the replay is the one-node replay to the last bit.

``keep_ledger=False`` (what a sweep asks): the figures are summed segment by segment as they
close, in the order a ledger would hold them, and no ledger is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from airflow_spot.exceptions import ConfigError, finite_number
from airflow_spot.ledger import Phase, Segment
from airflow_spot.policy import Capacity, Decision, JobSpec, Observation, Policy
from airflow_spot.policy.base import EPS
from airflow_spot.policy.model import observation
from airflow_spot.simulate.fast_forward import advance, jumped, plan
from airflow_spot.simulate.gang import Gang, GangRun, Waste, gang_run, launch_steps, od_launch_s
from airflow_spot.simulate.result import RunResult, result
from airflow_spot.simulate.segments import SegmentBuilder, finish, sink
from airflow_spot.simulate.spot_runs import SpotRuns
from airflow_spot.simulate.ticks import changeover_steps, check_tick
from airflow_spot.simulate.traces import Trace

NONE, SPOT, OD = Capacity.NONE, Capacity.SPOT, Capacity.ON_DEMAND

OBSERVE = ("cluster", "oracle", "cluster-bbm")  # the last: an ablation (benchmarks only)
FAST = True  # fast-forward steady stretches (see the module's notes); replay(fast=...) overrides

Hint = Callable[[JobSpec, Observation, Decision], int]


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
    gang: Gang | None = None,
) -> RunResult:
    """Replay ``policy`` on ``trace`` for ``job``; ticks are the trace's ``gap_s``.

    ``observe``: ``"cluster"`` (what a cluster shows) or ``"oracle"`` (the paper's model); see
    the module's notes; ``"cluster-bbm"``: the cluster's view with break-before-make returns,
    an ablation). ``probe_hold_s``: how long capacity a probe found and the job did not
    use is billed (default: the job's changeover). ``fast``: fast-forward steady stretches
    where the policy offers a hint (default :data:`FAST`; off, every look is taken).
    ``keep_ledger=False``: the result's figures without its ledger (``ledger`` is ``None``;
    the figures are the same to the last bit), as a sweep, which reads only rows, asks.
    ``gang``: a gang's market side (:class:`~.gang.Gang`; its size is ``job.nodes``).

    The policy sees ``job`` with :attr:`~airflow_spot.policy.JobSpec.make_before_break` set
    as this replay returns to spot (only under ``"cluster"``), as the operator sets it."""
    check_replay_options(observe, probe_hold_s)
    if job.make_before_break is not (observe == "cluster"):
        job = replace(job, make_before_break=observe == "cluster")
    check_tick(job, trace.gap_s)
    steady = getattr(policy, "steady", None) if (FAST if fast is None else fast) else None
    # the blind hint (jump over spot's changes on on-demand) where every look sees spot
    blind = getattr(policy, "blind", None) if steady is not None and observe == "oracle" else None
    grun = gang_run(trace, job.nodes, gang)
    return _replay(
        policy, trace, job, observe, use_trace_prices, probe_hold_s, steady, blind, keep_ledger,
        grun,
    )  # fmt: skip


def _replay(
    policy: Policy,
    trace: Trace,
    job: JobSpec,
    observe: str,
    use_trace_prices: bool,
    probe_hold_s: float | None,
    steady: Hint | None,
    blind: Callable[[JobSpec, Observation, Decision], bool] | None,
    keep_ledger: bool,
    grun: GangRun | None = None,
) -> RunResult:
    """The replay's loop, one look per tick, for every observation model. ``watching`` (the
    oracle): every look sees spot and a decision takes effect at once; otherwise spot is seen
    only while held or asked for, requests and probes wait, and a return to spot is
    make-before-break unless ``observe="cluster-bbm"``.

    One function on purpose: the loop keeps its state in local variables, and every call per
    tick costs a replay a few per cent; the steps it takes per segment, per fast-forward or
    per change of spot's state are named (:mod:`.segments`, :mod:`.fast_forward`,
    :class:`.SpotRuns`), and the changeover a tick pays is read from a table
    (:func:`.ticks.changeover_steps`)."""
    gap = trace.gap_s
    avail = trace.available.tolist()
    n = len(avail)
    spot_prices = trace.prices.tolist() if (use_trace_prices and trace.prices is not None) else None
    work, deadline, d = job.work_s, job.deadline_s, job.changeover_s
    hold = d if probe_hold_s is None else probe_hold_s
    steps = changeover_steps(gap, d)  # steps[rro]: what a tick pays of it and leaves
    od_price, spot_price = job.on_demand_price, job.spot_price
    decide = policy.decide
    watching = observe == "oracle"  # every look sees spot (and a launch is granted at once)
    make_before_break = observe == "cluster"
    ledger, totals, add = sink(job, keep_ledger)
    waste = None  # a gang's partial holds (None: one node, today's replay)
    if grun is not None:  # every node billed; on-demand launches may wait for their nodes
        nodes = grun.nodes
        od_price, spot_price = od_price * nodes, spot_price * nodes
        if spot_prices:
            spot_prices = [p * nodes for p in spot_prices]
        steps = launch_steps(gap, d, grun)
        waste = Waste(add, grun, job.spot_price, gap)
    seg = SegmentBuilder(add, totals=totals)
    ovl = SegmentBuilder(add, overlap=True, totals=totals)
    tick = seg.tick
    cur, rro, done, preemptions = NONE, 0.0, 0.0, 0
    overlap = False  # on-demand trains on while the spot launch (cur) pays its changeover
    od_rro = 0.0  # what on-demand still had of its own changeover when the return began
    looking = ""  # what waits since the last look: "", "request" or "probe"
    probes, overlap_s = 0, 0.0
    work_on = [0.0, 0.0]  # work done on spot, on on-demand: work_on[cap is OD]
    runs, down = SpotRuns(), 0.0
    last_run = runs.last
    source = "market" if watching else ""  # what showed spot at the last look that saw it
    watched = False  # spot was seen at the last look
    if steady is not None:
        changes, tlast, whole = plan(trace, work, deadline, gap)
        fi = 0  # changes[fi]: the first change of spot's state after t (t only grows)
        downs: list[int] | None = None  # downs[i]: ticks of avail[:i] with spot down
    t = 0
    met = False
    while True:
        now = t * gap
        has = avail[t] if t < n else False
        if waste is not None and (looking == "request" or (looking and not grun.free_probe)):  # type: ignore[union-attr]
            waste.ticks(t - 1, t, done)  # [t-1, t): a partial gang held what there was
        seen = watching or cur is SPOT or looking != ""
        if seen:  # runs.see(now, has, watched), inlined: a call costs a replay 1-2 %
            if has != runs.up:
                if runs.up is not None and runs.since > 0:
                    last_run[runs.up] = (now if watched else runs.seen_at) - runs.since
                runs.up, runs.since = has, now
            if not watching:  # (the oracle's source is the market, and spot is never unseen)
                source = "attempt" if cur is SPOT else looking
                runs.seen_at = now
        last = cur
        if last is not NONE:
            w, launching, rro = steps[rro]
            if overlap:  # on-demand trained while spot launched (once its own launch was done)
                paid = od_rro if od_rro < launching else launching
                od_rro -= paid
                wo = launching - paid if launching - paid < work - done else work - done
                ovl.tick(OD, now - gap, paid, launching, done, done + wo, od_price)
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
            price = od_price if last is OD else (spot_prices[t - 1] if spot_prices else spot_price)
            tick(last, now - gap, launching, gap, done - w, done, price)
            if last is SPOT and not has:
                preemptions += 1
                seg.close("preempted")
                cur = NONE
                if overlap:  # reclaimed before it was ready: on-demand was never stopped
                    overlap, cur, rro = False, OD, od_rro
                    ovl.close("spot_lost")
        elif t > 0:
            tick(NONE, now - gap, 0.0, gap, done, done, 0.0)
        if work - done <= EPS:
            met = True
            seg.close("completed")
            ovl.close("completed")
            break
        if now >= deadline:
            seg.close("deadline")
            ovl.close("deadline")
            break
        # the policy sees an overlap only while on-demand trains under the return: one still
        # paying its own launch (a gang's reserved boot outlasts spot's) makes no progress, so
        # the return reads as a spot launch with nothing under it (the net's rule for those)
        trains = overlap and od_rro <= EPS
        if seen:  # spot's state and age seen now, as runs.observation(...) builds it
            obs = observation(
                now, done, cur, has, rro, preemptions, now - runs.since, down,
                last_run[True], last_run[False], 0.0, has, source, trains,
            )  # fmt: skip
        else:  # spot's state and age as last seen, and how long ago
            obs = observation(
                now, done, cur, None, rro, preemptions, runs.seen_at - runs.since, down,
                last_run[True], last_run[False], now - runs.seen_at, runs.up, source, trains,
            )  # fmt: skip
        decision = decide(job, obs)
        req = decision.capacity
        if watching:  # the decision takes effect at once
            if req is cur:  # kept: steady, where the changeover ends before the next look
                ask = steady is not None and rro < gap
            else:
                ask = steady is not None and cur is NONE and req is SPOT  # a launch from idle
                if req is not NONE:
                    rro = (
                        d
                        if req is SPOT or grun is None
                        else od_launch_s(d, grun, t, gap, deadline - now - work + done)
                    )
                if cur is not NONE:
                    seg.close("switched")
                cur = req
        else:
            held = cur
            found = bool(looking) and has
            looked, looking = looking, ""
            if req is SPOT and cur is not SPOT:
                if has:  # granted now (a found request or probe becomes the launch)
                    if cur is OD and d > 0 and make_before_break:
                        overlap, od_rro = True, rro  # (an on-demand launch still launching)
                    seg.close("handover" if cur is OD else "switched")
                    cur, rro = SPOT, d
                else:  # waits for capacity: on-demand, if held, trains on
                    looking = "request"
            elif req is not SPOT:
                if found and not (grun is not None and grun.free_probe and looked == "probe"):
                    price = spot_prices[min(t, n - 1)] if spot_prices else spot_price
                    add(Segment(SPOT, Phase.PROBE, now, now + hold, done, done, price))
                if req is not cur:
                    if overlap and req is OD:  # the return is called off; on-demand goes on
                        seg.close("cancelled")
                        ovl.close("cancelled")
                        overlap, cur, rro = False, OD, od_rro
                    else:
                        if overlap:
                            ovl.close("cancelled")
                            overlap = False
                        if req is not NONE:
                            rro = (
                                d
                                if req is SPOT or grun is None
                                else od_launch_s(d, grun, t, gap, deadline - now - work + done)
                            )
                        if cur is not NONE:
                            seg.close("switched")
                        cur = req
                if decision.look:
                    looking = "probe" if cur is OD else "request"
                    if looking == "probe" and (looked != "probe" or found):
                        probes += 1
            if looking and grun is not None and grun.free_probe:
                looking = "probe"  # a gang with a free capacity check waits on checks: no holds
            # as the oracle's, and only with no return launching, spot seen (or not) alike at
            # the next look, and no request or probe waiting that would find spot at once
            ask = (
                steady is not None
                and ((req is held and rro < gap) or (held is NONE and cur is SPOT))
                and not overlap
                and (cur is SPOT or looking != "") == seen
                and not (looking and has)
            )
        if ask and not (spot_prices and cur is SPOT):  # the policy's steady hint, asked
            if seen:  # until spot's state changes
                while changes[fi] <= t:
                    fi += 1
                m = min(tlast - t, changes[fi] - 1 - t)
            else:
                m = tlast - t
            k = 0  # looks the policy is certain of (its steady hint)
            jump = False  # over changes of spot's state too (the policy's blind hint)
            on_demand = cur is OD and blind is not None
            if m > 0 or (on_demand and tlast > t):
                k = steady(job, obs, decision)  # type: ignore[misc]  # (asked: not None)
                if k > m and on_demand and blind(job, obs, decision):  # type: ignore[misc]
                    m, jump = tlast - t, True
            if k > 0 and m > 0:
                # the ticks t+1 .. t+m: spot as at t where it is seen (or, jumping, whatever
                # it does: on-demand runs on), the same decision at each look
                m, done, down, rro = advance(
                    seg, cur, t, min(k, m), gap, work, done, work_on, down,
                    seen and not has and not jump, od_price if cur is OD else spot_price,
                    rro, steps, whole,
                )  # fmt: skip
                if (
                    waste is not None
                    and m > 0
                    and (looking == "request" or (looking and not grun.free_probe))  # type: ignore[union-attr]
                ):
                    waste.ticks(t, t + m, done)  # the skipped looks' waits
                if jump and m > 0:
                    fi, downs, down = jumped(runs, changes, fi, downs, trace, t, m, gap, down)
                    has = avail[t + m] if t + m < n else False  # spot in the last tick skipped
                t += m
                if seen and not watching:
                    source = "attempt" if cur is SPOT else looking
                    runs.seen_at = t * gap
        if seen and not has:  # the tick now starting is seen down (the next look knows)
            down += gap
        watched = seen
        t += 1
    if waste is not None:
        waste.close()
    finish(ledger, totals, t * gap if met else None, probes)
    return result(
        trace, policy, job, ledger, totals, met, t * gap, work_on, preemptions, observe, overlap_s,
        waste,
    )  # fmt: skip
