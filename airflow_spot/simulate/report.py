"""Tables and plots of sweep summaries."""

from __future__ import annotations

from pathlib import Path


def format_table(summary: list[dict]) -> str:
    """A plain-text table: one line per deadline, changeover and policy."""
    head = f"{'deadline':>8} {'changeover':>10} {'policy':<24} {'windows':>7} {'norm.cost':>9} {'savings':>8} {'gap/omni':>8} {'misses':>6} {'observe':>7} {'probes':>6} {'probe $':>8}"
    lines = [head, "-" * len(head)]
    for r in summary:
        gap = "" if r["gap_to_omniscient"] is None else f"{100 * r['gap_to_omniscient']:7.2f}%"
        lines.append(
            f"{r['deadline_h']:>7g}h {r['changeover_h']:>9g}h {r['policy']:<24} {r['windows']:>7} "
            f"{r['normalized_cost']:>9.4f} {100 * r['savings']:>7.2f}% {gap:>8} {r['misses']:>6} "
            f"{r.get('observe') or '-':>7} {r.get('probes', 0):>6.1f} "
            f"{r.get('probe_cost', 0.0):>8.3f}"
        )
    return "\n".join(lines)


def plot_costs(summary: list[dict], out: Path) -> None:
    """Mean normalised cost per policy against the deadline (one line per changeover)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple, list[tuple[float, float]]] = {}
    for r in summary:
        series.setdefault((r["policy"], r["changeover_h"]), []).append(
            (r["deadline_h"], r["normalized_cost"])
        )
    for (policy, co), pts in sorted(series.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{policy} (d={co:g} h)"
        )
    ax.set_xlabel("deadline (h)")
    ax.set_ylabel("cost / all on-demand cost")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
