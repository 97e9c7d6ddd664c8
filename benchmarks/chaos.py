"""Chaos on a real deployment, checkpoints in S3 behind a fault proxy (issue 21, deliverable 4;
the orchestration's own faults: issue 34).

    python benchmarks/chaos.py [--runs 8] [--kube-runs 2] [--seed 7] [--steps 300]
                               [--faults-per-run 3] [--s3-windows 2]

Starts what ``tests/deployment`` starts for a CeleryExecutor deployment (a private PostgreSQL,
``airflow db migrate``, a private Redis as the broker, the scheduler, dag-processor, triggerer,
api-server and two Celery workers, all on 127.0.0.1), with the settings the README recommends
for production (:data:`airflow_spot.production.WORKER_SETTINGS`), every component under an
emulated supervisor (``benchmarks/chaos_deploy.py``: systemd's ``Restart=always``, 5 s after
a component exits); and moto's S3 server on 127.0.0.1 behind
:class:`airflow_spot.testing.faults.FaultProxy`. The spot training DAG checkpoints to
``s3://spot-chaos/ckpt/<run>``; the training process (through the backend's ``extra_env``)
and the operator (through the components' environment) reach S3 only through the proxy.
Preemptions come from a real trace (the bundled us-west-2a V100 window at an offset drawn from
``--seed``, replayed fast). The task keeps the operator's default ``retries`` (3) and
``retry_delay`` (Airflow's ``[core] default_task_retry_delay``, scaled down to 10 s here with
the other timeouts below). The DAG runs ``--runs`` times; each run draws ``--faults-per-run``
process faults, at random times, from a deck that holds each kind once (shuffled from
``--seed``, dealt across the runs, shuffled again once used up), so that every kind comes up:

* ``kill_triggerer``: SIGKILL the triggerer's process group (the supervisor starts it again);
* ``kill_scheduler``: SIGKILL the scheduler's process group (likewise);
* ``kill_training``: SIGKILL the training process of the live attempt, wherever it is;
* ``kill_mid_checkpoint``: the proxy holds the training process's next PUT of a checkpoint
  object (a data file, or the manifest that would make the checkpoint exist); the process
  writing it is found by the held connection's port, checked to be this run's trainer and
  the checkpoint checked to have no manifest yet; then SIGKILL, and the held PUT reaches S3
  afterwards or never (a coin flip), as when a writer dies with its upload on the wire;
* ``restart_api_server``: SIGTERM the api-server, start it again at once;
* ``api_server_down``: the api-server held down 30 to 90 s while the task's trigger fires
  (hit: the trigger fired while it was down);
* ``redis_restart``: Redis held down 15 to 40 s, started again empty (hit: the trigger fired
  meanwhile, so the scheduler had a try to send through it);
* ``postgres_restart``: PostgreSQL stopped (fast), 5 to 20 s down, started again; what exits
  meanwhile the supervisor starts again (hit: the task instance was live);
* ``last_try_before_code``: the run is of a DAG whose task has ``retries=0`` (its first try
  is its last) and whose spot never goes away (so that its attempt still trains); when the
  trigger fires while the attempt trains, the worker that starts the resumed try is SIGKILLed
  as soon as the try is ``running``, and Airflow fails the task instance for good without
  operator code (hit: it failed). Such a run fails by design: it is no miss; what the
  counters look at is that nothing trains on unwatched and the ledger holds every attempt;
* ``clock_skew``: for the whole run, both workers (and the attempts they launch) run with
  their clocks ten minutes ahead or behind the scheduler, triggerer and api-server, as finding
  3's deployment had them (libfaketime: ``LD_PRELOAD`` of Debian's ``libfaketime``,
  ``FAKETIME=+10m`` or ``-10m``, the monotonic clock left alone, and a ``sitecustomize`` that
  sleeps through ``select``: libfaketime 0.9.10 breaks Python 3.11's ``time.sleep``, a bug of
  the tool, wolfcw/libfaketime#426) (hit: a try ran on a skewed worker); without libfaketime
  (``apt-get install -y faketime``) it is reported skipped;
* ``disk_full``: the run checkpoints to a local root on a 512 KB tmpfs the benchmark mounts (S3
  is never full: a full disk is what a local root meets), filled to the last byte for 5 to
  15 s once a checkpoint exists (hit: an attempt's training process met it and stopped with
  ``checkpoint-unwritable.json``); where no tmpfs can be mounted it is reported skipped;
* ``delete_checkpoints``: the run's whole checkpoint location (its S3 prefix: checkpoints,
  manifests, owner claims) deleted while an attempt trains (hit: a complete checkpoint was
  deleted);
* ``kill_runner_after_launch``: SIGKILL the task runner of the try that launched an attempt
  within milliseconds of the attempt's ``spec.json`` appearing (hit: the job's saved state
  did not record the attempt yet);
* ``kill_worker``: SIGKILL the whole session of the Celery worker running a try (hit: the
  try's task runner died with it). Under the LocalExecutor, ``kill_scheduler`` took the
  running try with it; under Celery this is that fault.

The outages (the api-server's, Redis's, PostgreSQL's, and ``restart_api_server``) begin just
after the task deferred anew (``benchmarks/chaos_faults.py``): its trigger fires during them,
and no try runs through them (the heartbeat timeout here is scaled down to 10 s, where
production's 300 s outlasts them). A run's deadline gains the wall time the faults it drew
take from the job (``SLACK_S`` there, plus each hold-down's length): at 1800 market seconds a
wall second, a 60 s outage is 30 market hours.

And ``--s3-windows`` S3 fault windows of 1 to 6 s each (every new request meets the fault):

* ``s3_500``: ``500 InternalError``; ``s3_throttle``: ``503 SlowDown`` for 50 to 100 % of the
  requests; ``s3_drop``: connections reset mid-request (the server gets half of it) or
  mid-response (the client gets the head and half the body), and those in flight are cut.

A fault counts once it hit something (what that is, each fault says above). Fault times are
drawn from 8 s to ``RETRY_UNTIL`` of the deadline the job would have without the faults'
slack (while it surely runs). A fault whose time comes before its moment (nothing trains, no
write, the task not freshly deferred) waits: it is tried again each second until it hits or
until ``RETRY_UNTIL`` of the run's deadline has passed; the other faults due are injected
first, at their time. For each run it reads the XCom summary, the job's saved state, the task
instance's tries, the attempts' folders and the bucket (directly, not through the proxy), and
counts:

* ``misses``: a failed run, or its deadline missed (also a run the retries did not absorb);
* ``lost``: an attempt that lost more than one checkpoint interval: by the operator's ledger
  (its ``lost_s``), or by the folders: the next attempt resumed more than ``save_every``
  steps behind where it stopped, or from before a checkpoint it had saved (and that no fault
  deleted);
* ``corrupt``: a successful run whose final model (the newest checkpoint with a manifest, in
  S3) differs from an uninterrupted run's;
* ``duplicates``: two attempts of the task training at once outside a make-before-break
  handover;
* ``orphans``: a supervisor or training process of the run still alive after it ended;
* ``missing``: an attempt folder that no row of the job's ledger (its saved state) accounts
  for, set-aside leftovers that got capacity included;
* ``unwatched_usd``: spot or on-demand billed past an attempt's lease, beyond the notice and
  grace it takes to stop;
* ``tries_lost_to_outages``: tries Airflow spent because of an outage of the api-server,
  Redis or PostgreSQL: a failed try (from the task instance's tries) that ended during one,
  or within a minute after, tries killed on purpose by a fault left out;
* ``unwatched_s``: seconds any attempt trained after its task instance reached a terminal
  state (the last step it reported, by its progress file's time of writing), beyond the
  3.2 s a stop takes (notice, grace, a second to send it).

Then ``--kube-runs`` runs of a DAG on the Kubernetes backend against the test cluster
(``benchmarks/chaos_kube.py``: real etcd, kube-apiserver, controller-manager, scheduler and
kwok; its binaries are built first if missing), on the same PostgreSQL, with a LocalExecutor
deployment of its own, Kubernetes API faults (``kube_500``, ``kube_drop``) and spot nodes
reclaimed as a trace says. Its counters are folded into the same totals (it has no
orchestration outages, and bills pods past their lease in ``unwatched_usd``: it adds nothing
to the two counters above).

It prints one line per run, one per fault kind (hits, of how many drawn, or why it was
skipped) and last, for a machine:
``chaos: runs=N faults=M misses=.. lost=.. corrupt=.. duplicates=.. orphans=.. missing=..
unwatched_usd=.. tries_lost_to_outages=.. unwatched_s=..``
``$AIRFLOW_SPOT_S3_RETRY_S``, if set, reaches the training process and the operator (``0``
turns off the checkpoint store's own retries: what the S3 faults did before it had them).
"""

