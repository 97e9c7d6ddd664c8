"""The "Spot training" FastAPI app, mounted in Airflow's API server behind its authentication."""

from __future__ import annotations

import html
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from pydantic import BeforeValidator

from airflow_spot.plugins.data import _iso, load_one, load_rows, signal_text
from airflow_spot.plugins.ranks import LEGEND_ROW, block_height, ranks_legend, ranks_svg
from airflow_spot.timeline import (
    COLORS,
    LABELS,
    NODE_LOST,
    OVERLAP_LABEL,
    PROBE,
    color,
    gang_size,
    lanes,
    rank_lanes,
)

app = FastAPI(title="Spot training", dependencies=[Depends(get_user)])


# a task instance's state is shown only to users who may read that DAG's task instances
CAN_READ_TI = [Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))]

# what a task instance that is not mapped arrives with: Airflow's UI fills ``{MAP_INDEX}`` in
# a tab's URL only for a mapped task instance, and sends the placeholder itself otherwise
NOT_MAPPED = ("", "-1", "{MAP_INDEX}")


def parse_map_index(value: object) -> int:
    """A query's ``map_index``: -1 (not mapped) for ``-1``, an empty value or the literal
    ``{MAP_INDEX}``; the index for an integer >= 0. Anything else is refused with an error
    that names the field and what it accepts (FastAPI answers 422)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= -1:
        return value
    text = str(value).strip()
    if text in NOT_MAPPED:
        return -1
    if text.isascii() and text.isdigit():
        return int(text)
    raise ValueError(
        f"map_index must be an integer >= 0 for a mapped task instance, or -1, empty or "
        f"{{MAP_INDEX}} for one that is not mapped; got {text!r}"
    )


MapIndex = Annotated[int, BeforeValidator(parse_map_index)]


@app.get("/api/runs")
def runs(session: SessionDep, user: GetUserDep, dag_id: str | None = None) -> list[dict[str, Any]]:
    """One row per spot training task instance the user may read, newest first (``dag_id``
    filters)."""
    rows = load_rows(session, dag_id)
    am = get_auth_manager()
    allowed = {  # the same check as a run's state and timeline: read its task instances
        d
        for d in {r["dag_id"] for r in rows}
        if am.is_authorized_dag(
            method="GET",
            access_entity=DagAccessEntity.TASK_INSTANCE,
            details=DagDetails(id=d),
            user=user,
        )
    }
    return [r for r in rows if r["dag_id"] in allowed]


@app.get("/api/run", dependencies=CAN_READ_TI)
def run(
    session: SessionDep, dag_id: str, run_id: str, task_id: str, map_index: MapIndex = -1
) -> dict[str, Any]:
    """The whole persisted state of one task instance: attempts, ledger, decisions."""
    return _state(session, dag_id, run_id, task_id, map_index)


@app.get("/api/timeline", dependencies=CAN_READ_TI)
def timeline_data(
    session: SessionDep, dag_id: str, run_id: str, task_id: str, map_index: MapIndex = -1
) -> dict[str, Any]:
    """What the timeline draws, as data: ``nodes`` (the gang's size, 1 for one node), each
    segment with its ``lane`` (0 the main bar, 1.. the lanes below it), and ``ranks``: for a
    gang one lane a rank, rank 0..N-1, with its segments and how it ended in each attempt
    (:func:`airflow_spot.timeline.rank_lanes`); empty for one node."""
    state = _state(session, dag_id, run_id, task_id, map_index)
    summary = state.get("finished") or state.get("snapshot") or {}
    segs = [s for s in summary.get("segments") or [] if isinstance(s, dict)]
    return {
        "nodes": gang_size(summary),
        "segments": [{**s, "lane": k} for s, k in zip(segs, lanes(segs), strict=True)],
        "ranks": rank_lanes(summary),
    }


def _state(
    session: SessionDep, dag_id: str, run_id: str, task_id: str, map_index: int
) -> dict[str, Any]:
    state = load_one(session, dag_id, run_id, task_id, map_index)
    if state is None:
        raise HTTPException(
            404, f"no spot training state for {dag_id}/{run_id}/{task_id}[{map_index}]"
        )
    return state


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Spot training</title>
<style>body{font:13px system-ui,sans-serif;margin:16px}table{border-collapse:collapse;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #ddd;text-align:right}th{background:#f1f3f5}
td.l,th.l{text-align:left}.ok{color:#2b8a3e}.bad{color:#c92a2a}</style></head><body>
<h2>Spot training</h2><label>DAG <input id="dag" placeholder="all DAGs" value="__DAG__"></label>
<span id="stamp" style="margin-left:12px;color:#868e96"></span>
<table><thead><tr><th class="l">DAG</th><th class="l">run</th><th class="l">task</th><th class="map">map index</th><th class="l">state</th><th class="l">now on</th>
<th>progress</th><th class="l">deadline</th><th class="l">met</th><th>finish (h)</th><th>spot h</th><th>on-demand h</th><th>idle h</th>
<th>cost</th><th>savings</th><th>preemptions</th><th>work lost h</th><th class="l">spot</th><th>probes</th><th>overlap h</th><th class="l">timeline</th></tr></thead>
<tbody id="rows"></tbody></table>
<script>
const f = (x, d=2) => x == null ? "" : Number(x).toFixed(d);
const e = s => String(s ?? "").replace(/[&<>"']/g, c => "&#" + c.charCodeAt(0) + ";");
const mi = x => Number.isInteger(x.map_index) && x.map_index >= 0 ? String(x.map_index) : "-";
const gang = x => x.nodes > 1 ? ` <span class="gang">(gang of ${Number(x.nodes)})</span>` : "";
const met = x => x.deadline_met == null ? "" : (x.deadline_met ? '<span class="ok">yes</span>' : '<span class="bad">no</span>');
async function load() {
  const dag = document.getElementById("dag").value;
  const r = await fetch("api/runs" + (dag ? "?dag_id=" + encodeURIComponent(dag) : ""), {credentials: "same-origin"});
  if (!r.ok) { document.getElementById("stamp").textContent = "HTTP " + r.status; return; }
  const rows = await r.json();
  document.getElementById("rows").innerHTML = rows.map(x => `<tr>
    <td class="l">${e(x.dag_id)}</td><td class="l">${e(x.run_id)}</td><td class="l">${e(x.task_id)}${gang(x)}</td><td class="map">${mi(x)}</td><td class="l">${e(x.state)}</td>
    <td class="l ${x.now == "failed" || x.now.startsWith("stopped") ? "bad" : ""}">${e(x.now)}</td><td>${x.progress == null ? "" : f(x.progress, 1) + " %"}</td><td class="l">${e(x.deadline)}</td><td class="l">${met(x)}</td>
    <td>${f(x.estimated_finish_hours)}</td><td>${f(x.spot_hours)}</td><td>${f(x.on_demand_hours)}</td><td>${f(x.idle_hours)}</td>
    <td>$${f(x.cost)}</td><td class="${x.savings > 0 ? "ok" : "bad"}">${x.savings == null ? "" : f(100 * x.savings, 1) + " %"}</td><td>${Number(x.preemptions)}</td>
    <td>${f(x.work_lost_hours)}</td><td class="l spot">${e(x.spot)}</td><td class="probes">${Number(x.probes || 0)}${x.probes ? " ($" + f(x.probe_cost) + ")" : ""}</td><td>${f(x.overlap_hours)}</td><td class="l"><a href="timeline?dag_id=${encodeURIComponent(x.dag_id)}&run_id=${encodeURIComponent(x.run_id)}&task_id=${encodeURIComponent(x.task_id)}&map_index=${Number(x.map_index)}">timeline</a></td></tr>`).join("");
  document.getElementById("stamp").textContent = rows.length + " task instances, updated " + new Date().toLocaleTimeString();
}
load(); setInterval(load, 5000); document.getElementById("dag").addEventListener("change", load);
</script></body></html>"""


@app.get("/page", response_class=HTMLResponse)
def page(dag_id: str = "") -> str:
    """The "Spot training" page: the table, refreshed every 5 s without a reload."""
    return PAGE.replace("__DAG__", html.escape(dag_id, quote=True))


def timeline_svg(state: dict[str, Any], width: int = 900) -> str:
    """Segments (spot, on-demand, changeover, idle), preemption marks, checkpoints, the progress
    curve and the deadline line, in market hours. Segments at the same time as the main bar's
    (capacity a probe found and did not use, a spot attempt launching while on-demand trains
    on) get lanes below it; on-demand's make-before-break overlap is hatched; a gang's ranks get
    a lane each under those (:mod:`.ranks`); a legend ends it."""
    summary = state.get("finished") or state.get("snapshot") or {}
    segs = [s for s in summary.get("segments") or [] if isinstance(s, dict)]
    lane = lanes(segs)
    ranks = rank_lanes(summary)
    below = 34 + LANE_H * max(lane, default=0)  # the bottom of the lanes below the main bar
    extra = below - 34 + block_height(len(ranks))  # room for those lanes and the ranks'
    deadline = summary.get("deadline_hours") or 1.0
    end = max([deadline] + [_h(s, "end_s") for s in segs])
    work = max(
        [1e-9]
        + [_h(s, "progress_end_s") for s in segs]
        + [summary.get("on_demand_cost", 0) / max(summary.get("on_demand_price", 3.06), 1e-9)]
    )
    x = lambda h: 40 + (width - 60) * h / end  # noqa: E731
    y = lambda w: 190 + extra - 140 * w / work  # noqa: E731
    height = 240 + extra + (LEGEND_ROW if ranks else 0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" font-size="11">',
        "<defs>"
        '<pattern id="hatch-probe" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#5f3dc4" '
        'stroke-width="2"/></pattern>'
        '<pattern id="hatch-overlap" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(-45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#495057" '
        'stroke-width="1.5"/></pattern></defs>',
        f'<rect x="40" y="10" width="{width - 60}" height="24" fill="#f8f9fa"/>',
    ]
    for s, k in zip(segs, lane, strict=True):
        cap, phase = str(s.get("capacity")), str(s.get("phase"))
        x0, x1 = x(_h(s, "start_s")), x(_h(s, "end_s"))
        top, tall = (10, 24) if k == 0 else (36 + LANE_H * (k - 1), LANE_H - 2)
        w = max(x1 - x0, 0.5)
        price = s.get("price_per_h") or 0
        what = (
            "probe (found, not used)"
            if phase == PROBE
            else f"{cap} {phase}" + (" (make-before-break overlap)" if s.get("overlap") else "")
        )
        label = html.escape(
            f"{what} {_h(s, 'start_s'):.2f}-{_h(s, 'end_s'):.2f} h {s.get('pool') or ''} "
            f"${float(price):.2f}/h"
        )
        classes = html.escape(f"seg {cap} {phase}" + (" overlap" if s.get("overlap") else ""))
        parts.append(
            f'<rect class="{classes}" x="{x0:.1f}" y="{top}" width="{w:.1f}" height="{tall}" '
            f'fill="{color(s)}"><title>{label}</title></rect>'
        )
        if phase == PROBE or s.get("overlap"):
            hatch = "hatch-probe" if phase == PROBE else "hatch-overlap"
            parts.append(
                f'<rect class="{hatch}" x="{x0:.1f}" y="{top}" width="{w:.1f}" height="{tall}" '
                f'fill="url(#{hatch})" pointer-events="none"/>'
            )
        if s.get("ended_by") == "preempted":
            parts.append(
                f'<path class="preemption" d="M{x1:.1f},{top - 2} l-5,-7 h10 z" fill="#c92a2a">'
                f"<title>preempted at {_h(s, 'end_s'):.2f} h{_taken(summary, s)}</title></path>"
            )
    if ranks:
        parts.append(ranks_svg(ranks, x, below, width))
    main = sorted((s for s, k in zip(segs, lane, strict=True) if k == 0), key=_start)
    pts = " ".join(  # the job's own progress (a probe's capacity makes none)
        f"{x(_h(s, 'start_s')):.1f},{y(_h(s, 'progress_start_s')):.1f} "
        f"{x(_h(s, 'end_s')):.1f},{y(_h(s, 'progress_end_s')):.1f}"
        for s in main
    )
    parts.append(
        f'<polyline class="progress" points="{pts}" fill="none" stroke="#1c7ed6" stroke-width="2"/>'
    )
    for a in summary.get("attempts") or []:
        if a.get("checkpoint_step_end") and a.get("end_h") is not None:
            parts.append(
                f'<circle class="checkpoint" cx="{x(a["end_h"]):.1f}" cy="{42 + extra}" r="3" '
                f'fill="#5c7cfa"><title>checkpoint step {int(a["checkpoint_step_end"])}</title></circle>'
            )
    parts.append(
        f'<line class="deadline" x1="{x(deadline):.1f}" y1="5" x2="{x(deadline):.1f}" y2="{200 + extra}" stroke="black" stroke-dasharray="4 3"/>'
    )
    text = f"deadline {deadline:.1f} h"
    at, anchor = beside(x(deadline), text, width)
    parts.append(
        f'<text class="deadline-label" x="{at:.1f}" y="{205 + extra}" text-anchor="{anchor}">'
        f"{text}</text>"
    )
    parts.append(
        f'<line x1="40" y1="{190 + extra}" x2="{width - 20}" y2="{190 + extra}" stroke="#868e96"/>'
        f'<text x="40" y="{215 + extra}">0 h</text>'
    )
    parts.append(f'<text x="{width - 20}" y="{215 + extra}" text-anchor="end">{end:.1f} h</text>')
    parts.append(_legend(230 + extra))
    if ranks:
        parts.append(ranks_legend(230 + extra + LEGEND_ROW))
    parts.append("</svg>")
    return "".join(parts)


LANE_H = 12  # pixels per lane below the main bar
EM = 0.62  # a character's width, in font sizes: on the wide side of system-ui's digits and letters


def text_width(text: str, font_px: float = 11) -> float:
    """About how wide ``text`` draws, in pixels (an estimate: the SVG has no text metrics)."""
    return EM * font_px * len(text)


def beside(at: float, text: str, width: int, font_px: float = 11) -> tuple[float, str]:
    """Where a label of a vertical line at ``at`` goes, and its ``text-anchor``: just right of
    the line, or just left of it where it would run past the SVG's right edge."""
    if at + 3 + text_width(text, font_px) <= width:
        return at + 3, "start"
    return at - 3, "end"


def _legend(top: int) -> str:
    """One row: each colour, the two hatches and the preemption mark, with their names."""
    items: list[tuple[str, str | None, str]] = [
        (c, None, label) for c, label in zip(COLORS.values(), LABELS, strict=True)
    ]
    items[-1] = (COLORS[("spot", PROBE)], "hatch-probe", LABELS[-1])
    items.append((COLORS[("on_demand", "running")], "hatch-overlap", OVERLAP_LABEL))
    out, cx = ['<g class="legend" font-size="10">'], 40.0
    for fill, hatch, label in items:
        out.append(f'<rect x="{cx:.0f}" y="{top - 9}" width="12" height="10" fill="{fill}"/>')
        if hatch:
            out.append(
                f'<rect x="{cx:.0f}" y="{top - 9}" width="12" height="10" fill="url(#{hatch})"/>'
            )
        out.append(f'<text x="{cx + 15:.0f}" y="{top}">{html.escape(label)}</text>')
        cx += 20 + text_width(label, 10)
    out.append(
        f'<path d="M{cx + 5:.0f},{top} l-5,-8 h10 z" fill="#c92a2a"/>'
        f'<text x="{cx + 14:.0f}" y="{top}">preemption</text></g>'
    )
    return "".join(out)


def _taken(summary: dict[str, Any], seg: dict[str, Any]) -> str:
    """A gang's preemption mark says whose nodes were taken ("" for one node)."""
    a: dict[str, Any] = next(
        (a for a in summary.get("attempts") or [] if a.get("attempt") == seg.get("attempt")), {}
    )
    taken = [r.get("rank") for r in a.get("ranks") or [] if r.get("outcome") in NODE_LOST]
    if len(taken) == 1:
        return f": rank {taken[0]} lost its node"
    return f": ranks {', '.join(map(str, taken))} lost their nodes" if taken else ""


def _h(s: dict[str, Any], key: str) -> float:
    """A segment's time (seconds) in hours (0 where a stored segment lacks it)."""
    v = s.get(key)
    return float(v) / 3600 if isinstance(v, (int, float)) else 0.0


def _start(s: dict[str, Any]) -> float:
    return _h(s, "start_s")


@app.get("/timeline", response_class=HTMLResponse, dependencies=CAN_READ_TI)
def timeline(
    session: SessionDep, dag_id: str, run_id: str, task_id: str, map_index: MapIndex = -1
) -> str:
    """One task instance: timeline, figures and decision log; refreshes itself while it runs."""
    state = _state(session, dag_id, run_id, task_id, map_index)
    summary = state.get("finished") or state.get("snapshot") or {}
    refresh = (
        ""
        if state.get("finished") or state.get("failed")
        else '<meta http-equiv="refresh" content="5">'
    )
    log = (
        '<tr><th>market h</th><th>capacity</th><th class="l">spot</th><th class="l">reason</th></tr>'
        + "".join(
            f"<tr><td>{float(d.get('market_h') or 0):.2f} h</td>"
            f"<td>{html.escape(str(d.get('capacity') or ''))}</td>"
            f'<td class="l spot">{html.escape(str(d.get("spot") or ""))}</td>'
            f'<td class="l">{html.escape(str(d.get("reason") or ""))}</td></tr>'
            for d in reversed(state.get("decisions") or [])
        )
    )
    if state.get("decisions_dropped"):
        log += (
            f'<tr><td colspan="4">{int(state["decisions_dropped"])} earlier decisions not kept '
            f"(the log keeps the last {len(state.get('decisions') or [])})</td></tr>"
        )
    figures = (
        f"cost <b>${summary.get('cost', 0):.2f}</b> vs ${summary.get('on_demand_cost', 0):.2f} all on-demand "
        f"(savings <b>{_pct(summary.get('savings'))}</b>), spot {summary.get('spot_hours', 0):.2f} h, "
        f"on-demand {summary.get('on_demand_hours', 0):.2f} h, idle {summary.get('idle_hours', 0):.2f} h, "
        f"preemptions <b>{int(state.get('preemptions') or 0)}</b>, work lost {summary.get('work_lost_hours', 0):.2f} h, "
        f"deadline {html.escape(_iso(state.get('deadline_at')) or '?')}: "
        + _verdict(state, summary)
    )
    spot = _spot_figures(state, summary) + _gang_figures(summary)
    mapped = f" [{map_index}]" if map_index >= 0 else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{refresh}<title>Spot timeline</title>'
        "<style>body{font:13px system-ui,sans-serif;margin:16px}td{padding:2px 8px;border-bottom:1px solid #eee}th.l{text-align:left}</style></head><body>"
        f"<h3>{html.escape(dag_id)} / {html.escape(run_id)} / {html.escape(task_id)}{mapped}</h3>"
        f'<p id="figures">{figures}</p>'
        f'<p id="spot">{spot}</p>{timeline_svg(state)}<h4>Decisions</h4><table id="decisions">{log}</table></body></html>'
    )


