"""Kubernetes API faults for the chaos benchmark (issue 21, deliverable 4).

    python benchmarks/chaos_kube.py [--runs 2] [--seed 7] [--faults-per-run 3]

A real deployment of its own on ``benchmarks/chaos.py``'s PostgreSQL (scheduler with
LocalExecutor, dag-processor, triggerer and api-server, each its own process on 127.0.0.1;
the local runs use CeleryExecutor),
with a DAG on the Kubernetes backend against the test cluster
(:mod:`airflow_spot.testing.cluster`: real etcd, kube-apiserver, controller-manager, scheduler
and kwok; our kubelet runs the pods as local processes). The task reaches the cluster through
an Airflow Kubernetes connection that holds ``docker/rbac.yaml``'s ServiceAccount token, and
through :func:`kube_fault_proxy`, a TLS-terminating fault proxy in front of the API server.

Spot comes and goes as the bundled us-west-2a V100 trace says, at ``SCALE`` market seconds a
wall second (a random offset per run). When the trace says spot is gone, every spot node is
taken away, in one of the kubelet's ways at random (a drain through the Eviction API, a
graceful shutdown, a deleted node, lost heartbeats). Faults, at random times:

* ``kube_500``: for a few seconds every request the operator (or its trigger) makes gets
  ``500 Internal Server Error``, with a ``Status`` body as the API server sends;
* ``kube_drop``: for a few seconds every connection is dropped in the middle of its response,
  as a watch or a long read is when the server or a load balancer goes away.

The kubelet and the cloud talk to the API server directly: the faults are the operator's.

Counters, per run, as chaos.py's: ``misses`` (failed, or the deadline missed), ``lost``
(work lost beyond one checkpoint interval), ``corrupt`` (final weights differ from an
uninterrupted run's), ``duplicates`` (two attempts training at once outside a handover),
``orphans`` (a pod of the run, or its container, still there after the run), ``missing`` (a
training pod the kubelet ran that no ledger row accounts for), ``unwatched_usd`` (a container
running past its pod's lease, beyond the notice and grace it needs to stop, at the reference
prices).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import random
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

from airflow_spot.simulate.traces import load_trace  # noqa: E402
from airflow_spot.testing.faults import FaultProxy, Mode, kube_fault_proxy  # noqa: E402

DAG_ID = "spot_chaos_k8s"
NS = "ml-training"
CONN_ID = "spot_chaos_k8s"
FAULTS = ("kube_500", "kube_drop")
COUNTERS = ("misses", "lost", "corrupt", "duplicates", "orphans", "missing", "unwatched_usd")
RECLAIMS = ("drain", "shutdown", "delete", "unreachable")
TRACE = "bundled:cant-be-late/us-west-2a_v100_1/3.json"
SCALE = 1200.0  # market seconds a wall second: a 600 s tick lasts 0.5 s
SAVE_EVERY = 5
STEP_S = 0.1
STOP_S = 7.0  # notice, the kubelet's grace cap and a poll: how long a pod needs to stop
PRICES = {"spot": 0.9731, "on_demand": 3.06}
RBAC = ROOT / "docker" / "rbac.yaml"
# a killed task runner is noticed by its missing heartbeats; 300 s by default (see chaos.py)
HEARTBEAT_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "1",
    # a try queued by a scheduler that was SIGKILLed is checked by no one until the next
    # scheduler adopts it: it looks every 300 s by default, for schedulers silent for 30 s
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
}

DAG = """
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False) as dag:
    SpotTrainingOperator(
        task_id="train",
        command=train_command({steps}, step_seconds={step_s}, save_every={save_every}, seed=7),
        checkpoint_uri={root!r} + "/ckpt/{{{{ run_id | replace(':', '_') | replace('+', '_') }}}}",
        expected_compute=timedelta(seconds={steps} * {step_s}),
        total_steps={steps},
        deadline=timedelta(seconds={deadline_s}),
        changeover=timedelta(seconds=2),
        policy="deadline_aware",
        max_failures=2,
        backend=KubernetesBackend(
            image="ghcr.io/airflow-spot/train:test",
            kubernetes_conn_id={conn_id!r},
            namespace={ns!r},
            preset="karpenter",
            gpus=1,
            spot_cooldown_s=5,
            pending_timeout_s=8,
        ),
        decision_interval=timedelta(seconds=12),
        poll_interval=0.5,
        min_deferral=timedelta(seconds=10.5),
        lease=timedelta(seconds=45),
        retries=3,
        retry_delay=timedelta(seconds=2),
    )