from __future__ import annotations

import argparse
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
from chaos_deploy import (  # noqa: E402
    Missed,
    SmallDisk,
    Supervisor,
    Watch,
    job_state,
    recorded_dirs,
    restart_workers,
    trainers_of,
    wait_healthy,
)
from chaos_faults import (  # noqa: E402
    ARMED,
    FAULTS,
    HOLDS,
    LAST_TRY,
    SPEND_A_TRY,
    Planned,
    Run,
    skew_hit,
    skew_workers,
    tries_lost,
    unwatched_seconds,
    wait_attempts_end,
)

from airflow_spot.checkpoint import LocalStore, S3Store, Store  # noqa: E402
from airflow_spot.checkpoint.s3 import S3_RETRY_ENV  # noqa: E402
from airflow_spot.production import WORKER_SETTINGS  # noqa: E402
from airflow_spot.testing import scripted_trace, train_command  # noqa: E402
from airflow_spot.testing.clock import libfaketime, sleep_shim  # noqa: E402
from airflow_spot.testing.faults import FaultProxy, Mode, Request  # noqa: E402

DAG_ID = "spot_chaos"
LAST_DAG_ID = "spot_chaos_last_try"  # retries=0: its first try is its last
LAST_STEPS_X = 3  # its job is 3x the work: its attempt still trains when the task fails
PROCESS_FAULTS = (
    "kill_triggerer",
    "kill_scheduler",
    "kill_training",
    "kill_mid_checkpoint",
    "restart_api_server",
    "api_server_down",
    "redis_restart",
    "postgres_restart",
    LAST_TRY,
    "clock_skew",
    "disk_full",
    "delete_checkpoints",
    "kill_runner_after_launch",
    "kill_worker",
)
S3_FAULTS = ("s3_500", "s3_throttle", "s3_drop")
TRAINING_FAULTS = ("kill_training", "kill_mid_checkpoint")
ONE_A_RUN = (LAST_TRY, "clock_skew", "disk_full")  # each changes the whole run
RUN_LONG = (LAST_TRY, "clock_skew")  # from the run's start
# fault times are drawn up to this share of the deadline without the faults' slack, and a
# fault that finds nothing to hit is tried again each second until this share of the run's
# deadline (no kill lands in the last part of a run, where no slack is left to absorb it)
RETRY_UNTIL = 0.6
HOLD_WAIT_S = 5.0  # how long one try of kill_mid_checkpoint waits for a checkpoint write
FAULTS_ALL = PROCESS_FAULTS + S3_FAULTS
KUBE_FAULTS = ("kube_500", "kube_drop")  # benchmarks/chaos_kube.py
# Airflow's timeouts scaled down with everything else (at its defaults a killed worker's try is
# noticed after 5 min, 3x a run's deadline here). A try whose worker died is failed once its
# heartbeats are older than the timeout; a scheduler that was SIGKILLed is replaced, and its
# queued tries adopted, once silent for the health-check threshold, at the next orphan check;
# the next try comes retry_delay later (the operator's default: [core] default_task_retry_delay)
SCALED_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "1",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "10",
}
COUNTERS = (
    "misses",
    "lost",
    "corrupt",
    "duplicates",
    "orphans",
    "missing",
    "unwatched_usd",
    "tries_lost_to_outages",
    "unwatched_s",
)
SAVE_EVERY = 5
STEP_S = 0.1
SCALE = 1800.0  # market seconds a wall second
BUCKET = "spot-chaos"

