"""Chaos on a real deployment, checkpoints in S3 behind a fault proxy (issue 21, deliverable 4).

    python benchmarks/chaos.py [--runs 8] [--kube-runs 2] [--seed 7] [--steps 300]
                               [--faults-per-run 3] [--s3-windows 2]

Starts what ``tests/deployment`` starts (a private PostgreSQL, ``airflow db migrate``, the
scheduler with LocalExecutor, dag-processor, triggerer and api-server, all on 127.0.0.1), and
moto's S3 server on 127.0.0.1 behind :class:`airflow_spot.testing.faults.FaultProxy`. The spot
training DAG checkpoints to ``s3://spot-chaos/ckpt/<run>``; the training process (through the
backend's ``extra_env``) and the operator (through the components' environment) reach S3 only
through the proxy. Preemptions come from a real trace (the bundled us-west-2a V100 window at
an offset drawn from ``--seed``, replayed fast). The DAG runs ``--runs`` times; during each run, at
random times, ``--faults-per-run`` process faults drawn from:

* ``kill_triggerer``: SIGKILL the triggerer's process group, start a new triggerer;
* ``kill_scheduler``: SIGKILL the scheduler's group (its LocalExecutor workers, so the task
  runner, die with it), start a new scheduler;
* ``kill_training``: SIGKILL the training process of the live attempt, wherever it is;
* ``kill_mid_checkpoint``: the proxy holds the training process's next PUT of a checkpoint
  object (a data file, or the manifest that would make the checkpoint exist); the process
  writing it is found by the held connection's port, checked to be this run's trainer and
  the checkpoint checked to have no manifest yet; then SIGKILL, and the held PUT reaches S3
  afterwards or never (a coin flip), as when a writer dies with its upload on the wire;
* ``restart_api_server``: SIGTERM the api-server, start it again;

and ``--s3-windows`` S3 fault windows of 1 to 6 s each (every new request meets the fault):

* ``s3_500``: ``500 InternalError``; ``s3_throttle``: ``503 SlowDown`` for 50 to 100 % of the
  requests; ``s3_drop``: connections reset mid-request (the server gets half of it) or
  mid-response (the client gets the head and half the body), and those in flight are cut.

A fault counts once it hit something: a live training process, a held write, at least one
request in its window. A training fault whose time comes while nothing trains (or nothing
writes a checkpoint) waits: it is tried again each second until it hits or until
``RETRY_UNTIL`` of the deadline (the end of the window fault times are drawn from) has
passed, so that the kills land on training rather than on the gaps between attempts; the
other faults due are injected first, at their time. For each run it reads the XCom
summary, the attempts' folders and the bucket (directly, not through the proxy), and
counts:

* ``misses``: a failed run, or its deadline missed (also a run the retries did not absorb);
* ``lost``: an attempt that lost more than one checkpoint interval: by the operator's ledger
  (its ``lost_s``), or by the folders: the next attempt resumed more than ``save_every``
  steps behind where it stopped, or from before a checkpoint it had saved;
* ``corrupt``: a successful run whose final model (the newest checkpoint with a manifest, in
  S3) differs from an uninterrupted run's;
* ``duplicates``: two attempts of the task training at once outside a make-before-break
  handover;
* ``orphans``: a supervisor or training process of the run still alive after it ended;
* ``missing``: an attempt folder that no ledger row accounts for (in a run that left its
  summary: a failed one is a miss already);
* ``unwatched_usd``: spot or on-demand billed past an attempt's lease, beyond the notice and
  grace it takes to stop.

Then ``--kube-runs`` runs of a DAG on the Kubernetes backend against the test cluster
(``benchmarks/chaos_kube.py``: real etcd, kube-apiserver, controller-manager, scheduler and
kwok; its binaries are built first if missing), on the same PostgreSQL, with Kubernetes API
faults (``kube_500``, ``kube_drop``) and spot nodes reclaimed as a trace says. Its counters
are folded into the same totals.

It prints one line per run, one per fault kind and last, for a machine:
``chaos: runs=N faults=M misses=.. lost=.. corrupt=.. duplicates=.. orphans=.. missing=.. unwatched_usd=..``
``$AIRFLOW_SPOT_S3_RETRY_S``, if set, reaches the training process and the operator (``0``
turns off the checkpoint store's own retries: what the S3 faults did before it had them).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "deployment"))
import conftest as deploy  # noqa: E402  (the deployment the tests start)

from airflow_spot.checkpoint import LocalStore, S3Store, Store  # noqa: E402
from airflow_spot.checkpoint.s3 import S3_RETRY_ENV  # noqa: E402
from airflow_spot.testing import train_command  # noqa: E402
from airflow_spot.testing.faults import FaultProxy, Mode, Request  # noqa: E402

DAG_ID = "spot_chaos"
PROCESS_FAULTS = (
    "kill_triggerer",
    "kill_scheduler",
    "kill_training",
    "kill_mid_checkpoint",
    "restart_api_server",
)
S3_FAULTS = ("s3_500", "s3_throttle", "s3_drop")
TRAINING_FAULTS = ("kill_training", "kill_mid_checkpoint")
# a training fault that finds nothing to hit is tried again each second until this share of
# the deadline: the end of the window its time is drawn from (no fault lands later than one
# could be drawn)
RETRY_UNTIL = 0.6
HOLD_WAIT_S = 5.0  # how long one try of kill_mid_checkpoint waits for a checkpoint write
FAULTS = PROCESS_FAULTS + S3_FAULTS
KUBE_FAULTS = ("kube_500", "kube_drop")  # benchmarks/chaos_kube.py
# A SIGKILLed scheduler takes its LocalExecutor workers, so a running try, with it. The next
# scheduler adopts the try once the dead one has been silent for the health-check threshold,
# at its next orphan check, and fails it when its heartbeats are older than the timeout. At
# Airflow's defaults that is 5 min, 3x a run's deadline here: scaled down with everything else.
HEARTBEAT_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "1",
    # a try queued by a scheduler that was SIGKILLed is checked by no one until the next
    # scheduler adopts it: it looks every 300 s by default, for schedulers silent for 30 s
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
}
COUNTERS = ("misses", "lost", "corrupt", "duplicates", "orphans", "missing", "unwatched_usd")
SAVE_EVERY = 5
STEP_S = 0.1
SCALE = 1800.0  # market seconds a wall second
BUCKET = "spot-chaos"
TRAINER = "airflow_spot.examples.train_logreg"

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
        checkpoint_uri="s3://{bucket}/ckpt/{{{{ run_id | replace(':', '_') | replace('+', '_') }}}}",
        expected_compute=timedelta(seconds={steps} * {step_s}),
        total_steps={steps},
        deadline=timedelta(seconds={deadline_s}),
        changeover=timedelta(seconds=1),
        policy="deadline_aware",
        max_failures={max_failures},
        backend=LocalBackend(trace="bundled:cant-be-late/us-west-2a_v100_1/3.json", time_scale={scale},
                             offset={offset}, work_dir={root!r} + "/runs",
                             notice_s=0.2, grace_s=2.0, extra_env={s3_env!r}),
        decision_interval=timedelta(seconds=12),
        poll_interval=0.5,
        min_deferral=timedelta(seconds=10.5),
        lease=timedelta(seconds=45),
        retries=3,
        retry_delay=timedelta(seconds=2),
    )
"""


