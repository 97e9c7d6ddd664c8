"""Draw a run's timeline from its ledger summary: capacity segments, preemptions, progress, deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    ("spot", "running"): "#2f9e44",
    ("spot", "launching"): "#b2f2bb",
    ("on_demand", "running"): "#e8590c",
    ("on_demand", "launching"): "#ffc078",
    ("none", "idle"): "#dee2e6",
}


def plot_timeline(summary: dict[str, Any], out: Path, title: str = "spot training run") -> Path:
    """A PNG: one bar of segments (spot, on-demand, changeover, idle), preemption marks, the
    progress curve and the deadline line. Hours are market hours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    segs = summary["segments"]
    fig, (ax_bar, ax_prog) = plt.subplots(
        2, 1, figsize=(10, 4.8), sharex=True, gridspec_kw={"height_ratios": [1, 3]}
    )
    for s in segs:
        t0, t1 = s["start_s"] / 3600, s["end_s"] / 3600
        ax_bar.barh(
            0,
            t1 - t0,
            left=t0,
            color=COLORS.get((s["capacity"], s["phase"]), "#adb5bd"),
            edgecolor="white",
            linewidth=0.3,
        )
        if s["ended_by"] == "preempted":
            ax_bar.plot([t1], [0.45], marker="v", color="#c92a2a", markersize=8)
            ax_prog.axvline(t1, color="#c92a2a", alpha=0.25, linewidth=1)
    ax_bar.set_yticks([])
    ax_bar.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax_bar.legend(
        handles + [plt.Line2D([], [], marker="v", color="#c92a2a", linestyle="")],
        ["spot", "spot changeover", "on-demand", "on-demand changeover", "idle", "preemption"],
        ncol=6,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.05),
        frameon=False,
    )
    omitted = int(summary.get("segments_omitted") or 0)
    if omitted:  # a bounded XCom summary: draw what it holds, no line from the origin
        ax_bar.set_title(f"{title} (the first {omitted} segments are not in this summary)")
    xs, ys = ([], []) if omitted else ([0.0], [0.0])
    for s in segs:
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


def _od_price(summary: dict[str, Any]) -> float:
    for s in summary["segments"]:
        if s["capacity"] == "on_demand":
            return s["price_per_h"]
    return summary.get("on_demand_price", 3.06)