DAG = """
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command


def chaos_dag(dag_id, steps, market, **retries):
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
             catchup=False, params={{"deadline": "{deadline_s:.0f}s",
                                     "ckpt_root": "s3://{bucket}/ckpt"}}) as dag:
        SpotTrainingOperator(
            task_id="train",
            command=train_command(steps, step_seconds={step_s}, save_every={save_every}, seed=7),
            checkpoint_uri="{{{{ params.ckpt_root }}}}/{{{{ run_id | replace(':', '_') | replace('+', '_') }}}}",
            expected_compute=timedelta(seconds=steps * {step_s}),
            total_steps=steps,
            deadline="{{{{ params.deadline }}}}",
            changeover=timedelta(seconds=1),
            policy="deadline_aware",
            max_failures={max_failures},
            backend=LocalBackend(time_scale={scale}, work_dir={root!r} + "/runs", notice_s=0.2,
                                 grace_s=2.0, extra_env={s3_env!r}, **market),
            decision_interval=timedelta(seconds=12),
            poll_interval=0.5,
            min_deferral=timedelta(seconds=10.5),
            lease=timedelta(seconds=45),
            **retries,
        )
    return dag


# the operator's default retries and retry_delay, spot as a real trace has it
chaos = chaos_dag({dag_id!r}, {steps}, dict(
    trace="bundled:cant-be-late/us-west-2a_v100_1/3.json", offset={offset}))
# its first try is its last; spot never goes away, so that its attempt still trains when
# Airflow fails the task (the fault is the orchestration's, not the market's)
last_try = chaos_dag({last_dag_id!r}, {last_steps}, dict(trace={steady!r}, polarity="available"),
                     retries=0)
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


class Deck:
    """The process faults dealt to the runs: each kind once per deck, shuffled from the seed,
    a new deck once one is used up. A card a run cannot take (see :meth:`fits`) goes back on
    top for the next run."""

    def __init__(self, rng: random.Random, kinds: tuple[str, ...]) -> None:
        self.rng, self.kinds, self.cards = rng, kinds, []  # type: list[str]

    def deal(self, n: int) -> list[str]:
        hand: list[str] = []
        back: list[str] = []
        while len(hand) < n and len(back) <= 2 * len(self.kinds):
            if not self.cards:
                self.cards = list(self.kinds)
                self.rng.shuffle(self.cards)
            card = self.cards.pop()
            (hand if self.fits(hand, card) else back).append(card)
        self.cards.extend(reversed(back))
        return hand

    @staticmethod
    def fits(hand: list[str], card: str) -> bool:
        """A run takes each of ONE_A_RUN once; a run whose task has no retry left takes no
        fault that spends a try; a run on the small disk makes no S3 write to hold."""
        kinds = {*hand, card}
        if card in ONE_A_RUN and card in hand:
            return False
        if LAST_TRY in kinds and kinds & set(SPEND_A_TRY):
            return False
        return not ("disk_full" in kinds and "kill_mid_checkpoint" in kinds)


def plan_run(
    rng: random.Random, deck: Deck, n: int, steps: int, windows: int
) -> tuple[list[Planned], float, list]:
    """One run's faults (sorted by time), its deadline, and its S3 windows."""
    plan = [Planned(kind, 0.0) for kind in deck.deal(n)]
    for p in plan:
        if p.kind in HOLDS:
            p.hold = rng.uniform(*HOLDS[p.kind])
        if p.kind == "clock_skew":
            p.sign = rng.choice("+-")
    last = any(p.kind == LAST_TRY for p in plan)
    base_s = deadline_of(steps * (LAST_STEPS_X if last else 1))  # the job surely runs then
    for p in plan:  # the last try is killed at its first chance; the skew is the whole run's
        p.at = rng.uniform(8, base_s * RETRY_UNTIL) if p.kind not in RUN_LONG else 0.0
    deadline_s = base_s + sum(p.slack() for p in plan)
    return sorted(plan, key=lambda p: p.at), deadline_s, plan_windows(rng, windows)


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