class S3:
    """moto's S3 server on 127.0.0.1 and the fault proxy in front of it; the benchmark itself
    reads the bucket directly."""

    def __init__(self, seed: int) -> None:
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.proxy = FaultProxy((host, port), seed=seed).start()
        creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        self.client = boto3.client(
            "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1", **creds
        )
        self.client.create_bucket(Bucket=BUCKET)

    def env(self) -> dict[str, str]:
        """What the training process and the operator need to reach S3 (through the proxy)."""
        env = {
            "AWS_ENDPOINT_URL": self.proxy.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        if os.environ.get(S3_RETRY_ENV):
            env[S3_RETRY_ENV] = os.environ[S3_RETRY_ENV]
        return env

    def store(self, safe: str) -> S3Store:
        return S3Store(BUCKET, f"ckpt/{safe}", client=self.client)

    def stop(self) -> None:
        self.proxy.stop()
        self.server.stop()


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


def model_hash(where: Path | Store) -> str:
    """sha256 over the names and bytes of the newest checkpoint's files (its manifest left out)."""
    store = LocalStore(where) if isinstance(where, Path) else where
    keys = store.list("ckpt-")
    final = max((k.split("/")[0] for k in keys if k.endswith("/MANIFEST.json")), default=None)
    if final is None:
        return "no checkpoint"
    h = hashlib.sha256()
    for key in sorted(k for k in keys if k.startswith(final + "/")):
        name = key[len(final) + 1 :]
        if name != "MANIFEST.json":
            h.update(name.encode() + store.get(key))
    return h.hexdigest()


def trainers_of(run_dir: Path) -> list[int]:
    """The training processes of a run (their environment names its folder)."""
    out = subprocess.run(["pgrep", "-f", TRAINER], capture_output=True, text=True)
    pids = []
    for pid in out.stdout.split():
        with contextlib.suppress(OSError):
            if str(run_dir).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                pids.append(int(pid))
    return pids


def inject(dep: deploy.AirflowDeployment, kind: str, run_dir: Path) -> bool:
    """One process fault of ``kind``; False when there was nothing to hit (no live training)."""
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
    for pid in trainers_of(run_dir):
        subprocess.run(["kill", "-KILL", str(pid)], check=False)
        return True
    return False


def kill_mid_checkpoint(s3: S3, run_dir: Path, safe: str, rng: random.Random) -> str | None:
    """SIGKILL the training process while the proxy holds its PUT of a checkpoint object; what
    was hit (None if nothing: no trainer wrote within ``HOLD_WAIT_S``)."""
    import psutil

    manifest = rng.random() < 0.5
    prefix = f"/{BUCKET}/ckpt/{safe}/ckpt-"

    def writes(req: Request) -> bool:
        return (
            req.method == "PUT"
            and req.path.startswith(prefix)
            and req.path.endswith("/MANIFEST.json") == manifest
        )

    held = s3.proxy.hold(writes)
    req = held.wait(HOLD_WAIT_S)
    if req is None:
        held.release()  # nothing held (one arriving now goes on as usual)
        return None
    landed = rng.random() < 0.5  # does the held PUT reach S3 after the kill?
    forward = True  # (a request held by mistake goes on)
    try:
        ckpt = req.path[len(f"/{BUCKET}/ckpt/{safe}/") :].split("/")[0]
        pid = next(
            (
                p
                for p in trainers_of(run_dir)
                if any(
                    c.laddr and tuple(c.laddr)[:2] == req.client
                    for c in psutil.Process(p).net_connections(kind="tcp")
                )
            ),
            None,
        )
        if pid is None or f"{ckpt}/MANIFEST.json" in s3.store(safe).list(ckpt + "/"):
            return None  # not this run's trainer, or not mid-checkpoint: no fault
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGKILL)
        forward = landed
        psutil.wait_procs([proc], timeout=10)
        return f"{req.path.rsplit('/', 2)[-2]}/{req.path.rsplit('/', 1)[-1]} {'landed' if landed else 'lost'}"
    except psutil.Error:
        return None
    finally:
        held.release(forward=forward)