"""


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class KubeChaos:
    """The test cluster, the ServiceAccount, the fault proxy and the trace-driven market for
    one chaos session; :meth:`dag`, :meth:`env` go into the deployment, :meth:`run` drives
    one DAG run's market, :meth:`inject` a fault, :meth:`judge` counts."""

    def __init__(self, root: Path, rng: random.Random, steps: int) -> None:
        self.root, self.rng, self.steps = root, rng, steps
        self.deadline_s = steps * STEP_S * 2 + 60
        self.trace = load_trace(TRACE, polarity="unavailable")  # as LocalBackend's default
        self.plane: Any = None
        self.kubelet: Any = None
        self.proxy: FaultProxy | None = None
        self.cut = 0  # connections cut in flight by kube_drop windows (this run)
        self._market: threading.Thread | None = None
        self._market_stop = threading.Event()
        self.alive: dict[str, float] = {}  # pod key -> last wall time its container ran
        self.lease: dict[str, float] = {}  # pod key -> its lease annotation's end
        self.capacity: dict[str, str] = {}  # pod key -> spot | on_demand
        self.run_of: dict[str, str] = {}  # pod key -> the run-id label
        self.training_pods: set[str] = set()

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> KubeChaos:
        from kubernetes import client

        from airflow_spot.backends.kubernetes.probe import build_priority_class
        from airflow_spot.testing.cluster import ControlPlane, write_kubeconfig
        from airflow_spot.testing.cluster.kubelet import Kubelet
        from airflow_spot.testing.cluster.plane import free_port
        from airflow_spot.testing.cluster.pytest_plugin import anchors

        port = free_port()
        self.plane = ControlPlane(self.root / "plane", kubelet_port=port).start()
        self.kubelet = Kubelet(self.plane.kubeconfig, self.root / "nodes", port=port).start()
        anchors(self.kubelet)
        api = self.kubelet.api
        import yaml

        real = _load("real_k8s_conftest", ROOT / "tests/backends/kubernetes/real/conftest.py")
        real.apply_rbac(api, [d for d in yaml.safe_load_all(RBAC.read_text()) if d])
        with contextlib.suppress(client.ApiException):
            client.SchedulingV1Api(api.api_client).create_priority_class(build_priority_class())
        token = api.create_namespaced_service_account_token(
            "airflow-spot",
            NS,
            client.AuthenticationV1TokenRequest(spec={"audiences": [], "expirationSeconds": 86400}),
        ).status.token
        pk = self.plane.root / "pki"
        self.proxy = kube_fault_proxy(
            self.plane.server, pk / "ca.crt", pk / "apiserver.crt", pk / "apiserver.key"
        ).start()
        self.kubeconfig = write_kubeconfig(
            self.root / "sa.kubeconfig", self.proxy.url, pk / "ca.crt", token=token
        )
        return self

    def stop(self) -> None:
        self._market_stop.set()
        if self._market is not None:
            self._market.join(10)
        if self.proxy is not None:
            self.proxy.stop()
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.plane is not None:
            self.plane.stop()

    def dag(self) -> str:
        return DAG.format(
            dag_id=DAG_ID,
            steps=self.steps,
            step_s=STEP_S,
            save_every=SAVE_EVERY,
            root=str(self.root),
            deadline_s=self.deadline_s,
            conn_id=CONN_ID,
            ns=NS,
        )

    def env(self) -> dict[str, str]:
        conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(self.kubeconfig)}}
        return {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn)}

    # -- one run ------------------------------------------------------------------------------
    def begin(self) -> None:
        """The market of a run: spot as the trace says from a random offset."""
        self._market_stop.set()
        if self._market is not None:
            self._market.join(10)
        self._market_stop = threading.Event()
        offset = self.rng.randrange(0, max(1, len(self.trace.available) - 400))
        self._market = threading.Thread(
            target=self._drive, args=(offset, self._market_stop), name="market", daemon=True
        )
        self._market.start()

    def _drive(self, offset: int, stop: threading.Event) -> None:
        k = self.kubelet
        avail = self.trace.available
        start = time.time()
        was = True
        last_read = 0.0
        while not stop.is_set():
            t = offset + int((time.time() - start) * SCALE / self.trace.gap_s)
            up = bool(avail[t]) if t < len(avail) else False
            k.spot_available = up
            if was and not up:
                for node in list(k.nodes):
                    if node.startswith("spot-") and node not in k.lost:
                        with contextlib.suppress(Exception):
                            k.reclaim(node, self.rng.choice(RECLAIMS))
            was = up
            now = time.time()
            for key, proc in list(k.procs.items()):
                if proc is not None and proc.poll() is None:
                    self.alive[key] = now
            if now - last_read > 1.0:
                last_read = now
                with contextlib.suppress(Exception):
                    self._read_pods()
            stop.wait(0.2)
        k.spot_available = True

    def _read_pods(self) -> None:
        for p in self.kubelet.api.list_namespaced_pod(NS).items:
            labels = p.metadata.labels or {}
            if "airflow-spot/attempt" not in labels:
                continue  # a probe
            key = f"{NS}/{p.metadata.name}"
            self.training_pods.add(key)
            self.capacity[key] = labels.get("airflow-spot/capacity", "")
            self.run_of[key] = labels.get("airflow-spot/run-id", "")
            until = (p.metadata.annotations or {}).get("airflow-spot/lease-until")
            if until:
                with contextlib.suppress(ValueError):
                    self.lease[key] = float(until)

    def inject(self, kind: str) -> bool:
        """A fault window of ``kind``, 2 to 6 s long (the caller waits it out); whether it hit
        anything: a request that met it, or (``kube_drop``) a connection cut in flight."""
        assert self.proxy is not None
        proxy = self.proxy
        mode = {"kube_500": Mode.HTTP_500, "kube_drop": Mode.DROP_RESPONSE}[kind]
        before = proxy.hits[mode]
        proxy.set(mode)
        cut = proxy.cut_open() if mode is Mode.DROP_RESPONSE else 0  # a watch, a long read
        time.sleep(self.rng.uniform(2.0, 6.0))
        proxy.set(Mode.PASS)
        self.cut += cut
        return proxy.hits[mode] > before or cut > 0

    def judge(self, dep: Any, run_id: str, ref: str, model_hash: Any) -> Counter:
        from airflow_spot.backends.kubernetes.pods import label_value

        c: Counter = Counter()
        run = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")
        try:
            xcom = dep.get(
                f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/xcomEntries/"
                "return_value"
            )
            summary = (
                xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
            )
        except Exception:  # noqa: BLE001 - no summary: the run failed
            summary = {}
        c["misses"] += run["state"] != "success" or not summary.get("deadline_met")
        interval_h = SAVE_EVERY * STEP_S / 3600.0  # one checkpoint interval (real time)
        c["lost"] += (summary.get("work_lost_hours") or 0.0) > interval_h + 1e-6
        safe = run_id.replace(":", "_").replace("+", "_")
        c["corrupt"] += run["state"] == "success" and model_hash(self.root / "ckpt" / safe) != ref
        attempts = summary.get("attempts") or []
        c["attempts"] += len(attempts)
        c["preemptions"] += summary.get("preemptions") or 0
        spans = sorted(
            (a["start_h"], a["end_h"], a.get("handed_to"))
            for a in attempts
            if a.get("start_h") is not None and a.get("end_h") is not None
        )
        for (_, e0, handed), (s1, _, _) in zip(spans, spans[1:], strict=False):
            c["duplicates"] += s1 < e0 - 1e-6 and handed is None
        time.sleep(3)
        with contextlib.suppress(Exception):
            self._read_pods()
        label = label_value(run_id)
        mine = {k for k in self.training_pods if self.run_of.get(k) == label}
        c["missing"] += max(0, len(mine) - len(attempts))
        left = [
            p.metadata.name
            for p in self.kubelet.api.list_namespaced_pod(NS).items
            if (p.metadata.labels or {}).get("airflow-spot/run-id") == label
        ]
        running = [
            k for k in mine if (pr := self.kubelet.procs.get(k)) is not None and pr.poll() is None
        ]
        c["orphans"] += len(set(left) | {k.split("/", 1)[1] for k in running})
        for key in mine:
            if key in self.alive and key in self.lease:
                over = self.alive[key] - self.lease[key] - STOP_S
                c["unwatched_usd"] += max(0.0, over) / 3600.0 * PRICES.get(self.capacity[key], 3.06)
        return c