def losses(summary: dict, run_dirs: list[Path], deleted: set[int] | None = None) -> int:
    """Attempts that lost more than one checkpoint interval: by the ledger (its ``lost_s``
    beyond ``save_every`` steps at the ledger's own seconds a step), or by the folders (the
    next attempt resumed too far behind, or from before a saved checkpoint); an attempt whose
    last checkpoint a fault deleted (``deleted``: their steps) is not judged by the folders:
    that loss is the fault's."""
    interval_s = SAVE_EVERY * ledger_step_s(summary)  # one checkpoint interval, market seconds
    n = sum(1 for s in summary.get("segments") or [] if s.get("lost_s", 0) > interval_s + 1e-6)
    steps = attempt_steps(run_dirs)
    for (_, reached, saved), (resumed, _, _) in zip(steps, steps[1:], strict=False):
        if saved not in (deleted or ()):
            n += resumed < saved or reached - resumed > SAVE_EVERY
    return n


def ledger_step_s(summary: dict) -> float:
    """The market seconds a step of work takes by the ledger: measured, checkpoint saves
    included (an attempt's segments reach ``step_end`` times it), not the nominal
    ``STEP_S x SCALE``: under load or S3 faults a step takes longer, and four steps lost would
    count as more than five nominal ones."""
    ends = {a["attempt"]: a["step_end"] for a in summary.get("attempts") or [] if a.get("step_end")}
    reached: dict[int, float] = {}
    for s in summary.get("segments") or []:
        if s.get("attempt") in ends and s.get("progress_end_s") is not None:
            reached[s["attempt"]] = max(reached.get(s["attempt"], 0.0), s["progress_end_s"])
    rates = [reached[a] / ends[a] for a in reached if reached[a] > 0]
    return max(rates) if rates else STEP_S * SCALE


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def judge(run: Run, ref: str, by_design: bool) -> tuple[Counter, list[str]]:
    """The run's counters, and notes on what they found (see the module's docstring)."""
    c: Counter = Counter()
    notes: list[str] = []
    base = f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}"
    state = run.dep.get(base)["state"]
    try:
        xcom = run.dep.get(f"{base}/taskInstances/train/xcomEntries/return_value")
        summary = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    except Exception:  # noqa: BLE001 - no summary: the run failed
        summary = {}
    if not by_design:  # (a run whose last try was failed on purpose fails by design)
        c["misses"] += state != "success" or not summary.get("deadline_met")
    dirs, every = run.attempt_dirs(), run.attempt_dirs(leftovers=True)
    c["lost"] += losses(summary, dirs, run.deleted)
    c["corrupt"] += state == "success" and model_hash(run.store) != ref
    attempts = summary.get("attempts") or []
    spans = sorted(
        (a["start_h"], a["end_h"], a.get("handed_to"))
        for a in attempts
        if a.get("start_h") is not None and a.get("end_h") is not None
    )
    for (_, e0, handed), (s1, _, _) in zip(spans, spans[1:], strict=False):
        c["duplicates"] += s1 < e0 - 1e-6 and handed is None
    saved = job_state(run.pg.port, run.dag_id, run.run_id)
    if saved is not None:  # the ledger is the job's saved state, also for a failed run
        recorded = recorded_dirs(saved)
        unrecorded = [
            d.name
            for d in every
            if os.path.realpath(d) not in recorded
            and (".leftover-" not in d.name or read_json(d / "status.json").get("granted_at"))
        ]
        c["missing"] += len(unrecorded)
        notes += [f"{name} in no ledger" for name in unrecorded]
    time.sleep(3)
    left = subprocess.run(
        ["pgrep", "-f", f"{run.run_dir}/"], capture_output=True, text=True
    ).stdout.split()
    c["orphans"] += len(set(left) | {str(p) for p in trainers_of(run.run_dir)})
    tries = run.dep.get(f"{base}/taskInstances/train/tries")["task_instances"]
    lost, told = tries_lost(run, tries)
    c["tries_lost_to_outages"] += lost
    notes += told
    wait_attempts_end(run, 60.0)  # one left unwatched stops at its lease's end (45 s)
    c["unwatched_s"] += unwatched_seconds(every, run.watch.terminal_at())
    c["unwatched_usd"] += unwatched_usd(every)
    return c, notes


