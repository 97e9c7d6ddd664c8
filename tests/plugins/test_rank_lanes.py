"""Issue 35: the Spot timeline shows a gang with one lane per rank under the job's bar, each
rank's segments and how it ended in each attempt (its node taken, stopped with the gang,
failed first); a job of one node looks as it did. The API and the browser's view of the same
lanes are in test_plugin_api.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.plugins.app import timeline_svg
from airflow_spot.plugins.data import row
from airflow_spot.timeline import gang_size, lanes, rank_lanes

FIXTURES = Path(__file__).parents[1] / "fixtures"
# the task state `make demo-gang` stored (4 ranks on the local backend, JAX over gloo): spot
# attempt 1 lost rank 3's node, attempt 2 ranks 0 and 3's, attempt 3 finished on on-demand
DEMO_GANG = FIXTURES / "gang" / "demo_gang_state.json"
T0, H = 1_800_000_000.0, 3600.0
NO_SESSION: Any = None  # the page's route reads its state through load_one, patched here


def _demo() -> dict:
    return json.loads(DEMO_GANG.read_text())


def _count(svg: str, cls: str) -> int:
    return len(re.findall(rf'class="{cls}"', svg))


def test_a_gang_has_a_lane_per_rank_with_each_ranks_end() -> None:
    """Each of the 4 ranks gets a lane holding every attempt's changeover and run (not the idle
    gaps) and, per attempt, the end that attempt recorded for that rank; the ranks whose nodes
    were taken are the gang's cause."""
    state = _demo()
    summary = state["finished"]
    ranks = rank_lanes(summary)
    assert gang_size(summary) == 4 and [lane["rank"] for lane in ranks] == [0, 1, 2, 3]
    held = [s for s in summary["segments"] if s["phase"] in ("launching", "running")]
    recorded = {
        (a["attempt"], r["rank"]): (r["outcome"], r["exit_code"])
        for a in summary["attempts"]
        for r in a["ranks"]
    }
    for lane in ranks:
        segs = lane["segments"]
        assert [(s["start_s"], s["end_s"]) for s in segs] == [
            (s["start_s"], s["end_s"]) for s in held
        ]
        for s in segs:
            assert (s["outcome"], s["exit_code"]) == recorded[(s["attempt"], lane["rank"])]
            assert s["cause"] == (s["outcome"] == "preempted") and s["sub"] == 0
        assert [s["attempt"] for s in segs if s["last"]] == [1, 2, 3]
    taken = {(s["attempt"], lane["rank"]) for lane in ranks for s in lane["segments"] if s["cause"]}
    assert taken == {(1, 3), (2, 0), (2, 3)}


def test_the_timeline_draws_the_lanes_and_marks_each_end() -> None:
    """The SVG has a labelled lane a rank; a red mark where a rank's node was taken (3), a grey
    square where one was stopped with the gang (5), the cause's segments outlined; the main
    bar's preemption marks name the ranks that lost their nodes; a legend row says it."""
    svg = timeline_svg(_demo())
    labels = re.findall(r'<text class="rank-label"[^>]*>([^<]*)</text>', svg)
    assert labels == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert _count(svg, "rank-lane") == 4
    assert _count(svg, "rank-end preempted") == 3 and _count(svg, "rank-end stopped") == 5
    assert _count(svg, "rank-end failed") == 0
    assert len(re.findall(r'class="rank-seg [a-z_]+ [a-z]+ cause"', svg)) == 3 * 2
    assert "rank 3, attempt 1: spot running " in svg
    assert "its node was taken: the gang was preempted" in svg
    assert "stopped with the gang (exit -15)" in svg and "finished (exit 0)" in svg
    assert ": rank 3 lost its node</title>" in svg and ": ranks 0, 3 lost their nodes" in svg
    assert _count(svg, "preemption") == 2  # the job's own marks, one a gang preemption
    assert "rank stopped with the gang</text>" in svg
    legend = svg.split('<g class="rank-legend"')[1]
    for x, text in re.findall(r'<text x="([\d.]+)"[^>]*>([^<]*)</text>', legend):
        assert float(x) + 0.62 * 10 * len(text) <= 900, text  # inside the SVG's width


def test_the_page_says_the_gangs_size_and_node_hours(monkeypatch) -> None:
    """The timeline page's figures name the gang's size and its node-hours per capacity."""
    from airflow_spot.plugins import app

    state = _demo()
    monkeypatch.setattr(app, "load_one", lambda *a: state)
    page = app.timeline(NO_SESSION, "d", "r", "train_gang")
    hours = state["finished"]["node_hours"]
    assert (
        f"gang of <b>4</b> ranks (a lane each below the bar), node-hours: spot "
        f"{hours['spot']:.2f}, on-demand {hours['on_demand']:.2f}"
    ) in page


