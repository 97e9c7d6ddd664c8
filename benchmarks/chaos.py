"""Chaos on a real deployment (issue 21, deliverable 4; a first part: process faults only).

    python benchmarks/chaos.py [--runs 10] [--seed 7] [--steps 300]

Starts what ``tests/deployment`` starts (a private PostgreSQL, ``airflow db migrate``, the
scheduler with LocalExecutor, dag-processor, triggerer and api-server, all on 127.0.0.1) and
runs the spot training DAG ``--runs`` times. Preemptions come from a real trace (the bundled
us-west-2a V100 window, a random offset per run, replayed fast). During each run, at random
times, it injects faults drawn from:

* ``kill_triggerer``: SIGKILL the triggerer's process group, start a new triggerer;
* ``kill_scheduler``: SIGKILL the scheduler's group (its LocalExecutor workers, so the task
  runner, die with it), start a new scheduler;
* ``kill_training``: SIGKILL the training process of the live attempt (mid-step or
  mid-checkpoint: wherever it is);
* ``restart_api_server``: SIGTERM the api-server, start it again.

Not injected yet: S3 faults (500s, throttling, dropped connections through a proxy in
front of moto) and Kubernetes API faults; the runs use the local backend.

For each run it reads the XCom summary and the attempts' folders and counts: a missed
deadline or a failed run (``misses``); work lost beyond one checkpoint interval (``lost``);
a final model that differs from an uninterrupted run's (``corrupt``); two attempts of the
task training at once outside a make-before-break handover (``duplicates``); a supervisor or
training process of the run still alive after it ended (``orphans``); an attempt folder no
ledger row accounts for (``missing``); and spot or on-demand billed past an attempt's lease
(``unwatched_usd``). It prints one line per fault kind and last, for a machine:
``chaos: runs=N faults=M misses=.. lost=.. corrupt=.. duplicates=.. orphans=.. missing=.. unwatched_usd=..``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "deployment"))
import conftest as deploy  # noqa: E402  (the deployment the tests start)

from airflow_spot.testing import train_command  # noqa: E402

DAG_ID = "spot_chaos"
FAULTS = ("kill_triggerer", "kill_scheduler", "kill_training", "restart_api_server")
SAVE_EVERY = 5
STEP_S = 0.1

DAG = """
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False, params={{"offset": 0, "tag": "r0"}}) as dag:
    SpotTrainingOperator(
        task_id="train",
        command=train_command({steps}, step_seconds={step_s}, save_every={save_every}, seed=7),
        checkpoint_uri={root!r} + "/ckpt/{{{{ run_id | replace(':', '_') | replace('+', '_') }}}}",
        expected_compute=timedelta(seconds={steps} * {step_s}),
        total_steps={steps},
        deadline=timedelta(seconds={deadline_s}),
        changeover=timedelta(seconds=1),
        policy="deadline_aware",
        max_failures=2,
        backend=LocalBackend(trace="bundled:cant-be-late/us-west-2a_v100_1/3.json", time_scale=1800.0,
                             offset={offset}, work_dir={root!r} + "/runs",
                             notice_s=0.2, grace_s=2.0),
        decision_interval=timedelta(seconds=12),
        poll_interval=0.5,
        min_deferral=timedelta(seconds=10.5),
        lease=timedelta(seconds=45),
        retries=3,
        retry_delay=timedelta(seconds=2),
    )