def clock_offset(d: Path) -> float:
    """How far the attempt's supervisor's clock is off this host's (its status's heartbeat
    against the time the file was written): 0 unless a skewed worker launched it."""
    st = d / "status.json"
    try:
        off = float(json.loads(st.read_text())["heartbeat"]) - st.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return off if abs(off) > 60 else 0.0


def unwatched_usd(run_dirs: list[Path], scale: float = SCALE, stop_s: float = 2.2) -> float:
    """Capacity billed past each attempt's lease, beyond the notice and grace (``stop_s``) it
    takes to stop by itself: wall seconds at ``scale`` market seconds each, at the
    reference prices (spot $0.9731, on-demand $3.06 an hour). The lease's end is the one the
    attempt's supervisor read, on its clock."""
    usd = 0.0
    for d in run_dirs:
        try:
            until = float(json.loads((d / "LEASE").read_text())["until"])
            st = json.loads((d / "status.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
        if st.get("granted_at") is None:
            continue  # a request that never got capacity bills nothing
        ended = st.get("ended_at") or time.time() + clock_offset(d)
        price = 0.9731 if st.get("capacity") == "spot" else 3.06
        usd += max(0.0, ended - until - stop_s) * scale / 3600.0 * price
    return usd


def trigger(dep: deploy.AirflowDeployment, dag_id: str, conf: dict[str, str]) -> str:
    """Unpause ``dag_id`` and start a run of it now with ``conf``; the run's id."""
    dep.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
    r = dep.request(
        "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
    )
    r.raise_for_status()
    return r.json()["dag_run_id"]


def inject(run: Run, p: Planned, s3: S3, rng: random.Random) -> Any:
    if p.kind == "kill_mid_checkpoint":
        return kill_mid_checkpoint(s3, run.run_dir, run.safe, rng)
    return FAULTS[p.kind](run, p)


def told(p: Planned, at: float, hit: Any) -> str:
    """The run line's note on one fault."""
    late = f" (planned @{p.at:.0f}s)" if at - p.at >= 2 else ""
    if isinstance(hit, Missed):
        return f"{p.kind}@{at:.0f}s{late} missed ({hit.why})"
    return f"{p.kind}@{at:.0f}s{late}" + (f" ({hit})" if isinstance(hit, str) else "")


def one_run(ctx: dict[str, Any], args: Any, n: int) -> tuple[str, Counter, Counter, list[str]]:
    """Run ``n`` of the plan under its faults: (its state, its counters, the faults that hit,
    notes)."""
    dep, s3, disk = ctx["dep"], ctx["s3"], ctx["disk"]
    plan, deadline_s, windows = ctx["plans"][n]
    last = any(p.kind == LAST_TRY for p in plan)
    local = disk is not None and any(p.kind == "disk_full" for p in plan)
    conf = {"deadline": f"{deadline_s:.0f}s"}
    if local:
        conf["ckpt_root"] = str(disk.where / "ckpt")
    dag_id = LAST_DAG_ID if last else DAG_ID
    skew = next((p for p in plan if p.kind == "clock_skew" and p.kind not in ctx["skipped"]), None)
    skewed_at = skew_workers(dep, ctx["sup"], ctx["lib"], ctx["shim"], skew) if skew else None
    run_id = trigger(dep, dag_id, conf)
    safe = run_id.replace(":", "_").replace("+", "_")
    run = Run(
        dep, ctx["sup"], ctx["pg"], ctx["redis"], disk, dag_id, run_id, ctx["root"],
        time.time(), deadline_s, Watch(ctx["pg"].port, dag_id, run_id).start(),
        LocalStore(disk.where / "ckpt" / safe) if local else s3.store(safe),
        disk.where / "ckpt" / safe if local else None, ctx["lib"],
    )  # fmt: skip
    run.skewed_at = skewed_at
    kinds: Counter = Counter()
    notes = [f"{p.kind} skipped" for p in plan if p.kind in ctx["skipped"]]
    todo = [p for p in plan if p.kind not in ctx["skipped"] and p is not skew]
    due: list[Planned] = []
    later: list[tuple[Planned, float, Any]] = [(skew, 0.0, skew_hit(run, skew))] if skew else []
    out: list = []
    requests_before = sum(s3.proxy.hits.values())
    s3_thread = threading.Thread(
        target=run_windows, args=(s3, windows, run.run_dir, run.start, run.ended, out), daemon=True
    )
    s3_thread.start()

    def record(p: Planned, at: float, hit: Any) -> None:
        kinds[p.kind] += bool(hit) and not isinstance(hit, Missed)
        notes.append(told(p, at, hit))

    state = "queued"
    try:
        while True:
            look = run.watch.now()
            state = (look.run_state if look else None) or state
            if state in ("success", "failed") or time.time() - run.start > deadline_s * 3:
                break
            while todo and time.time() - run.start >= todo[0].at:
                due.append(todo.pop(0))
            # the others first: a training fault's try may wait for a write (HOLD_WAIT_S)
            for p in sorted(due, key=lambda f: f.kind in TRAINING_FAULTS):
                at = time.time() - run.start
                hit = inject(run, p, s3, ctx["inject_rng"])
                if hit is None:  # its moment has not come (an armed one's thread ends it)
                    if p.kind in ARMED or at < deadline_s * RETRY_UNTIL:
                        continue
                    hit = Missed("its moment never came")
                due.remove(p)
                if callable(hit):
                    later.append((p, at, hit))
                else:
                    record(p, at, hit)
            time.sleep(1.0)
    finally:
        run.ended.set()
        for armed in run.armed.values():
            armed.join(240)
        s3_thread.join(30)
        s3.proxy.set(Mode.PASS)
        if run.skewed_at is not None:  # the workers' clocks right again for the next run
            restart_workers(dep, ctx["sup"], None)
        run.watch.stop()
    for p in due:
        armed = run.armed.get(id(p))
        if armed is not None and armed.result is not None:
            record(p, time.time() - run.start, armed.result)
        else:
            notes.append(f"{p.kind}@{p.at:.0f}s missed (the run ended)")
    notes += [f"{p.kind}@{p.at:.0f}s missed (the run ended)" for p in todo]
    for p, at, check in later:
        record(p, at, check())
    for kind, at, length, requests in out:
        kinds[kind] += requests > 0
        notes.append(f"{kind}@{at:.0f}s for {length:.0f}s: {requests} requests")
    notes.append(f"{sum(s3.proxy.hits.values()) - requests_before} S3 requests")
    wait_healthy(dep)
    got, found = judge(run, ctx["refs"][dag_id], by_design=bool(kinds[LAST_TRY]))
    return state + (" (by design)" if kinds[LAST_TRY] else ""), got, kinds, notes + found


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
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="airflow-spot-chaos-"))
    refs = {}
    for dag_id, steps in ((DAG_ID, args.steps), (LAST_DAG_ID, args.steps * LAST_STEPS_X)):
        (root / dag_id).mkdir()
        refs[dag_id] = reference_model(root / dag_id, steps)
    bin_dir = deploy.postgres_bin_dir()
    if bin_dir is None:
        sys.exit("chaos: PostgreSQL is not installed (apt-get install -y postgresql)")
    redis_bin = deploy.redis_server_binary()
    if redis_bin is None:
        sys.exit("chaos: Redis is not installed (apt-get install -y redis-server)")
    if args.kube_runs:  # the test cluster's binaries, built now if missing (not mid-run)
        from airflow_spot.testing.cluster.plane import ensure_binaries

        ensure_binaries()
    ctx: dict[str, Any] = {"root": root, "refs": refs, "skipped": {}, "lib": libfaketime()}
    ctx["shim"] = sleep_shim(root / "sleep-shim")
    if ctx["lib"] is None:
        ctx["skipped"]["clock_skew"] = "libfaketime is not installed: apt-get install -y faketime"
    ctx["disk"], why = SmallDisk.mount(root / "disk")
    if ctx["disk"] is None:
        ctx["skipped"]["disk_full"] = why
    offset = rng.randrange(0, 200)
    deck = Deck(rng, PROCESS_FAULTS)
    ctx["plans"] = [
        plan_run(rng, deck, args.faults_per_run, args.steps, args.s3_windows)
        for _ in range(args.runs)
    ]
    ctx["inject_rng"] = random.Random(rng.random())
    s3 = ctx["s3"] = S3(args.seed)
    pg = ctx["pg"] = deploy.PostgresServer(
        bin_dir, Path(tempfile.mkdtemp(prefix="airflow-spot-pg-"))
    )
    redis = ctx["redis"] = deploy.RedisServer(
        redis_bin, Path(tempfile.mkdtemp(prefix="airflow-spot-redis-"))
    )
    total: Counter = Counter()
    kinds: Counter = Counter()
    dep = sup = None
    try:
        pg.start()
        redis.start()
        source = DAG.format(
            dag_id=DAG_ID,
            last_dag_id=LAST_DAG_ID,
            steps=args.steps,
            last_steps=args.steps * LAST_STEPS_X,
            step_s=STEP_S,
            save_every=SAVE_EVERY,
            bucket=BUCKET,
            root=str(root),
            deadline_s=deadline_of(args.steps),
            # a SIGKILLed trainer is an application failure by design (the OOM killer's
            # signal): the default budget of 2, plus one for each process fault a run draws
            max_failures=2 + args.faults_per_run,
            offset=offset,
            steady=str(scripted_trace(root / "steady.json", [(True, 20000)])),
            scale=SCALE,
            s3_env=s3.env(),
        )
        dep = ctx["dep"] = deploy.AirflowDeployment(
            root / "deploy", pg.url(), {"chaos.py": source},
            executor="CeleryExecutor", broker_url=redis.url(),
        )  # fmt: skip
        dep.env.update(s3.env())  # the operator's own checkpoint reads, through the proxy
        dep.env.update(SCALED_ENV)
        dep.env.update(WORKER_SETTINGS)  # what the README recommends for production
        dep.migrate()
        dep.start()
        sup = ctx["sup"] = Supervisor(dep).start()
        dep.wait_for_dag(DAG_ID)
        dep.wait_for_dag(LAST_DAG_ID)
        for n in range(args.runs):
            wait_healthy(dep)
            t0 = time.time()
            state, got, hit, notes = one_run(ctx, args, n)
            total += got
            kinds += hit
            print(
                f"run {n + 1}: {state} in {time.time() - t0:.0f} s (deadline "
                f"{ctx['plans'][n][1]:.0f} s); faults {dict(hit) or 'none'}; "
                f"{'; '.join(notes)}; {dict(+got) or 'clean'}",
                flush=True,
            )
        sup.stop()
        dep.stop()
        dep.ledger.kill_alive()
        dep = None
        redis.stop()
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
        if sup is not None:
            sup.stop()
        if dep is not None:
            dep.stop()
            dep.ledger.kill_alive()
        redis.stop()
        pg.stop()
        s3.stop()
        if ctx["disk"] is not None:
            ctx["disk"].unmount()
    report(args, ctx, kinds, total)


