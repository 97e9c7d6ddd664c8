"""A gang in the replay (:mod:`airflow_spot.simulate.gang`): every node billed, a partial
gang's wait billed for the nodes it held, on-demand acquisition, and the optimum under the
same costs; and count traces tagged with their kind (:mod:`airflow_spot.simulate.counts`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from airflow_spot.exceptions import ConfigError, TraceFormatError
from airflow_spot.ledger import Phase
from airflow_spot.policy import HOUR, Capacity, Decision, JobSpec, get_policy
from airflow_spot.policy.base import safety_net
from airflow_spot.simulate.counts import check_kinds, load_count_folder, load_counts, same_kind
from airflow_spot.simulate.engine import replay
from airflow_spot.simulate.gang import Acquire, Gang
from airflow_spot.simulate.omniscient import omniscient_costs
from airflow_spot.simulate.sweep import Setting, random_windows, summarise, sweep
from airflow_spot.simulate.traces import load_trace

GAP = 300.0


def _counts_file(tmp: Path, counts: list[int], folder: str = "pool", name: str = "z") -> Path:
    d = tmp / folder
    d.mkdir(exist_ok=True)
    p = d / f"{name}.json"
    p.write_text(json.dumps({"metadata": {"gap_seconds": GAP}, "data": counts}))
    return p


def _job(nodes: int = 4, acquire_s: float = 0.0, work_h: float = 2.0, dl_h: float = 6.0):
    return JobSpec(work_h * HOUR, dl_h * HOUR, 600.0, tick_s=GAP, nodes=nodes, acquire_s=acquire_s)


def test_count_traces_carry_their_kind_and_are_never_mixed(tmp_path: Path) -> None:
    a = load_counts(_counts_file(tmp_path, [0, 4, 3, 4, 0, 2], "aws-p3-4node"))
    assert a.kind == "preemption"  # the folder's known kind
    with pytest.raises(TraceFormatError, match="kind='availability'"):
        load_counts(_counts_file(tmp_path, [0, 1], "elsewhere"))
    b = load_counts(_counts_file(tmp_path, [0, 1], "elsewhere"), kind="availability")
    with pytest.raises(TraceFormatError, match="never compared"):
        same_kind([a, b])
    assert load_count_folder(tmp_path / "aws-p3-4node")[0].kind == "preemption"
    # polarized: up when the count reaches N; all-or-none counts the ticks at 0 or N
    assert a.polarized(4).available.tolist() == [False, True, False, True, False, False]
    assert a.polarized(3).available.tolist() == [False, True, True, True, False, False]
    assert a.all_or_none(4) == pytest.approx(4 / 6)
    assert a.shares(4)["half"] == pytest.approx(2 / 6)
    gcp = _counts_file(tmp_path, [0, 4], "gcp-a100")
    aws = tmp_path / "aws-p3-4node" / "z.json"
    with pytest.raises(TraceFormatError, match="never compared"):
        check_kinds([load_trace(aws, nodes=4), load_trace(gcp, nodes=4)])


def test_every_node_is_billed(tmp_path: Path) -> None:
    """On an all-or-none trace a gang costs N times one node, to the last cent, and saves
    the same share."""
    counts = ([4] * 10 + [0] * 6) * 6
    tr = load_trace(_counts_file(tmp_path, counts), nodes=4)
    for name in ("greedy", "uniform_progress", "on_demand"):
        one = replay(get_policy(name), tr, _job(nodes=1))
        four = replay(get_policy(name), tr, _job(nodes=4))
        assert four.cost == pytest.approx(4 * one.cost)
        assert four.normalized_cost == pytest.approx(one.normalized_cost)
        assert four.partial_node_hours == 0.0 and one.partial_node_hours is None
        assert "nodes" in four.row() and "nodes" not in one.row()


def test_a_partial_gang_that_waits_is_billed_for_the_nodes_it_held(tmp_path: Path) -> None:
    # 2 of 4 for three ticks, then the whole gang: greedy's request waits over the first three
    counts = [2, 2, 3] + [4] * 80
    tr = load_trace(_counts_file(tmp_path, counts), nodes=4)
    r = replay(get_policy("greedy"), tr, _job(), observe="cluster")
    assert r.partial_node_hours == pytest.approx((2 + 2 + 3) * GAP / HOUR)
    assert r.partial_cost == pytest.approx((2 + 2 + 3) * GAP / HOUR * 0.9731)
    waste = [s for s in r.ledger.segments if s.ended_by == "partial_gang"]
    assert [(s.start_s, s.end_s, s.price_per_h) for s in waste] == [
        (0.0, 600.0, 2 * 0.9731),
        (600.0, 900.0, 3 * 0.9731),
    ]
    assert all(s.phase is Phase.PROBE for s in waste)
    assert r.cost == pytest.approx(r.ledger.cost)
    # atomic provisioning holds nothing; the oracle never waits on a request
    atomic = replay(get_policy("greedy"), tr, _job(), observe="cluster", gang=Gang(partial=False))
    assert atomic.partial_node_hours == 0.0
    assert atomic.cost == pytest.approx(r.cost - r.partial_cost)
    assert replay(get_policy("greedy"), tr, _job(), observe="oracle").partial_node_hours == 0.0
    # a free capacity check: the gang waits on checks, holds nothing, and starts as soon
    check = replay(get_policy("greedy"), tr, _job(), observe="cluster", gang=Gang(probe="check"))
    assert check.partial_node_hours == 0.0 and check.probe_cost == 0.0
    assert check.cost == pytest.approx(atomic.cost) and check.finished_h == atomic.finished_h


def test_a_partial_gang_the_cluster_says_cannot_finish_is_held_only_until_it_is_ended(
    tmp_path: Path,
) -> None:
    """Karpenter's errors say "fewer than N" and the backend ends the gang 15 s after its
    launch: each look that asks again holds the nodes there are 15 s, not the interval."""
    tr = load_trace(_counts_file(tmp_path, [2, 2, 3] + [4] * 80), nodes=4)
    held = replay(get_policy("greedy"), tr, _job(), observe="cluster")
    ended = replay(get_policy("greedy"), tr, _job(), observe="cluster",
                   gang=Gang(partial_end_s=15.0))  # fmt: skip
    assert ended.partial_node_hours == pytest.approx((2 + 2 + 3) * 15.0 / HOUR)
    waste = [s for s in ended.ledger.segments if s.ended_by == "partial_gang"]
    assert [(s.start_s, s.end_s, s.price_per_h) for s in waste] == [
        (0.0, 15.0, 2 * 0.9731),
        (300.0, 315.0, 2 * 0.9731),
        (600.0, 615.0, 3 * 0.9731),
    ]
    # the rest of the replay is the same: the gang starts at the same look
    assert ended.finished_h == held.finished_h
    assert ended.cost == pytest.approx(held.cost - held.partial_cost + ended.partial_cost)
    fast = replay(get_policy("greedy"), tr, _job(), observe="cluster",
                  gang=Gang(partial_end_s=15.0), keep_ledger=False)  # fmt: skip
    assert fast.row() == ended.row()
    with pytest.raises(ConfigError, match="partial_end"):
        Gang(partial_end_s=0.0)


def test_on_demand_waits_for_its_nodes_and_the_safety_net_keeps_the_margin(tmp_path: Path) -> None:
    tr = load_trace(_counts_file(tmp_path, [0] * 100), nodes=4)
    fixed = Gang(acquire=Acquire(2 * GAP))
    od = replay(get_policy("on_demand"), tr, _job(), gang=fixed)
    # 2 ticks to get the nodes and the changeover, billed at 4 on-demand nodes, then the work
    assert od.finished_h == pytest.approx((2 * GAP + 600 + 2 * HOUR) / HOUR)
    assert od.cost == pytest.approx(4 * 3.06 * (2 * GAP + 600 + 2 * HOUR) / HOUR)
    # greedy waits on a dead market: without the margin it would start on-demand too late
    # (its own rule keeps two changeovers: an acquisition of 6 ticks outlasts them)
    slow, tight = Gang(acquire=Acquire(6 * GAP)), _job(dl_h=3.0)
    assert not replay(get_policy("greedy"), tr, tight, gang=slow).met
    kept = replace(tight, acquire_s=6 * GAP)
    assert replay(get_policy("greedy"), tr, kept, gang=slow).met
    d = safety_net(kept, _obs(kept), Decision(Capacity.SPOT, "spot_up"))
    assert d.rule == "safety_acquire" and "acquire the gang's on-demand nodes" in d.reason
    assert safety_net(tight, _obs(kept), Decision(Capacity.SPOT, "spot_up")).rule == "spot_up"


def test_a_late_open_pool_escalates_to_the_reserved_pool_in_time(tmp_path: Path) -> None:
    tr = load_trace(_counts_file(tmp_path, [0] * 100), nodes=4)
    late = Acquire(12 * GAP)  # the open pool's nodes take an hour, past any margin kept
    job = _job(dl_h=3.0, acquire_s=4 * GAP)
    assert not replay(get_policy("greedy"), tr, job, gang=Gang(acquire=late)).met
    # a reservation brings the gang up in one tick: the launch asks the open pool, then the
    # reserved one at the last look that still meets the deadline, and the job is on time
    pool = Gang(acquire=late, reserved_s=GAP)
    assert pool.margin_s(GAP) == GAP
    kept = replace(job, acquire_s=pool.margin_s(GAP))
    r = replay(get_policy("greedy"), tr, kept, gang=pool)
    assert r.met and r.row()["escalations"] == 1
    assert r.finished_h <= 3.0
    # a pool on time is never escalated; the optimum may use the reservation too
    soon = replay(get_policy("greedy"), tr, kept, gang=Gang(acquire=Acquire(GAP), reserved_s=GAP))
    assert soon.met and soon.row()["escalations"] == 0
    # the reservation first (Karpenter's reserved capacity): the launch waits only its tick,
    # as early as the job wants on-demand, so greedy finishes a tick after it starts
    first = Gang(acquire=late, reserved_s=GAP, reserved_first=True)
    f = replay(get_policy("greedy"), tr, kept, gang=first)
    assert f.met and f.row()["escalations"] == 1 and f.finished_h < r.finished_h
    assert f.cost < r.cost
    with pytest.raises(ConfigError, match="reserved"):
        Gang(reserved_s=-1.0)
    with pytest.raises(ConfigError, match="reserved_first"):
        Gang(reserved_first=True)


def _obs(job: JobSpec):
    from airflow_spot.policy import Observation

    return Observation(now=job.deadline_s - job.work_s - 1500.0, done_s=0.0, spot_available=True)


def test_drawn_acquisition_is_seeded_and_has_its_p95() -> None:
    a = Acquire(20 * 60.0, 5 * 60.0, seed=3)
    t = a.ticks("w", 20000, GAP)
    assert (t == a.ticks("w", 20000, GAP)).all() and not (t == a.ticks("v", 20000, GAP)).all()
    assert np.quantile(t * GAP, 0.95) == pytest.approx(20 * 60.0, abs=GAP)
    assert a.margin_s(GAP) == 4 * GAP and Acquire(1000.0).margin_s(GAP) == 4 * GAP
    with pytest.raises(ConfigError):
        Acquire(60.0, 120.0)
    with pytest.raises(ConfigError):
        Gang(probe="free")


def _windows(tmp_path: Path, count: int = 12):
    rng = np.random.default_rng(5)
    counts, c = [], 4
    for _ in range(4000):  # runs of 4 and 0 with short partial passages
        if rng.random() < 0.05:
            c = {4: 3, 3: int(rng.choice([0, 4])), 0: int(rng.choice([0, 2])), 2: 4}[c]
        counts.append(c)
    tr = load_trace(_counts_file(tmp_path, counts), nodes=4)
    return random_windows(tr, count, int(20 * HOUR / GAP), seed=1)


@pytest.mark.parametrize(("observe", "reserved"), [("cluster", None), ("oracle", None),
                                                   ("cluster", GAP)])  # fmt: skip
def test_gang_replay_is_the_same_with_fast_forward_and_ledger_or_not(
    tmp_path: Path, observe: str, reserved: float | None
) -> None:
    gang = Gang(acquire=Acquire(20 * 60.0, 5 * 60.0, seed=2), reserved_s=reserved)
    job = _job(work_h=8.0, dl_h=14.0, acquire_s=gang.margin_s(GAP))
    for w in _windows(tmp_path, 6):
        for name in ("greedy", "uniform_progress", "deadline_aware"):
            slow = replay(get_policy(name), w, job, observe=observe, gang=gang, fast=False)
            fast = replay(get_policy(name), w, job, observe=observe, gang=gang)
            bare = replay(get_policy(name), w, job, observe=observe, gang=gang, keep_ledger=False)
            assert slow.row() == fast.row() == bare.row()


def test_the_optimum_bounds_every_policy_under_the_same_gang_costs(tmp_path: Path) -> None:
    gang = Gang(acquire=Acquire(20 * 60.0, 5 * 60.0, seed=2), reserved_s=GAP)
    ws = _windows(tmp_path)
    s = Setting(8.0, 14.0, 600 / HOUR, 0.9731, 3.06, nodes=4, acquire_s=GAP)
    rows = sweep(ws, ["greedy", "uniform_progress", "omniscient"], [s], workers=1, gang=gang)
    best = {r["trace"]: r["cost"] for r in rows if r["policy"] == "omniscient"}
    for r in rows:
        assert r["met"] and r["cost"] >= best[r["trace"]] - 1e-6
    assert all(x["misses"] == 0 for x in summarise(rows))
    # on a dead market the optimum is on-demand from the start, nodes and acquisition paid
    job = _job(work_h=2.0, dl_h=6.0)
    dead = np.zeros((1, 100), dtype=bool)
    acq = np.full((1, 100), 2)
    want = 4 * 3.06 * (2 * GAP + 600 + 2 * HOUR) / HOUR
    assert omniscient_costs(dead, job, acquire=acq)[0] == pytest.approx(want)
    assert omniscient_costs(dead, replace(job, nodes=1))[0] == pytest.approx(
        3.06 * (600 + 2 * HOUR) / HOUR
    )


def test_simulate_replays_a_gang_from_the_command_line(tmp_path: Path, capsys) -> None:
    from airflow_spot.cli import main

    counts = ([4] * 30 + [2, 1] + [0] * 20 + [3]) * 8
    path = str(_counts_file(tmp_path, counts, "aws-p3-4node"))
    base = ["simulate", path, "--work", "4h", "--deadline", "8h", "--quiet", "--workers", "1"]
    out = tmp_path / "rows.json"
    assert main([*base, "--nodes", "4", "--acquire", "20m", "--acquire-median", "5m",
                 "--json", str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())
    assert {r["nodes"] for r in rows if r["policy"] != "omniscient"} == {4}
    assert any(r["partial_cost"] > 0 for r in rows if r["policy"] != "omniscient")
    assert "misses" in capsys.readouterr().out
    assert main([*base, "--nodes", "4", "--acquire-median", "5m"]) == 2
    assert "--acquire-median: needs --acquire" in capsys.readouterr().err
    assert main([*base, "--nodes", "4", "--reserved", "5m"]) == 2
    assert "--reserved: needs --acquire" in capsys.readouterr().err
    kept = tmp_path / "kept.json"
    assert main([*base, "--nodes", "4", "--acquire", "20m", "--acquire-median", "5m",
                 "--reserved", "5m", "--json", str(kept)]) == 0  # fmt: skip
    assert all(
        "escalations" in r for r in json.loads(kept.read_text()) if r["policy"] != "omniscient"
    )
    ended = tmp_path / "ended.json"  # Karpenter's early end: less held than the whole wait
    assert main([*base, "--nodes", "4", "--partial-end", "15s", "--json", str(ended)]) == 0
    held = {(r["policy"], r["trace"]): r["partial_cost"] for r in rows if "partial_cost" in r}
    cut = [r for r in json.loads(ended.read_text()) if r["policy"] == "greedy"]
    assert cut and all(r["partial_cost"] < held[("greedy", r["trace"])] for r in cut)
    first = tmp_path / "first.json"  # the reservation first: every on-demand launch counted
    od = ["--nodes", "4", "--acquire", "20m", "--acquire-median", "5m", "--reserved", "5m",
          "--policy", "on_demand", "--json", str(first)]  # fmt: skip
    assert main([*base, *od]) == 0
    assert [r["escalations"] for r in json.loads(first.read_text())] == [0]  # on time: kept
    assert main([*base, *od, "--reserved-first"]) == 0
    assert [r["escalations"] for r in json.loads(first.read_text())] == [1]
    assert main([*base, "--nodes", "4", "--reserved-first"]) == 2
    assert "--reserved-first: needs --reserved" in capsys.readouterr().err
    assert main([*base, "--nodes", "4", "--atomic", "--partial-end", "15s"]) == 2
    assert "--partial-end: an --atomic gang holds no partial gang" in capsys.readouterr().err
    one = tmp_path / "one.json"
    assert main([*base, "--nodes", "1", "--json", str(one)]) == 0  # no gang: today's rows
    assert all("nodes" not in r for r in json.loads(one.read_text()))