def _spot_figures(state: dict[str, Any], summary: dict[str, Any]) -> str:
    """What is known of spot, the probes and the make-before-break overlap (HTML, escaped)."""
    live = not state.get("finished") and not state.get("failed")
    text = signal_text(summary.get("spot_signal"), probing=live and bool(state.get("probe")))
    observe = summary.get("observe") or state.get("observe") or ""
    probes = summary.get("probes", state.get("probes"))
    out = [f"spot <b>{html.escape(text or 'not recorded')}</b>"]
    if observe:
        out[0] += f" (observed: {html.escape(str(observe))})"
    out.append(f"probes <b>{int(probes or 0)}</b> (${float(summary.get('probe_cost') or 0):.2f})")
    out.append(f"make-before-break overlap {float(summary.get('overlap_hours') or 0):.2f} h")
    return ", ".join(out)


def _gang_figures(summary: dict[str, Any]) -> str:
    """A gang's size and node-hours (the hours above are the gang's, each billed per node)."""
    n = gang_size(summary)
    if n <= 1:
        return ""
    hours = summary.get("node_hours") or {}
    return (
        f", gang of <b>{n}</b> ranks (a lane each below the bar), node-hours: spot "
        f"{float(hours.get('spot') or 0):.2f}, on-demand {float(hours.get('on_demand') or 0):.2f}"
    )


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def _verdict(state: dict, summary: dict) -> str:
    if state.get("failed"):
        f = state["failed"]
        return (
            f"<b>failed</b> ({html.escape(str(f.get('error')))}: "
            f"{html.escape(str(f.get('message')))}), not met"
        )
    if state.get("finished"):
        met = summary.get("deadline_met")
        fin = summary.get("finished_hours")
        at = f" (finished at {fin:.2f} h)" if isinstance(fin, (int, float)) else ""
        return f"<b>{'met' if met else 'missed'}</b>{at}"
    est = summary.get("estimated_finish_hours")
    return "running" + (f", estimated finish {est:.2f} h" if isinstance(est, (int, float)) else "")
