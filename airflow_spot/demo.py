"""`make demo`: run the example training DAG on the embedded local backend and report.

Creates a SQLite Airflow DB under ``.demo/`` (once), runs the demo DAG shipped with the package
(``airflow_spot/examples/dags/spot_training_demo.py``, so an installed wheel runs it too) with
``dag.test()``, then prints the run's table and writes ``.demo/timeline.png`` (with matplotlib).
Airflow's own log goes to ``.demo/dag_test.log``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DAGS = Path(__file__).resolve().parent / "examples" / "dags"


def _setup(root: Path, dags: Path) -> None:
    os.environ["AIRFLOW_HOME"] = str(root / "airflow_home")
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW_SPOT_DEMO_DIR"] = str(root / "spot_demo")
    # the demo's checkpoints live in its own folder, outside AIRFLOW_HOME/spot_checkpoints
    os.environ["AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS"] = str(root / "spot_demo")
    if not (root / "airflow_home" / "airflow.db").exists():
        (root / "airflow_home").mkdir(parents=True, exist_ok=True)
        print("Creating the Airflow metadata DB (SQLite) under", root / "airflow_home", flush=True)
        subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _run_dag(dags: Path, log_path: Path) -> tuple[str, str]:

    spec = importlib.util.spec_from_file_location(
        "spot_training_demo", dags / "spot_training_demo.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Airflow logs a lot: keep it in a file, print only our report
    out = os.dup(1), os.dup(2)
    with open(log_path, "w") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            dr = module.dag.test()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out[0], 1)
            os.dup2(out[1], 2)
    return dr.state, dr.run_id


def _summary(run_id: str) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        row = s.scalars(
            select(XComModel).where(
                XComModel.dag_id == "spot_training_demo",
                XComModel.run_id == run_id,
                XComModel.task_id == "train",
                XComModel.key == "return_value",
            )
        ).first()
        if row is None:
            raise SystemExit("the demo run returned no summary; see .demo/dag_test.log")
        return XComModel.deserialize_value(row)


def format_report(s: dict) -> str:
    lines = [
        "",
        "Attempts (market hours since the job started):",
        f"  {'#':>2} {'capacity':<10} {'launched':>8} {'started':>8} {'ended':>8} {'steps':>11}  outcome",
    ]
    for a in s["attempts"]:
        start = "-" if a["start_h"] is None else f"{a['start_h']:.2f}"
        lines.append(
            f"  {a['attempt']:>2} {a['capacity']:<10} {a['launched_h']:>8.2f} {start:>8} {a['end_h']:>8.2f} "
            f"{a['step_start']:>5}->{a['step_end'] or a['step_start']:<5}  {a['outcome']}: {a['reason']}"
        )
    acc = (s.get("final_checkpoint") or {}).get("metrics", {}).get("accuracy")
    lines += [
        "",
        f"  policy                 {s['policy']}",
        f"  preemptions            {s['preemptions']}",
        f"  fallbacks to on-demand {s['fallbacks_to_on_demand']}   returns to spot {s['returns_to_spot']}",
        f"  spot hours             {s['spot_hours']:.2f}",
        f"  on-demand hours        {s['on_demand_hours']:.2f}",
        f"  idle hours             {s['idle_hours']:.2f}",
        f"  changeover hours       {s['changeover_hours']:.2f}   (start-up and restore, inside the spot and on-demand hours)",
        f"  work lost              {s['work_lost_hours']:.2f} h",
        f"  cost                   ${s['cost']:.2f}   (all on-demand ${s['on_demand_cost']:.2f})",
        f"  savings                {100 * s['savings']:.1f} %",
        f"  finished / deadline    {s['finished_hours']:.2f} h / {s['deadline_hours']:.2f} h   deadline met: {s['deadline_met']}",
        f"  final model accuracy   {acc if acc is None else f'{acc:.4f}'}   ({(s.get('final_checkpoint') or {}).get('uri')})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(".demo"))
    ap.add_argument(
        "--dags",
        type=Path,
        default=DAGS,
        help="folder holding spot_training_demo.py (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    root, dags = args.root.resolve(), args.dags.resolve()
    if not (dags / "spot_training_demo.py").exists():
        raise SystemExit(f"--dags: {dags} holds no spot_training_demo.py")
    t0 = time.time()
    _setup(root, dags)
    print(
        f"Running {dags / 'spot_training_demo.py'} with dag.test() "
        f"(Airflow log: {root / 'dag_test.log'}) ...",
        flush=True,
    )
    state, run_id = _run_dag(dags, root / "dag_test.log")
    summary = _summary(run_id)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"DAG run {run_id}: {state} in {time.time() - t0:.0f} s")
    print(format_report(summary))
    if importlib.util.find_spec("matplotlib") is None:
        timeline = "not drawn: it needs matplotlib (pip install 'airflow-provider-spot[plot]')"
    else:
        from airflow_spot.timeline import plot_timeline

        title = f"spot_training_demo {run_id}"
        timeline = str(plot_timeline(summary, root / "timeline.png", title=title))
    print(f"\nTimeline: {timeline}\nSummary JSON: {root / 'summary.json'}")
    return 0 if state == "success" else 1


if __name__ == "__main__":
    raise SystemExit(main())
