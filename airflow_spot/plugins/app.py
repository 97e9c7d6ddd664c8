"""The "Spot training" FastAPI app, mounted in Airflow's API server behind its authentication."""

from __future__ import annotations

import html
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

from airflow_spot.plugins.data import _iso, load_one, load_rows

app = FastAPI(title="Spot training", dependencies=[Depends(get_user)])
COLORS = {
    ("spot", "running"): "#2f9e44",
    ("spot", "launching"): "#b2f2bb",
    ("on_demand", "running"): "#e8590c",
    ("on_demand", "launching"): "#ffc078",
    ("none", "idle"): "#dee2e6",
}


# a task instance's state is shown only to users who may read that DAG's task instances
CAN_READ_TI = [Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))]


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
    session: SessionDep, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> dict[str, Any]:
    """The whole persisted state of one task instance: attempts, ledger, decisions."""
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
<table><thead><tr><th class="l">DAG</th><th class="l">run</th><th class="l">task</th><th class="l">state</th><th class="l">now on</th>
<th>progress</th><th class="l">deadline</th><th class="l">met</th><th>finish (h)</th><th>spot h</th><th>on-demand h</th><th>idle h</th>
<th>cost</th><th>savings</th><th>preemptions</th><th>work lost h</th><th class="l">timeline</th></tr></thead>
<tbody id="rows"></tbody></table>
<script>
const f = (x, d=2) => x == null ? "" : Number(x).toFixed(d);
const e = s => String(s ?? "").replace(/[&<>"']/g, c => "&#" + c.charCodeAt(0) + ";");
const met = x => x.deadline_met == null ? "" : (x.deadline_met ? '<span class="ok">yes</span>' : '<span class="bad">no</span>');
async function load() {
  const dag = document.getElementById("dag").value;
  const r = await fetch("api/runs" + (dag ? "?dag_id=" + encodeURIComponent(dag) : ""), {credentials: "same-origin"});
  if (!r.ok) { document.getElementById("stamp").textContent = "HTTP " + r.status; return; }
  const rows = await r.json();
  document.getElementById("rows").innerHTML = rows.map(x => `<tr>
    <td class="l">${e(x.dag_id)}</td><td class="l">${e(x.run_id)}</td><td class="l">${e(x.task_id)}</td><td class="l">${e(x.state)}</td>
    <td class="l ${x.now == "failed" || x.now.startsWith("stopped") ? "bad" : ""}">${e(x.now)}</td><td>${x.progress == null ? "" : f(x.progress, 1) + " %"}</td><td class="l">${e(x.deadline)}</td><td class="l">${met(x)}</td>
    <td>${f(x.estimated_finish_hours)}</td><td>${f(x.spot_hours)}</td><td>${f(x.on_demand_hours)}</td><td>${f(x.idle_hours)}</td>
    <td>$${f(x.cost)}</td><td class="${x.savings > 0 ? "ok" : "bad"}">${x.savings == null ? "" : f(100 * x.savings, 1) + " %"}</td><td>${Number(x.preemptions)}</td>
    <td>${f(x.work_lost_hours)}</td><td class="l"><a href="timeline?dag_id=${encodeURIComponent(x.dag_id)}&run_id=${encodeURIComponent(x.run_id)}&task_id=${encodeURIComponent(x.task_id)}&map_index=${Number(x.map_index)}">timeline</a></td></tr>`).join("");
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
    curve and the deadline line, in market hours."""
    summary = state.get("finished") or state.get("snapshot") or {}
    segs = summary.get("segments") or []
    deadline = summary.get("deadline_hours") or 1.0
    end = max([deadline] + [s["end_s"] / 3600 for s in segs])
    work = max(
        [1e-9]
        + [s["progress_end_s"] / 3600 for s in segs]
        + [summary.get("on_demand_cost", 0) / max(summary.get("on_demand_price", 3.06), 1e-9)]
    )
    x = lambda h: 40 + (width - 60) * h / end  # noqa: E731
    y = lambda w: 190 - 140 * w / work  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="220" font-size="11">',
        f'<rect x="40" y="10" width="{width - 60}" height="24" fill="#f8f9fa"/>',
    ]
    for s in segs:
        color = COLORS.get((s["capacity"], s["phase"]), "#adb5bd")
        x0, x1 = x(s["start_s"] / 3600), x(s["end_s"] / 3600)
        label = html.escape(
            f"{s['capacity']} {s['phase']} {s['start_s'] / 3600:.2f}-{s['end_s'] / 3600:.2f} h {s.get('pool') or ''} ${s.get('price_per_h', 0):.2f}/h"
        )
        parts.append(
            f'<rect class="seg {html.escape(str(s["capacity"]))} {html.escape(str(s["phase"]))}" x="{x0:.1f}" y="10" width="{max(x1 - x0, 0.5):.1f}" height="24" fill="{color}"><title>{label}</title></rect>'
        )
        if s.get("ended_by") == "preempted":
            parts.append(
                f'<path class="preemption" d="M{x1:.1f},8 l-5,-7 h10 z" fill="#c92a2a"><title>preempted at {s["end_s"] / 3600:.2f} h</title></path>'
            )
    pts = " ".join(
        f"{x(s['start_s'] / 3600):.1f},{y(s['progress_start_s'] / 3600):.1f} {x(s['end_s'] / 3600):.1f},{y(s['progress_end_s'] / 3600):.1f}"
        for s in segs
    )
    parts.append(
        f'<polyline class="progress" points="{pts}" fill="none" stroke="#1c7ed6" stroke-width="2"/>'
    )
    for a in summary.get("attempts") or []:
        if a.get("checkpoint_step_end") and a.get("end_h") is not None:
            parts.append(
                f'<circle class="checkpoint" cx="{x(a["end_h"]):.1f}" cy="42" r="3" fill="#5c7cfa"><title>checkpoint step {int(a["checkpoint_step_end"])}</title></circle>'
            )
    parts.append(
        f'<line class="deadline" x1="{x(deadline):.1f}" y1="5" x2="{x(deadline):.1f}" y2="200" stroke="black" stroke-dasharray="4 3"/>'
    )
    parts.append(f'<text x="{x(deadline) + 3:.1f}" y="205">deadline {deadline:.1f} h</text>')
    parts.append(
        f'<line x1="40" y1="190" x2="{width - 20}" y2="190" stroke="#868e96"/><text x="40" y="215">0 h</text>'
    )
    parts.append(f'<text x="{width - 60}" y="215">{end:.1f} h</text></svg>')
    return "".join(parts)


@app.get("/timeline", response_class=HTMLResponse, dependencies=CAN_READ_TI)
def timeline(
    session: SessionDep, dag_id: str, run_id: str, task_id: str, map_index: int = Query(-1)
) -> str:
    """One task instance: timeline, figures and decision log; refreshes itself while it runs."""
    state = load_one(session, dag_id, run_id, task_id, map_index)
    if state is None:
        raise HTTPException(
            404, f"no spot training state for {dag_id}/{run_id}/{task_id}[{map_index}]"
        )
    summary = state.get("finished") or state.get("snapshot") or {}
    refresh = (
        ""
        if state.get("finished") or state.get("failed")
        else '<meta http-equiv="refresh" content="5">'
    )
    log = "".join(
        f'<tr><td>{d.get("market_h", 0):.2f} h</td><td>{html.escape(d["capacity"])}</td><td class="l">{html.escape(d["reason"])}</td></tr>'
        for d in reversed(state.get("decisions") or [])
    )
    if state.get("decisions_dropped"):
        log += (
            f'<tr><td colspan="3">{int(state["decisions_dropped"])} earlier decisions not kept '
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
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{refresh}<title>Spot timeline</title>'
        "<style>body{font:13px system-ui,sans-serif;margin:16px}td{padding:2px 8px;border-bottom:1px solid #eee}</style></head><body>"
        f'<h3>{html.escape(dag_id)} / {html.escape(run_id)} / {html.escape(task_id)}</h3><p id="figures">{figures}</p>'
        f'{timeline_svg(state)}<h4>Decisions</h4><table id="decisions">{log}</table></body></html>'
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