def _gang_state(nodes: int, attempts: list) -> dict:
    """A gang's stored state, with the summary the operator's Report makes of it."""
    from airflow_spot.jobstate import JobState
    from airflow_spot.operators.job import TaskIdentity
    from airflow_spot.operators.summary import Report
    from airflow_spot.testing.fakes import job_args

    args = job_args(nodes=nodes)
    st = JobState(started_at=T0, deadline_at=T0 + 10 * H, total_steps=400)
    st.attempts = attempts
    live = [i for i, a in enumerate(attempts) if a.ended_at is None]
    st.current = live[-1] if live else None
    st.snapshot = Report(args, TaskIdentity("d", "train", "r"), st).unfinished(
        T0 + 3.5 * H, deadline_met=None
    )
    return st.to_dict()


def _attempt(n: int, cap: str, start_h: float, end_h: float | None, **kw):
    from airflow_spot.jobstate import AttemptHandle, AttemptRecord

    return AttemptRecord(
        n,
        cap,
        AttemptHandle(run_dir=f"/a{n}"),
        launched_at=T0 + start_h * H,
        granted_at=T0 + start_h * H,
        started_at=T0 + (start_h + 0.1) * H,
        ended_at=None if end_h is None else T0 + end_h * H,
        price=3.0 if cap == "on_demand" else 1.0,
        **kw,
    )


def test_an_app_failure_marks_the_rank_that_failed_first() -> None:
    """Rank 1 exits 1 on healthy spot and the others are stopped with the gang: rank 1's lane
    has the red cross and the outline; the on-demand attempt that follows is running on every
    rank (it has recorded no ranks yet), with no end mark."""
    ranks_1 = [
        {"rank": 0, "outcome": "stopped", "exit_code": -15},
        {"rank": 1, "outcome": "failed", "exit_code": 1},
        {"rank": 2, "outcome": "stopped", "exit_code": -15},
    ]
    state = _gang_state(
        3,
        [
            _attempt(1, "spot", 0.0, 2.0, outcome="app_failure", exit_code=1, ranks=ranks_1),
            _attempt(2, "on_demand", 2.2, None),
        ],
    )
    ranks = rank_lanes(state["snapshot"])
    ends = [[(s["attempt"], s["outcome"]) for s in lane["segments"] if s["last"]] for lane in ranks]
    assert ends == [
        [(1, "stopped"), (2, "running")],
        [(1, "failed"), (2, "running")],
        [(1, "stopped"), (2, "running")],
    ]
    svg = timeline_svg(state)
    assert _count(svg, "rank-end failed") == 1 and _count(svg, "rank-end stopped") == 2
    assert _count(svg, "rank-end preempted") == 0 and _count(svg, "preemption") == 0
    failed = re.search(r'<path class="rank-end failed" data-rank="(\d)" data-attempt="(\d)"', svg)
    assert failed and failed.groups() == ("1", "1")
    assert "failed first (exit 1): the gang&#x27;s app failure" in svg
    assert "rank 2, attempt 2: on_demand running 2.30-3.50 h; running" in svg
    assert row("d", "r", "train", -1, "running", state, None)["nodes"] == 3


def test_a_kubernetes_gangs_lost_node_and_unplaced_rank_read_as_such() -> None:
    """The ends a Kubernetes gang records (gang_ranks.py): a node lost to an infrastructure
    disruption is the gang's cause, marked and outlined as a taken node; a rank never placed
    says so."""
    ranks = [
        {"rank": 0, "outcome": "infra_disruption", "exit_code": None},
        {"rank": 1, "outcome": "pending", "exit_code": None},
    ]
    state = _gang_state(2, [_attempt(1, "spot", 0.0, 2.0, outcome="infra_disruption", ranks=ranks)])
    lost, unplaced = (lane["segments"][-1] for lane in rank_lanes(state["snapshot"]))
    assert lost["cause"] and not unplaced["cause"]
    svg = timeline_svg(state)
    assert (
        _count(svg, "rank-end infra_disruption") == 1
        and _count(svg, "rank-seg spot running cause") == 1
    )
    assert "its node was lost (infra disruption): the gang was stopped" in svg
    assert "rank 1, attempt 1: spot running 0.10-2.00 h; never started (pending)" in svg