def run_kube_chaos(
    runs: int, seed: int, steps: int, faults_per_run: int, pg: Any, root: Path, ref_of: Any
) -> tuple[Counter, Counter]:
    """``runs`` runs of the Kubernetes DAG with API faults; (counters, faults by kind).
    ``pg``: a started deploy.PostgresServer; ``ref_of(root, steps)`` the reference hash and
    ``model_hash`` come from chaos.py (passed in, so that both use the same)."""
    rng = random.Random(seed)
    total: Counter = Counter()
    kinds: Counter = Counter()
    chaos = KubeChaos(root, rng, steps)
    ref, model_hash = ref_of(root, steps)
    dep = None
    try:
        chaos.start()
        dep = deploy.AirflowDeployment(root / "deploy", pg.url(), {"chaos_k8s.py": chaos.dag()})
        dep.env.update(chaos.env())
        dep.env.update(HEARTBEAT_ENV)
        dep.migrate()
        dep.start()
        dep.wait_for_dag(DAG_ID)
        for n in range(runs):
            chaos.begin()
            assert chaos.proxy is not None
            chaos.proxy.hits.clear()
            chaos.cut = 0
            run_id = dep.trigger(DAG_ID)
            start = time.time()
            plan = sorted(rng.uniform(5, chaos.deadline_s * 0.6) for _ in range(faults_per_run))
            state = "queued"
            while True:
                state = dep.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
                if state in ("success", "failed"):
                    break
                if plan and time.time() - start >= plan[0]:
                    plan.pop(0)
                    kind = rng.choice(FAULTS)
                    if chaos.inject(kind):
                        kinds[kind] += 1
                if time.time() - start > chaos.deadline_s * 3:
                    break
                time.sleep(1.0)
            got = chaos.judge(dep, run_id, ref, model_hash)
            total += got
            shown = {k: v for k, v in got.items() if k in COUNTERS and v}
            print(
                f"kubernetes run {n + 1}: {state} in {time.time() - start:.0f} s, "
                f"{got['attempts']} attempts, {got['preemptions']} preemptions, requests "
                f"answered 500: {chaos.proxy.hits[Mode.HTTP_500]}, dropped: "
                f"{chaos.proxy.hits[Mode.DROP_RESPONSE]} (of {sum(chaos.proxy.hits.values())}), cut in "
                f"flight: {chaos.cut}; "
                f"{shown or 'clean'}",
                flush=True,
            )
    finally:
        if dep is not None:
            dep.stop()
            dep.ledger.kill_alive()
        chaos.stop()
    return total, kinds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--faults-per-run", type=int, default=3)
    args = ap.parse_args()
    chaos_py = _load("chaos_bench", Path(__file__).with_name("chaos.py"))
    root = Path(tempfile.mkdtemp(prefix="airflow-spot-chaos-k8s-"))

    def ref_of(where: Path, steps: int) -> tuple[str, Any]:
        return chaos_py.reference_model(where, steps), chaos_py.model_hash

    bin_dir = deploy.postgres_bin_dir()
    if bin_dir is None:
        sys.exit("chaos: PostgreSQL is not installed (apt-get install -y postgresql)")
    pg = deploy.PostgresServer(bin_dir, Path(tempfile.mkdtemp(prefix="airflow-spot-pg-")))
    pg.start()
    try:
        total, kinds = run_kube_chaos(
            args.runs, args.seed, args.steps, args.faults_per_run, pg, root, ref_of
        )
    finally:
        pg.stop()
    for kind in FAULTS:
        print(f"fault {kind}: {kinds[kind]}")
    print(
        f"chaos: runs={args.runs} faults={sum(kinds.values())} misses={total['misses']} "
        f"lost={total['lost']} corrupt={total['corrupt']} duplicates={total['duplicates']} "
        f"orphans={total['orphans']} missing={total['missing']} "
        f"unwatched_usd={total['unwatched_usd']:.2f}"
    )


if __name__ == "__main__":
    main()