def plan_windows(rng: random.Random, n: int) -> list[tuple[float, float, str, Mode, float]]:
    """``n`` S3 fault windows, one after the other: (start after the run's, length, kind,
    proxy mode, rate)."""
    plan = []
    at = rng.uniform(5, 20)
    for _ in range(n):
        kind = rng.choice(S3_FAULTS)
        length = rng.uniform(1, 6)
        mode, rate = {
            "s3_500": (Mode.HTTP_500, 1.0),
            "s3_throttle": (Mode.THROTTLE, rng.uniform(0.5, 1.0)),
            "s3_drop": (rng.choice((Mode.DROP_REQUEST, Mode.DROP_RESPONSE)), 1.0),
        }[kind]
        plan.append((at, length, kind, mode, rate))
        at += length + rng.uniform(5, 25)
    return plan


def run_windows(
    s3: S3, plan: list, run_dir: Path, start: float, end: threading.Event, out: list
) -> None:
    """Open each planned window on the proxy (a thread runs this), once its time has come and
    a training process of the run is alive (so that its saves meet the faults), until the
    run ``end``s; (kind, start, length, requests hit) of each into ``out``."""
    for planned, length, kind, mode, rate in plan:
        if end.wait(max(0.0, start + planned - time.time())):
            return
        while not trainers_of(run_dir):
            if end.wait(0.5):
                return
        at = time.time() - start
        before = s3.proxy.hits[mode]
        s3.proxy.set(mode, rate)
        if kind == "s3_drop":
            s3.proxy.cut_open()  # and what is in flight
        end.wait(length)
        s3.proxy.set(Mode.PASS)
        out.append((kind, at, length, s3.proxy.hits[mode] - before))