"""


def reference_model(root: Path, steps: int) -> str:
    """The hash of the final checkpoint of an uninterrupted run (what every run must end with)."""
    ckpt = root / "reference"
    env = {"AIRFLOW_SPOT_CHECKPOINT_URI": str(ckpt)}
    subprocess.run(
        train_command(steps, step_seconds=0.0, save_every=SAVE_EVERY, seed=7),
        env={**os.environ, **env},
        check=True,
        capture_output=True,
    )
    return model_hash(ckpt)


def model_hash(ckpt: Path) -> str:
    final = sorted(p for p in ckpt.glob("ckpt-*") if (p / "MANIFEST.json").exists())[-1]
    h = hashlib.sha256()
    for f in sorted(final.iterdir()):
        if f.name != "MANIFEST.json":
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def inject(dep: deploy.AirflowDeployment, kind: str, run_dir: Path) -> bool:
    """One fault of ``kind``; False when there was nothing to hit (no live training)."""
    comp = {c.name: c for c in dep.components}
    if kind in ("kill_triggerer", "kill_scheduler"):
        c = comp["triggerer" if kind == "kill_triggerer" else "scheduler"]
        c.signal(signal.SIGKILL)
        deploy.wait_for(f"{c.name} gone", c.stopped, 30, every=0.2)
        c.start(dep.env)
        return True
    if kind == "restart_api_server":
        c = comp["api_server"]
        c.signal(signal.SIGTERM)
        deploy.wait_for("api-server stopped", c.stopped, 30, every=0.2)
        c.start(dep.env)
        deploy.wait_for("api-server back", dep.healthy, 120, every=1.0)
        return True
    out = subprocess.run(
        ["pgrep", "-f", "airflow_spot.examples.train_logreg"], capture_output=True, text=True
    )
    for pid in out.stdout.split():
        env = Path(f"/proc/{pid}/environ")
        try:
            if str(run_dir).encode() in env.read_bytes():
                subprocess.run(["kill", "-KILL", pid], check=False)
                return True
        except OSError:
            continue
    return False


def judge(dep: deploy.AirflowDeployment, run_id: str, root: Path, ref: str) -> Counter:
    c: Counter = Counter()
    run = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")
    try:
        xcom = dep.get(
            f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value"
        )
        summary = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    except Exception:  # noqa: BLE001 - no summary: the run failed
        summary = {}
    c["misses"] += run["state"] != "success" or not summary.get("deadline_met")
    interval_h = SAVE_EVERY * STEP_S * 1800.0 / 3600.0  # one checkpoint interval, market hours
    c["lost"] += (summary.get("work_lost_hours") or 0.0) > interval_h + 1e-6
    safe = run_id.replace(":", "_").replace("+", "_")
    ckpt = root / "ckpt" / safe
    c["corrupt"] += run["state"] == "success" and model_hash(ckpt) != ref
    attempts = summary.get("attempts") or []
    spans = sorted(
        (a["start_h"], a["end_h"], a.get("handed_to"))
        for a in attempts
        if a.get("start_h") is not None and a.get("end_h") is not None
    )
    for (_, e0, handed), (s1, _, _) in zip(spans, spans[1:], strict=False):
        c["duplicates"] += s1 < e0 - 1e-6 and handed is None
    run_dirs = [
        p for p in (root / "runs").glob(f"{DAG_ID}/{safe}/train/-1/attempt-*") if p.is_dir()
    ]
    c["missing"] += max(0, len([p for p in run_dirs if ".leftover-" not in p.name]) - len(attempts))
    time.sleep(3)
    left = subprocess.run(
        ["pgrep", "-f", f"{root}/runs/{DAG_ID}/{safe}/"], capture_output=True, text=True
    ).stdout.split()
    c["orphans"] += len(left)
    c["unwatched_usd"] += unwatched_usd(run_dirs)
    return c


def unwatched_usd(run_dirs: list[Path], scale: float = 1800.0, stop_s: float = 2.2) -> float:
    """Capacity billed past each attempt's lease, beyond the notice and grace (``stop_s``) it
    takes to stop by itself: wall seconds at ``scale`` market seconds each, at the
    reference prices (spot $0.9731, on-demand $3.06 an hour)."""
    usd = 0.0
    for d in run_dirs:
        try:
            until = float(json.loads((d / "LEASE").read_text())["until"])
            st = json.loads((d / "status.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
        if st.get("granted_at") is None:
            continue  # a request that never got capacity bills nothing
        ended = st.get("ended_at") or time.time()
        price = 0.9731 if st.get("capacity") == "spot" else 3.06
        usd += max(0.0, ended - until - stop_s) * scale / 3600.0 * price
    return usd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)  # about 18 minutes
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--faults-per-run", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="airflow-spot-chaos-"))
    ref = reference_model(root, args.steps)
    deadline_s = args.steps * STEP_S * 2 + 40  # slack for 12 s decisions (a quarter of it)
    bin_dir = deploy.postgres_bin_dir()
    if bin_dir is None:
        sys.exit("chaos: PostgreSQL is not installed (apt-get install -y postgresql)")
    pg = deploy.PostgresServer(bin_dir, Path(tempfile.mkdtemp(prefix="airflow-spot-pg-")))
    pg.start()
    dags = {
        "chaos.py": DAG.format(
            dag_id=DAG_ID,
            steps=args.steps,
            step_s=STEP_S,
            save_every=SAVE_EVERY,
            root=str(root),
            deadline_s=deadline_s,
            offset=rng.randrange(0, 200),
        )
    }
    dep = deploy.AirflowDeployment(root / "deploy", pg.url(), dags)
    total: Counter = Counter()
    kinds: Counter = Counter()
    try:
        dep.migrate()
        dep.start()
        dep.wait_for_dag(DAG_ID)
        for n in range(args.runs):
            run_id = dep.trigger(DAG_ID)
            safe = run_id.replace(":", "_").replace("+", "_")
            run_dir = root / "runs" / DAG_ID / safe
            start = time.time()
            plan = sorted(rng.uniform(8, deadline_s * 0.6) for _ in range(args.faults_per_run))
            while True:
                state = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
                if state in ("success", "failed"):
                    break
                if plan and time.time() - start >= plan[0]:
                    plan.pop(0)
                    kind = rng.choice(FAULTS)
                    if inject(dep, kind, run_dir):
                        kinds[kind] += 1
                if time.time() - start > deadline_s * 3:
                    break
                time.sleep(1.0)
            got = judge(dep, run_id, root, ref)
            total += got
            print(
                f"run {n + 1}: {state} in {time.time() - start:.0f} s; {dict(got) or 'clean'}",
                flush=True,
            )
    finally:
        dep.stop()
        pg.stop()
        dep.ledger.kill_alive()
    for kind in FAULTS:
        print(f"fault {kind}: {kinds[kind]}")
    faults = sum(kinds.values())
    print(
        f"chaos: runs={args.runs} faults={faults} misses={total['misses']} lost={total['lost']} "
        f"corrupt={total['corrupt']} duplicates={total['duplicates']} orphans={total['orphans']} "
        f"missing={total['missing']} unwatched_usd={total['unwatched_usd']:.2f}"
    )


if __name__ == "__main__":
    main()
