"""Draw a run's timeline from its ledger summary: capacity segments, preemptions, progress, deadline.

Segments that run at the same time as others (capacity a probe found and the job did not use;
a spot attempt launching while on-demand trains on, a make-before-break return) go on a lane
of their own below the main bar (:func:`lanes`); the UI's SVG draws the same lanes."""

from __future__ import annotations

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