def attempt_steps(run_dirs: list[Path]) -> list[tuple[int, int, int]]:
    """(resumed from, last step reported, last checkpoint saved) of each attempt that trained,
    in attempt order (from its ``attempt.log`` and ``progress.json``)."""
    out = []
    for d in sorted(run_dirs, key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
        try:
            prog = json.loads((d / "progress.json").read_text())
        except (OSError, ValueError):
            continue  # never trained (no capacity, held, killed before its first step)
        log = (
            (d / "attempt.log").read_text(errors="replace") if (d / "attempt.log").exists() else ""
        )
        found = re.search(r"Resuming from checkpoint ckpt-\d+ \(step (\d+)", log)
        resumed = int(found.group(1)) if found else 0
        out.append((resumed, int(prog["step"]), int(prog.get("checkpoint_step") or 0)))
    return out


def losses(summary: dict, run_dirs: list[Path]) -> int:
    """Attempts that lost more than one checkpoint interval: by the ledger, or by the
    folders (the next attempt resumed too far behind, or from before a saved checkpoint)."""
    interval_s = SAVE_EVERY * STEP_S * SCALE  # one checkpoint interval, market seconds
    n = sum(1 for s in summary.get("segments") or [] if s.get("lost_s", 0) > interval_s + 1e-6)
    steps = attempt_steps(run_dirs)
    for (_, reached, saved), (resumed, _, _) in zip(steps, steps[1:], strict=False):
        n += resumed < saved or reached - resumed > SAVE_EVERY
    return n


def judge(dep: deploy.AirflowDeployment, s3: S3, run_id: str, root: Path, ref: str) -> Counter:
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
    safe = run_id.replace(":", "_").replace("+", "_")
    run_dirs = [
        p for p in (root / "runs").glob(f"{DAG_ID}/{safe}/train/-1/attempt-*") if p.is_dir()
    ]
    c["lost"] += losses(summary, [p for p in run_dirs if ".leftover-" not in p.name])
    c["corrupt"] += run["state"] == "success" and model_hash(s3.store(safe)) != ref
    attempts = summary.get("attempts") or []
    spans = sorted(
        (a["start_h"], a["end_h"], a.get("handed_to"))
        for a in attempts
        if a.get("start_h") is not None and a.get("end_h") is not None
    )
    for (_, e0, handed), (s1, _, _) in zip(spans, spans[1:], strict=False):
        c["duplicates"] += s1 < e0 - 1e-6 and handed is None
    if summary:  # (a failed run leaves no summary: its ledger cannot be read here)
        c["missing"] += max(
            0, len([p for p in run_dirs if ".leftover-" not in p.name]) - len(attempts)
        )
    time.sleep(3)
    run_dir = root / "runs" / DAG_ID / safe
    left = subprocess.run(
        ["pgrep", "-f", f"{run_dir}/"], capture_output=True, text=True
    ).stdout.split()
    c["orphans"] += len(set(left) | {str(p) for p in trainers_of(run_dir)})
    c["unwatched_usd"] += unwatched_usd(run_dirs)
    return c


def unwatched_usd(run_dirs: list[Path], scale: float = SCALE, stop_s: float = 2.2) -> float:
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


def one_run(
    dep: deploy.AirflowDeployment, s3: S3, args: Any, rng: random.Random, root: Path, ref: str
) -> tuple[str, Counter, Counter, list[str]]:
    """One DAG run under faults: (its state, its counters, the faults that hit, notes)."""
    deadline_s = deadline_of(args.steps)
    run_id = dep.trigger(DAG_ID)
    safe = run_id.replace(":", "_").replace("+", "_")
    run_dir = root / "runs" / DAG_ID / safe
    start = time.time()
    kinds: Counter = Counter()
    notes: list[str] = []
    end = threading.Event()
    windows: list = []
    requests_before = sum(s3.proxy.hits.values())
    s3_thread = threading.Thread(
        target=run_windows,
        args=(s3, plan_windows(rng, args.s3_windows), run_dir, start, end, windows),
        daemon=True,
    )
    plan = sorted(rng.uniform(8, deadline_s * RETRY_UNTIL) for _ in range(args.faults_per_run))
    kinds_plan = [rng.choice(PROCESS_FAULTS) for _ in plan]
    due: list[tuple[str, float]] = []  # process faults whose time came, not yet hit
    s3_thread.start()
    try:
        while True:
            state = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed") or time.time() - start > deadline_s * 3:
                break
            if plan and time.time() - start >= plan[0]:
                due.append((kinds_plan.pop(0), plan.pop(0)))
            # the others first: a training fault's try may wait for a write (HOLD_WAIT_S)
            for kind, planned in sorted(due, key=lambda f: f[0] in TRAINING_FAULTS):
                at = time.time() - start
                if kind == "kill_mid_checkpoint":
                    hit = kill_mid_checkpoint(s3, run_dir, safe, rng)
                else:
                    hit = inject(dep, kind, run_dir)
                if not hit and at < deadline_s * RETRY_UNTIL:
                    continue  # nothing to hit yet (nothing trains, no write): the next second
                due.remove((kind, planned))
                kinds[kind] += bool(hit)
                notes.append(
                    f"{kind}@{at:.0f}s"
                    + (f" (planned @{planned:.0f}s)" if at - planned >= 2 else "")
                    + (f" ({hit})" if isinstance(hit, str) else "")
                    + ("" if hit else " missed")
                )
            time.sleep(1.0)
        notes.extend(f"{kind}@{planned:.0f}s missed (the run ended)" for kind, planned in due)
    finally:
        end.set()
        s3_thread.join(30)
        s3.proxy.set(Mode.PASS)
    for kind, at, length, requests in windows:
        kinds[kind] += requests > 0
        notes.append(f"{kind}@{at:.0f}s for {length:.0f}s: {requests} requests")
    notes.append(f"{sum(s3.proxy.hits.values()) - requests_before} S3 requests")
    return state, judge(dep, s3, run_id, root, ref), kinds, notes


def deadline_of(steps: int) -> float:
    # slack: the work again (checkpoints to S3 cost a quarter more), Airflow's own outages (a
    # killed scheduler's try is adopted in 15-20 s, three faults may come at once), 12 s looks
    return steps * STEP_S * 2 + 60


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)  # LocalBackend runs with S3 checkpoints
    ap.add_argument("--kube-runs", type=int, default=2)  # Kubernetes backend runs (0: none)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--faults-per-run", type=int, default=3)  # process (or API) faults
    ap.add_argument("--s3-windows", type=int, default=2)  # S3 fault windows a run
    args = ap.parse_args()  # the defaults: about 20 minutes on 2 cores
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="airflow-spot-chaos-"))
    ref = reference_model(root, args.steps)
    bin_dir = deploy.postgres_bin_dir()
    if bin_dir is None:
        sys.exit("chaos: PostgreSQL is not installed (apt-get install -y postgresql)")
    if args.kube_runs:  # the test cluster's binaries, built now if missing (not mid-run)
        from airflow_spot.testing.cluster.plane import ensure_binaries

        ensure_binaries()
    s3 = S3(args.seed)
    pg = deploy.PostgresServer(bin_dir, Path(tempfile.mkdtemp(prefix="airflow-spot-pg-")))
    total: Counter = Counter()
    kinds: Counter = Counter()
    dep = None
    try:
        pg.start()
        source = DAG.format(
            dag_id=DAG_ID,
            steps=args.steps,
            step_s=STEP_S,
            save_every=SAVE_EVERY,
            bucket=BUCKET,
            root=str(root),
            deadline_s=deadline_of(args.steps),
            # a SIGKILLed trainer is an application failure by design (the OOM killer's
            # signal): the default budget of 2, plus one for each process fault a run draws
            max_failures=2 + args.faults_per_run,
            offset=rng.randrange(0, 200),
            scale=SCALE,
            s3_env=s3.env(),
        )
        dep = deploy.AirflowDeployment(root / "deploy", pg.url(), {"chaos.py": source})
        dep.env.update(s3.env())  # the operator's own checkpoint reads, through the proxy
        dep.env.update(HEARTBEAT_ENV)
        dep.migrate()
        dep.start()
        dep.wait_for_dag(DAG_ID)
        for n in range(args.runs):
            t0 = time.time()
            state, got, hit, notes = one_run(dep, s3, args, rng, root, ref)
            total += got
            kinds += hit
            print(
                f"run {n + 1}: {state} in {time.time() - t0:.0f} s; faults {dict(hit) or 'none'};"
                f" {'; '.join(notes)}; {dict(+got) or 'clean'}",
                flush=True,
            )
        dep.stop()
        dep.ledger.kill_alive()
        dep = None
        if args.kube_runs:  # the same PostgreSQL, a deployment of its own
            import chaos_kube

            kube_root = root / "k8s"
            kube_root.mkdir()

            def ref_of(where: Path, steps: int) -> tuple[str, Any]:
                return reference_model(where, steps), model_hash

            got, hit = chaos_kube.run_kube_chaos(
                args.kube_runs, args.seed, args.steps, args.faults_per_run, pg,
                kube_root, ref_of,
            )  # fmt: skip
            total += Counter({k: got[k] for k in COUNTERS})
            kinds += hit
    finally:
        if dep is not None:
            dep.stop()
            dep.ledger.kill_alive()
        pg.stop()
        s3.stop()
    for kind in FAULTS + (KUBE_FAULTS if args.kube_runs else ()):
        print(f"fault {kind}: {kinds[kind]}")
    print(
        f"chaos: runs={args.runs + args.kube_runs} faults={sum(kinds.values())} "
        f"misses={total['misses']} lost={total['lost']} corrupt={total['corrupt']} "
        f"duplicates={total['duplicates']} orphans={total['orphans']} "
        f"missing={total['missing']} unwatched_usd={total['unwatched_usd']:.2f}"
    )


if __name__ == "__main__":
    main()
