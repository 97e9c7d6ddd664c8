"""A gang's rank lanes on the Spot timeline's SVG: one lane a rank (rank 0..N-1) under the
job's bar. Each lane shows the segments in which an attempt held that rank's node, in the
bar's colours, and how the rank ended in each attempt: a red mark where its node was taken
(the gang's preemption) or lost, a grey square where it was stopped with the gang, a red cross where
it failed first (the gang's app failure); the rank whose end was the gang's verdict is
outlined in red. The data is :func:`airflow_spot.timeline.rank_lanes`'s (the API returns it)."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from airflow_spot.timeline import NODE_LOST, color

RANK_H = 12  # pixels a rank's lane, up to 16 ranks; a bigger gang's lanes get thinner
GAP = 6  # between the lanes above and rank 0's
LEGEND_ROW = 16  # the rank marks' legend row, under the main legend
RED, GREY = "#c92a2a", "#495057"


def lane_height(n: int) -> int:
    """Pixels a lane for a gang of ``n`` (12 up to 16 ranks; 192 px in all above, 3 at least)."""
    return RANK_H if n <= 16 else max(3, 192 // n)


def block_height(n: int) -> int:
    """Pixels the rank lanes of a gang of ``n`` take (0 for one node: nothing is drawn)."""
    return 0 if n <= 1 else GAP + n * lane_height(n)


def ranks_svg(
    ranks: list[dict[str, Any]], x: Callable[[float], float], top: float, width: int
) -> str:
    """The lanes, from ``top`` down (``x``: market hours to pixels)."""
    h = lane_height(len(ranks))
    every = math.ceil(11 / h)  # label as many lanes as 9 px text fits beside
    last = len(ranks) - 1  # always labelled; a regular label too close to it is not
    out = ['<g class="ranks" font-size="9">']
    for lane in ranks:
        k = int(lane["rank"])
        y0 = top + GAP + k * h
        out.append(
            f'<rect class="rank-lane" x="40" y="{y0:.1f}" width="{width - 60}" '
            f'height="{h - 1}" fill="#f8f9fa"/>'
        )
        if k == last or (k % every == 0 and last - k >= every):
            name = f"rank {k}" if last < 100 else str(k)  # fits left of the lanes
            out.append(
                f'<text class="rank-label" x="38" y="{y0 + min(h, 11) - 2:.1f}" '
                f'text-anchor="end">{name}</text>'
            )
        for s in lane["segments"]:
            out.append(_segment(s, k, x, y0, h))
    out.append("</g>")
    return "".join(out)


def _segment(s: dict[str, Any], k: int, x: Callable[[float], float], y0: float, h: int) -> str:
    """One rank's segment (a make-before-break's second one in the lane's lower half), and its
    end mark where it is the attempt's last."""
    t0, t1 = _hours(s.get("start_s")), _hours(s.get("end_s"))
    x0, x1 = x(t0), x(t1)
    tall = (h - 1) / (2 if s.get("sub") else 1)
    top = y0 + (h - 1 - tall)
    cap, phase = str(s.get("capacity")), str(s.get("phase"))
    label = html.escape(
        f"rank {k}, attempt {s.get('attempt')}: {cap} {phase} {t0:.2f}-{t1:.2f} h; {end_text(s)}"
    )
    classes = html.escape(f"rank-seg {cap} {phase}" + (" cause" if s.get("cause") else ""))
    outline = f' stroke="{RED}" stroke-width="1.5"' if s.get("cause") else ""
    out = (
        f'<rect class="{classes}" data-rank="{k}" x="{x0:.1f}" y="{top:.1f}" '
        f'width="{max(x1 - x0, 0.5):.1f}" height="{tall:.1f}" fill="{color(s)}"{outline}>'
        f"<title>{label}</title></rect>"
    )
    return out + (_end_mark(s, k, x1, top, tall, label) if s.get("last") else "")


def _end_mark(s: dict[str, Any], k: int, at: float, top: float, tall: float, label: str) -> str:
    """Where the rank's attempt ended: node taken, stopped with the gang, failed first."""
    m, cy, outcome = max(3.0, min(tall, 8.0)), top + tall / 2, s.get("outcome")
    head = f'data-rank="{k}" data-attempt="{html.escape(str(s.get("attempt")))}"'
    title = f"<title>{label}</title>"
    if outcome in NODE_LOST:
        return (
            f'<path class="rank-end {outcome}" {head} d="M{at - m / 2:.1f},{top:.1f} '
            f'h{m:.1f} l{-m / 2:.1f},{m:.1f} z" fill="{RED}">{title}</path>'
        )
    if outcome == "stopped":
        return (
            f'<rect class="rank-end stopped" {head} x="{at - m / 2:.1f}" y="{cy - m / 2:.1f}" '
            f'width="{m:.1f}" height="{m:.1f}" fill="{GREY}">{title}</rect>'
        )
    if outcome == "failed":
        return (
            f'<path class="rank-end failed" {head} d="M{at - m / 2:.1f},{cy - m / 2:.1f} '
            f'l{m:.1f},{m:.1f} m0,{-m:.1f} l{-m:.1f},{m:.1f}" stroke="{RED}" '
            f'stroke-width="2">{title}</path>'
        )
    return ""  # finished, running, not recorded: the segment's own tooltip says it


def end_text(s: dict[str, Any]) -> str:
    """How the rank ended in the segment's attempt, in words."""
    outcome, code = s.get("outcome"), s.get("exit_code")
    exit_ = "" if code is None else f" (exit {code})"
    if outcome == "preempted":
        return "its node was taken: the gang was preempted"
    if outcome in NODE_LOST:
        return f"its node was lost ({str(outcome).replace('_', ' ')}): the gang was stopped"
    if outcome == "pending":
        return "never started (pending)"
    if outcome == "stopped":
        return f"stopped with the gang{exit_}"
    if outcome == "failed":
        why = str(s.get("attempt_outcome") or "app_failure").replace("_", " ")
        return f"failed first{exit_}: the gang's {why}"
    if outcome == "succeeded":
        return f"finished{exit_}"
    if outcome == "running":
        return "running"
    return "end not recorded" if outcome is None else f"ended: {outcome}{exit_}"


def ranks_legend(top: float) -> str:
    """The rank marks' legend row."""
    out, cx = ['<g class="rank-legend" font-size="10">'], 40.0
    items = [
        (
            f'<path d="M{{cx:.0f}},{top - 8:.0f} h8 l-4,8 z" fill="{RED}"/>',
            "rank's node taken or lost (outlined: the gang's cause)",
        ),
        (
            f'<rect x="{{cx:.0f}}" y="{top - 7:.0f}" width="7" height="7" fill="{GREY}"/>',
            "rank stopped with the gang",
        ),
        (
            f'<path d="M{{cx:.0f}},{top - 8:.0f} l7,7 m0,-7 l-7,7" stroke="{RED}" '
            'stroke-width="2"/>',
            "rank failed first: app failure (outlined)",
        ),
    ]
    for mark, text in items:
        out.append(mark.format(cx=cx))
        out.append(f'<text x="{cx + 12:.0f}" y="{top:.0f}">{html.escape(text)}</text>')
        cx += 24 + 6.2 * len(text)
    out.append("</g>")
    return "".join(out)


def _hours(v: object) -> float:
    return float(v) / 3600 if isinstance(v, (int, float)) else 0.0