def test_a_runs_pieces_at_price_changes_are_one_segment_a_rank() -> None:
    """The ledger splits a spot run at each price change; a rank's lane draws the run once."""
    prices = [[T0, 1.0], [T0 + 0.5 * H, 1.2], [T0 + 1.0 * H, 0.9], [T0 + 1.5 * H, 1.1]]
    state = _gang_state(2, [_attempt(1, "spot", 0.0, None, prices=prices)])
    pieces = [s for s in state["snapshot"]["segments"] if s["phase"] == "running"]
    assert len(pieces) == 4
    for lane in rank_lanes(state["snapshot"]):
        runs = [s for s in lane["segments"] if s["phase"] == "running"]
        assert [(s["start_s"], s["end_s"]) for s in runs] == [
            (pieces[0]["start_s"], pieces[-1]["end_s"])
        ]
    assert _count(timeline_svg(state), "rank-seg spot running") == 2


def test_a_make_before_break_return_gets_the_lanes_lower_half() -> None:
    """A gang's spot attempt launching while the on-demand gang trains on: in each rank's lane
    the launching segment goes in the lower half, under the on-demand run it overlaps."""
    stopped = [{"rank": k, "outcome": "stopped", "exit_code": 0} for k in range(2)]
    od = _attempt(1, "on_demand", 0.0, 3.0, outcome="cancelled", ranks=stopped, handed_to=2)
    spot = _attempt(2, "spot", 2.4, None, step_start=300)
    spot.started_at = T0 + 3.0 * H
    state = _gang_state(2, [od, spot])
    for lane in rank_lanes(state["snapshot"]):
        subs = {(s["attempt"], s["phase"]): s["sub"] for s in lane["segments"]}
        assert subs == {
            (1, "launching"): 0,
            (1, "running"): 0,
            (2, "launching"): 1,
            (2, "running"): 0,
        }
    svg = timeline_svg(state)
    half = re.findall(
        r'class="rank-seg spot launching" data-rank="\d" x="[\d.]+" y="[\d.]+" '
        r'width="[\d.]+" height="([\d.]+)"',
        svg,
    )
    assert half == ["5.5", "5.5"]


def test_a_big_gang_gets_thinner_lanes_and_fewer_labels() -> None:
    """64 ranks: every rank has a lane, 3 px each; the labels do not overlap and stay inside."""
    victims = {5, 40}
    ranks = [
        {"rank": k, "outcome": "preempted" if k in victims else "stopped", "exit_code": -15}
        for k in range(64)
    ]
    state = _gang_state(64, [_attempt(1, "spot", 0.0, 2.0, outcome="preempted", ranks=ranks)])
    svg = timeline_svg(state)
    assert _count(svg, "rank-lane") == 64 and _count(svg, "rank-end preempted") == 2
    labels = re.findall(r'<text class="rank-label" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)<', svg)
    ys = [float(y) for _, y, _ in labels]
    assert labels[0][2] == "rank 0" and labels[-1][2] == "rank 63"
    assert len(labels) > 10 and all(b - a >= 11 for a, b in zip(ys, ys[1:], strict=False))
    assert all(float(x) - 0.6 * 9 * len(t) >= 0 for x, _, t in labels)
    height = re.search(r'height="(\d+)"', svg)
    assert height is not None and int(height.group(1)) < 240 + 6 + 64 * 3 + 16 + 1


@pytest.mark.parametrize("run", ["local_run", "kubernetes_run"])
def test_a_job_of_one_node_has_no_rank_lanes(run, monkeypatch) -> None:
    """A job of one node (states an earlier version stored): no rank lanes, no rank legend,
    no gang figures; its row says one node."""
    from airflow_spot.plugins import app

    for name in ("jobstate_finished.json", "jobstate_live.json"):
        state = json.loads((FIXTURES / "upgrade" / run / name).read_text())
        monkeypatch.setattr(app, "load_one", lambda *a, s=state: s)
        summary = state.get("finished") or state.get("snapshot")
        assert rank_lanes(summary) == [] and gang_size(summary) == 1
        svg = timeline_svg(state)
        assert "rank" not in svg
        extra = 12 * max(lanes(summary["segments"]), default=0)  # probe lanes only, as before
        assert f'height="{240 + extra}" viewBox="0 0 900 {240 + extra}"' in svg
        assert "gang of" not in app.timeline(NO_SESSION, "d", "r", "t")
        assert row("d", "r", "t", -1, None, state, None)["nodes"] == 1
