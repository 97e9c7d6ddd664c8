"""Run many policies over many windows, deadlines and changeovers; summarise the figures.

Online policies are replayed window by window with :func:`~.engine.replay` (the very code
the operator runs); the omniscient optimum is solved for all windows of a setting at once.
Work is spread over processes (one per core by default). A gang (:attr:`Setting.nodes` > 1,
or a :class:`~.gang.Gang` given) bills every node and its own costs in both.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from airflow_spot.exceptions import UnknownPolicy
from airflow_spot.policy import HOUR, JobSpec, get_policy
from airflow_spot.simulate.engine import check_replay_options, replay
from airflow_spot.simulate.gang import Gang
from airflow_spot.simulate.omniscient import omniscient_costs
from airflow_spot.simulate.traces import Trace

OMNISCIENT = "omniscient"


@dataclass(frozen=True)
class Setting:
    """One job shape of a sweep (hours)."""

    work_h: float
    deadline_h: float
    changeover_h: float
    spot_price: float
    on_demand_price: float
    nodes: int = 1  # a gang's size: every node billed
    acquire_s: float = 0.0  # the on-demand acquisition margin the safety net keeps

    def job(self, tick_s: float) -> JobSpec:
        return JobSpec(
            work_s=self.work_h * HOUR,
            deadline_s=self.deadline_h * HOUR,
            changeover_s=self.changeover_h * HOUR,
            spot_price=self.spot_price,
            on_demand_price=self.on_demand_price,
            tick_s=tick_s,
            nodes=self.nodes,
            acquire_s=self.acquire_s,
        )


def random_windows(trace: Trace, count: int, length: int, seed: int = 0) -> list[Trace]:
    """``count`` windows of ``length`` ticks starting at random ticks (as the paper cut its set)."""
    if length > len(trace):
        raise ValueError(f"{trace.name}: {len(trace)} ticks, shorter than a {length}-tick window")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(trace) - length + 1, size=count)
    return [trace.window(int(s), length, f"{trace.name}@{int(s)}") for s in starts]


def _run_online(args: tuple) -> list[dict]:
    policy_name, traces, setting, use_prices, observe, hold, gang = args
    policy = get_policy(policy_name)
    job = setting.job(traces[0].gap_s)
    rows = [
        replay(
            policy,
            tr,
            job,
            use_trace_prices=use_prices,
            observe=observe,
            probe_hold_s=hold,
            keep_ledger=False,
            gang=gang,
        ).row()
        for tr in traces
    ]
    for r in rows:
        r["policy"] = policy_name  # "deadline_aware@aws-p3" stays apart from "deadline_aware"
    return rows


def _run_omniscient(args: tuple) -> list[dict]:
    _, traces, setting, use_prices, _observe, _hold, gang = args
    job = setting.job(traces[0].gap_s)
    length = max(len(t) for t in traces)
    avail = np.zeros((len(traces), length), dtype=bool)
    for i, t in enumerate(traces):
        avail[i, : len(t)] = t.available
    prices = None
    if use_prices and all(t.prices is not None for t in traces):
        prices = np.stack([np.pad(t.prices, (0, length - len(t)), mode="edge") for t in traces])
    acquire = None
    if gang is not None and gang.acquire is not None and gang.acquire.p95_s > 0:
        acquire = np.zeros((len(traces), length), dtype=np.int64)
        for i, t in enumerate(traces):
            acquire[i, : len(t)] = gang.acquire.ticks(t.name, len(t), t.gap_s)
        if gang.reserved_s is not None:  # the optimum, knowing the draws, asks the faster pool
            reserved = round(gang.margin_s(traces[0].gap_s) / traces[0].gap_s)
            acquire = np.minimum(acquire, reserved)
    costs = omniscient_costs(avail, job, prices, acquire)
    od_cost = setting.work_h * setting.on_demand_price * setting.nodes
    return [
        {
            "trace": t.name,
            "policy": OMNISCIENT,
            "deadline_h": setting.deadline_h,
            "changeover_h": setting.changeover_h,
            "cost": round(float(c), 6),
            "normalized_cost": round(float(c) / od_cost, 6),
            "met": bool(c < 1e17),
            "spot_hours": None,
            "on_demand_hours": None,
        }
        for t, c in zip(traces, costs, strict=True)
    ]


def sweep(
    traces: Sequence[Trace],
    policies: Iterable[str],
    settings: Iterable[Setting],
    *,
    use_trace_prices: bool = False,
    observe: str | Sequence[str] = "cluster",
    probe_hold_s: float | None = None,
    workers: int | None = None,
    chunk: int = 150,
    progress: Callable[[int, int], None] | None = None,
    gang: Gang | None = None,
) -> list[dict]:
    """One row per trace, policy, setting and observation model (see :meth:`RunResult.row`;
    ``observe``: one model or several, each online policy replayed under each; the omniscient
    optimum sees everything and is solved once). ``gang``: a gang's market side (its size is
    each setting's ``nodes``)."""
    models = [observe] if isinstance(observe, str) else list(observe)
    for m in models:
        check_replay_options(m, probe_hold_s)
    if not traces:
        raise ValueError("no traces to sweep")
    gaps = {t.gap_s for t in traces}
    if len(gaps) != 1:
        raise ValueError(f"all traces must share one tick; got {sorted(gaps)} s (resample them)")
    policies = list(policies)
    for name in policies:
        if name != OMNISCIENT:
            try:
                get_policy(name)  # fail fast on an unknown name
            except UnknownPolicy as e:
                text = e.args[0].partition(": ")[2]
                if text.startswith("unknown policy"):  # the simulator also knows the optimum
                    text = f"{text}, {OMNISCIENT}"
                raise UnknownPolicy("policy", text) from None
    tasks: list[tuple[Callable, tuple]] = []
    for s in settings:
        for name in policies:
            if name == OMNISCIENT:
                tasks += [
                    (
                        _run_omniscient,
                        (name, traces[i : i + 300], s, use_trace_prices, None, None, gang),
                    )
                    for i in range(0, len(traces), 300)
                ]
            else:
                tasks += [
                    (
                        _run_online,
                        (name, traces[i : i + chunk], s, use_trace_prices, m, probe_hold_s, gang),
                    )
                    for m in models
                    for i in range(0, len(traces), chunk)
                ]
    workers = workers or min(os.cpu_count() or 1, 4)
    rows: list[dict] = []
    done = 0
    if workers <= 1:
        for fn, a in tasks:
            rows += fn(a)
            done += 1
            if progress:
                progress(done, len(tasks))
        return rows
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, a) for fn, a in tasks]
        for f in futures:
            rows += f.result()
            done += 1
            if progress:
                progress(done, len(tasks))
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per policy, observation model, deadline and changeover: mean normalised cost, savings,
    gap, misses, probes and probe cost."""
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_key[(r["policy"], r["deadline_h"], r["changeover_h"], r.get("observe"))].append(r)
    omni = {
        (r["trace"], r["deadline_h"], r["changeover_h"]): r["cost"]
        for r in rows
        if r["policy"] == OMNISCIENT
    }
    out = []
    for (policy, dl, co, observe), rs in sorted(
        by_key.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0], kv[0][3] or "")
    ):
        norm = float(np.mean([r["normalized_cost"] for r in rs]))
        paired = [(r["cost"], omni[k]) for r in rs if (k := (r["trace"], dl, co)) in omni]
        gap = (
            float(np.mean([c for c, _ in paired]) / np.mean([o for _, o in paired]) - 1)
            if paired
            else None
        )
        out.append(
            {
                "policy": policy,
                "deadline_h": dl,
                "changeover_h": co,
                "windows": len(rs),
                "mean_cost": float(np.mean([r["cost"] for r in rs])),
                "normalized_cost": norm,
                "savings": 1 - norm,
                "gap_to_omniscient": gap,  # mean cost / mean omniscient cost - 1
                "misses": sum(1 for r in rs if not r["met"]),
                "observe": observe,
                "probes": float(np.mean([r.get("probes") or 0 for r in rs])),
                "probe_cost": float(np.mean([r.get("probe_cost") or 0.0 for r in rs])),
            }
        )
    return out