def report(args: Any, ctx: dict[str, Any], kinds: Counter, total: Counter) -> None:
    """The per-fault lines (hits of drawn, or why skipped) and the machine-read last line."""
    drawn = Counter(p.kind for plan, _, _ in ctx["plans"] for p in plan)
    drawn += Counter(w[2] for _, _, windows in ctx["plans"] for w in windows)
    for kind in FAULTS_ALL:
        if kind in ctx["skipped"]:
            print(f"fault {kind}: skipped, {drawn[kind]} drawn ({ctx['skipped'][kind]})")
        else:
            print(f"fault {kind}: {kinds[kind]} of {drawn[kind]} drawn")
    for kind in KUBE_FAULTS if args.kube_runs else ():
        print(f"fault {kind}: {kinds[kind]}")
    print(
        f"chaos: runs={args.runs + args.kube_runs} faults={sum(kinds.values())} "
        f"misses={total['misses']} lost={total['lost']} corrupt={total['corrupt']} "
        f"duplicates={total['duplicates']} orphans={total['orphans']} "
        f"missing={total['missing']} unwatched_usd={total['unwatched_usd']:.2f} "
        f"tries_lost_to_outages={total['tries_lost_to_outages']} "
        f"unwatched_s={total['unwatched_s']:.1f}"
    )


if __name__ == "__main__":
    main()
