"""Draw a run's timeline from its ledger summary: capacity segments, preemptions, progress, deadline.

Segments that run at the same time as others (capacity a probe found and the job did not use;
a spot attempt launching while on-demand trains on, a make-before-break return) go on a lane
of their own below the main bar (:func:`lanes`); the UI's SVG draws the same lanes. A gang's
ranks get a lane each (:func:`rank_lanes`: the UI draws them under the job's bar)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

COLORS = {
    ("spot", "running"): "#2f9e44",
    ("spot", "launching"): "#b2f2bb",
    ("on_demand", "running"): "#e8590c",
    ("on_demand", "launching"): "#ffc078",
    ("none", "idle"): "#dee2e6",
    ("spot", "probe"): "#9775fa",
}
OTHER = "#adb5bd"  # a capacity or phase this version does not know
# legend labels, in the order of COLORS
LABELS = [
    "spot",
    "spot changeover",
    "on-demand",
    "on-demand changeover",
    "idle",
    "probe (found, not used)",
]
OVERLAP_LABEL = "make-before-break overlap"
PROBE = "probe"


def color(s: dict[str, Any]) -> str:
    return COLORS.get((str(s.get("capacity")), str(s.get("phase"))), OTHER)


def lanes(segs: list[dict[str, Any]]) -> list[int]:
    """The lane of each segment: 0, the main bar, for the job's own sequence; 1, 2, ... for a
    segment that starts before the lanes above it are free (a probe's capacity, a spot attempt
    launching while on-demand trains on). Probe segments never go on the main bar."""
    order = sorted(
        range(len(segs)),
        key=lambda i: (
            float(segs[i].get("start_s") or 0.0),
            segs[i].get("phase") == PROBE,
            segs[i].get("phase") != "running",
        ),
    )
    ends: list[float] = []
    out = [0] * len(segs)
    for i in order:
        s = segs[i]
        start = float(s.get("start_s") or 0.0)
        first = 1 if s.get("phase") == PROBE else 0
        lane = next(
            (k for k in range(first, len(ends)) if start >= ends[k] - 1e-6),
            max(first, len(ends)),
        )
        while len(ends) <= lane:
            ends.append(float("-inf"))
        ends[lane] = float(s.get("end_s") or start)
        out[i] = lane
    return out


# how a gang's rank ended in an attempt, as the backend records it in the attempt's ``ranks``
# (backends/local/gang.py, backends/kubernetes/gang_ranks.py): "preempted" (its node was
# taken: the gang's preemption), "infra_disruption" or "spot_unavailable" (its node lost
# otherwise, on Kubernetes), "stopped" (stopped with the gang), "failed" (the gang's first
# failure), "succeeded", "pending" (never placed); the UI adds "running" (the live attempt:
# no ranks recorded yet) and None (not recorded)
NODE_LOST = ("preempted", "infra_disruption", "spot_unavailable")
CAUSES = (*NODE_LOST, "failed")  # a rank whose end was the gang's verdict
HELD = ("launching", "running")  # the phases in which an attempt holds its nodes


def gang_size(summary: dict[str, Any]) -> int:
    """The job's ranks: the summary's ``nodes`` (a gang's; 1 when absent), or more where an
    attempt recorded a higher rank."""
    seen = [
        r.get("rank")
        for a in summary.get("attempts") or []
        if isinstance(a, dict)
        for r in a.get("ranks") or []
        if isinstance(r, dict)
    ]
    top = max((k + 1 for k in seen if isinstance(k, int) and k >= 0), default=0)
    nodes = summary.get("nodes")
    return max(nodes if isinstance(nodes, int) and nodes > 0 else 1, top)


def rank_lanes(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A gang's timeline, one lane a rank (rank 0..N-1); [] for one node. Each lane is
    ``{"rank": k, "segments": [...]}``: the segments in which an attempt held its nodes
    (changeover and running; not idle, not a probe's capacity), each with the ``attempt``, its
    ``capacity``, ``phase``, ``start_s``, ``end_s`` (an attempt's pieces at price changes
    joined), how this rank ended in that attempt (``outcome``, ``exit_code``), whether that end
    was the gang's verdict (``cause``: its node was taken or lost, or it failed first), the
    attempt's ``attempt_outcome``, ``last`` (the attempt's last segment: where its end is
    drawn) and ``sub`` (0; 1 for a segment at the same time as another of the rank's, as a
    make-before-break return's)."""
    n = gang_size(summary)
    if n <= 1:
        return []
    attempts = {a.get("attempt"): a for a in summary.get("attempts") or [] if isinstance(a, dict)}
    held = _merged(
        s
        for s in summary.get("segments") or []
        if isinstance(s, dict) and s.get("phase") in HELD and s.get("attempt")
    )
    ends: dict[Any, float] = {}
    for s in held:
        ends[s["attempt"]] = max(ends.get(s["attempt"], float("-inf")), _end(s))
    out = []
    for k in range(n):
        segs = [_rank_segment(s, attempts.get(s["attempt"]), k, ends) for s in held]
        for seg, sub in zip(segs, lanes(segs), strict=True):
            seg["sub"] = min(sub, 1)
        out.append({"rank": k, "segments": segs})
    return out


def _merged(segs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The segments with an attempt's pieces at price changes joined (one run, one rect a
    rank: a long run on spot has a piece an hour)."""
    out: list[dict[str, Any]] = []
    for s in segs:
        p = out[-1] if out else None
        key = ("attempt", "capacity", "phase")
        if p is not None and all(p.get(k) == s.get(k) for k in key) and _end(p) == s.get("start_s"):
            out[-1] = {**p, "end_s": s.get("end_s")}
        else:
            out.append(s)
    return out


def _rank_segment(
    s: dict[str, Any], a: dict[str, Any] | None, k: int, ends: dict[Any, float]
) -> dict[str, Any]:
    mine = next(
        (r for r in (a or {}).get("ranks") or [] if isinstance(r, dict) and r.get("rank") == k),
        None,
    )
    if mine is not None:
        outcome, code = mine.get("outcome"), mine.get("exit_code")
    else:  # the live attempt has recorded no ranks yet; an older or bounded summary, none
        outcome, code = ("running" if a is not None and a.get("end_h") is None else None), None
    return {
        "attempt": s["attempt"],
        "capacity": s.get("capacity"),
        "phase": s.get("phase"),
        "start_s": s.get("start_s"),
        "end_s": s.get("end_s"),
        "outcome": outcome,
        "exit_code": code,
        "cause": outcome in CAUSES,
        "attempt_outcome": (a or {}).get("outcome"),
        "last": _end(s) >= ends[s["attempt"]],
    }


def _end(s: dict[str, Any]) -> float:
    return float(s.get("end_s") or s.get("start_s") or 0.0)


def plot_timeline(summary: dict[str, Any], out: Path, title: str = "spot training run") -> Path:
    """A PNG: one bar of segments (spot, on-demand, changeover, idle), preemption marks, the
    progress curve and the deadline line. Hours are market hours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    segs = summary["segments"]
    lane = lanes(segs)
    fig, (ax_bar, ax_prog) = plt.subplots(
        2, 1, figsize=(10, 4.8), sharex=True, gridspec_kw={"height_ratios": [1, 3]}
    )
    for s, k in zip(segs, lane, strict=True):
        t0, t1 = s["start_s"] / 3600, s["end_s"] / 3600
        ax_bar.barh(
            -k,
            t1 - t0,
            left=t0,
            height=0.8 if k == 0 else 0.5,
            color=color(s),
            edgecolor="white",
            linewidth=0.3,
            hatch="xx" if s.get("phase") == PROBE else ("//" if s.get("overlap") else None),
        )
        if s.get("ended_by") == "preempted":
            ax_bar.plot([t1], [0.45 - k], marker="v", color="#c92a2a", markersize=8)
            ax_prog.axvline(t1, color="#c92a2a", alpha=0.25, linewidth=1)
    ax_bar.set_yticks([])
    ax_bar.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    handles[-1] = plt.Rectangle((0, 0), 1, 1, facecolor=COLORS[("spot", PROBE)], hatch="xx")
    overlap = plt.Rectangle((0, 0), 1, 1, facecolor=COLORS[("on_demand", "running")], hatch="//")
    ax_bar.legend(
        [*handles, overlap, plt.Line2D([], [], marker="v", color="#c92a2a", linestyle="")],
        [*LABELS, OVERLAP_LABEL, "preemption"],
        ncol=4,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.05),
        frameon=False,
    )
    omitted = int(summary.get("segments_omitted") or 0)
    if omitted:  # a bounded XCom summary: draw what it holds, no line from the origin
        ax_bar.set_title(f"{title} (the first {omitted} segments are not in this summary)")
    xs, ys = ([], []) if omitted else ([0.0], [0.0])
    main = sorted((s for s, k in zip(segs, lane, strict=True) if k == 0), key=_start)
    for s in main:  # the job's own progress (a probe's capacity makes none)
        xs += [s["start_s"] / 3600, s["end_s"] / 3600]
        ys += [s["progress_start_s"] / 3600, s["progress_end_s"] / 3600]
    ax_prog.plot(xs, ys, color="#1c7ed6", label="work done (h)")
    work_h = summary["on_demand_cost"] / max(1e-9, _od_price(summary))
    deadline = summary.get("deadline_hours")
    if deadline:
        ax_prog.axvline(deadline, color="black", linestyle="--", label=f"deadline {deadline:.1f} h")
        ax_prog.plot(
            [0, deadline],
            [0, work_h],
            color="#868e96",
            linestyle=":",
            label="uniform progress line",
        )
    ax_prog.set_xlabel("hours since the job started")
    ax_prog.set_ylabel("work done (h)")
    ax_prog.grid(alpha=0.3)
    ax_prog.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _start(s: dict[str, Any]) -> float:
    return float(s.get("start_s") or 0.0)


def _od_price(summary: dict[str, Any]) -> float:
    for s in summary["segments"]:
        if s["capacity"] == "on_demand":
            return s["price_per_h"]
    return summary.get("on_demand_price", 3.06)
