"""What the simulated nodes of a real control plane run, and the cloud behind them.

:class:`Kubelet` watches the pods the real scheduler binds to nodes it owns and does the
kubelet's part, as the kubelet does it:

* runs the first container's command as a local process (its downward-API annotations file
  kept current on disk, its ``valueFrom.fieldRef`` variables resolved), and reports
  ``Running``, then ``Succeeded`` or ``Failed`` with the exit code (and, under
  ``terminationMessagePolicy: FallbackToLogsOnError``, its last log lines as the message);
* is the network: every pod's address is 127.0.0.1 (``podIP``), and a variable naming a pod
  under a headless Service (``<hostname>.<service>[.<namespace>.svc[.cluster.local]]``, as
  cluster DNS answers it) is given that address, since these processes have no cluster DNS;
* a pod being deleted (``deletionTimestamp``) gets SIGTERM, SIGKILL after its grace period,
  its terminal status, and then the kubelet's final delete (grace 0, uid precondition);
* serves ``pods/log`` on the port nodes advertise (the API server proxies it there);
* graceful node shutdown: SIGTERM, then ``Failed`` with ``reason: Terminated``, the kubelet's
  message and the ``DisruptionTarget`` condition ``TerminationByKubelet``.

Nodes made by Karpenter (label ``karpenter.sh/nodepool``, see :mod:`.karpenter`) are adopted:
their pods run here too, their startup taint is removed once Karpenter has registered them (a
node agent's part), and the cloud behind them is Karpenter's. Pods of a namespace in
:attr:`Kubelet.leave_to_karpenter` get no node from us.

And the cloud's part: a node is made for a pending pod that fits nowhere (labels from its node
selector, taints from its tolerations, as an autoscaler would), spot only while
``spot_available`` and while fewer than ``spot_limit`` spot nodes exist (None: no limit;
:meth:`follow` moves it along a count trace, reclaiming the spot nodes above it); an empty
node it made is given back; and a spot node is reclaimed in each way a cloud takes one
(:meth:`reclaim`), the rest done by the real controllers:

* ``delete``: the node object goes (pod GC force-deletes its pods: ``DeletionByPodGC``);
* ``unreachable``: the node stops renewing its lease (the node lifecycle controller marks it
  NotReady and taints it ``unreachable:NoExecute``; the taint manager evicts:
  ``DeletionByTaintManager``);
* ``drain``: a spot interruption notice (Karpenter's ``SpotInterrupted`` event and
  ``karpenter.sh/disrupted`` taint), then the Eviction API (``EvictionByEvictionAPI``);
* ``shutdown``: graceful node shutdown, written by this kubelet.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import itertools
import os
import re
import signal
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_spot.backends.kubernetes.vocabulary import SHUTDOWN_MESSAGES
from airflow_spot.testing.cluster import pki
from airflow_spot.testing.cluster.karpenter import NODEPOOL_LABEL as KARPENTER_NODEPOOL
from airflow_spot.testing.cluster.karpenter import REGISTERED_LABEL, STARTUP_TAINT
from airflow_spot.testing.cluster.plane import KWOK_LABEL, free_port

SHUTDOWN_MSG = SHUTDOWN_MESSAGES[0]  # the kubelet's own words, as the classifier reads them
RECLAIMS = ("delete", "unreachable", "drain", "shutdown")
CAPACITY_LABEL = "airflow-spot/capacity"  # on our pods: spot | on_demand
SPOT_LABELS = {  # a spot node, in each preset's words
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet:
    """Kubelet and cloud for the nodes it makes (see the module's notes)."""

    def __init__(
        self,
        kubeconfig: str,
        workdir: str | Path,
        *,
        port: int | None = None,
        grace_cap_s: float = 5.0,
        autoscale: bool = True,
        gpus_per_node: int = 1,
        give_back_after_s: float = 2.0,
    ) -> None:
        from kubernetes import client, config

        self._api_client = config.new_client_from_config(config_file=kubeconfig)
        self.api = client.CoreV1Api(self._api_client)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.grace_cap_s = grace_cap_s
        self.autoscale = autoscale
        self.gpus_per_node = gpus_per_node
        self.give_back_after_s = give_back_after_s
        self.spot_available = True
        self.spot_limit: int | None = None  # spot nodes the cloud has now (None: no limit)
        self._trace: threading.Thread | None = None
        self._trace_stop = threading.Event()
        self.nodes: dict[str, dict[str, str]] = {}  # node -> labels (the ones we made)
        self.adopted: set[str] = set()  # Karpenter's nodes: we run their pods, never delete them
        self._foreign: set[str] = set()  # nodes seen that are neither ours nor Karpenter's
        self.leave_to_karpenter: set[str] = set()  # namespaces whose pods Karpenter serves
        self._next_node_scan = 0.0
        self.lost: set[str] = set()  # nodes whose machine is gone (nothing runs there)
        self.procs: dict[str, subprocess.Popen | None] = {}  # "ns/name" -> its container
        # (None: a pod that runs nothing, a probe's pause)
        self.started: dict[str, float] = {}
        self.empty_since: dict[str, float] = {}
        self.released: list[str] = []
        self.reclaimed: list[tuple[str, str, str]] = []  # (pod, node, how)
        self.plan: dict[int, tuple[str, float]] = {}  # spot pod ordinal -> (how, after s)
        self.spot_gone_after_plan = False
        self.spot_ordinal: dict[str, int] = {}
        self.shutting: dict[str, float] = {}  # pod key -> when graceful shutdown began
        self.errors: list[str] = []
        self._n = itertools.count(1)
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._http: http.server.ThreadingHTTPServer | None = None

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> Kubelet:
        self._serve_logs()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        if self._http:
            self._http.shutdown()
            self._http.server_close()
        for p in self.procs.values():
            _kill(p, signal.SIGKILL)
            if p is not None:
                with contextlib.suppress(Exception):
                    p.wait(5)
        self.procs.clear()
        with contextlib.suppress(Exception):
            self._api_client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - keep the node alive; tests see the effects
                self.errors.append(repr(e))
            time.sleep(0.1)

    # -- nodes ---------------------------------------------------------------------------------
    def add_node(
        self,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        gpus: int | None = None,
    ) -> str:
        """A node kwok keeps Ready, with ``gpus`` ``nvidia.com/gpu`` and room for pods."""
        name = name or f"node-{next(self._n)}"
        labels = {**(labels or {}), KWOK_LABEL[0]: KWOK_LABEL[1], "kubernetes.io/hostname": name}
        gpus = self.gpus_per_node if gpus is None else gpus
        res = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        body: dict[str, Any] = {
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints or []},
            "status": {"capacity": res, "allocatable": res},
        }
        self.api.create_node(body)
        with self._lock:
            self.nodes[name] = labels
        return name

    def wait_ready(self, name: str, timeout: float = 30.0) -> None:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            node = self.api.read_node(name)
            conds = {c.type: c.status for c in (node.status.conditions or [])}
            taints = [t.key for t in node.spec.taints or []]
            if conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                return
            time.sleep(0.2)
        raise TimeoutError(f"node {name} not Ready after {timeout} s")

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> None:
        with self._lock:
            pods = self.api.list_pod_for_all_namespaces().items
            seen = set()
            for pod in pods:
                key = f"{pod.metadata.namespace}/{pod.metadata.name}"
                node = pod.spec.node_name
                if node and node not in self.lost and self._runs_here(node):
                    seen.add(key)
                    self._tend(key, pod)
                elif (
                    not node
                    and self.autoscale
                    and pod.metadata.namespace not in self.leave_to_karpenter
                    and _unschedulable(pod)
                ):
                    self._provision(pod, pods)
            for key in [k for k in self.procs if k not in seen]:
                _kill(self.procs.pop(key), signal.SIGKILL)  # gone from the API, or its node
            self._give_back(pods)
            self._start_karpenter_nodes()

    def _start_karpenter_nodes(self) -> None:
        """Adopt Karpenter's nodes, and lift their startup taint once Karpenter registered them
        (at most every 0.25 s; a conflicting update is tried again on the next scan)."""
        from kubernetes.client.exceptions import ApiException

        now = time.monotonic()
        if not self.leave_to_karpenter or now < self._next_node_scan:
            return
        self._next_node_scan = now + 0.25
        for node in self.api.list_node(label_selector=KARPENTER_NODEPOOL).items:
            if node.metadata.name in self.nodes or not _karpenters(node):
                continue  # one of ours that only carries the label (a pod's node selector)
            self.adopted.add(node.metadata.name)
            taints = [t.to_dict() for t in node.spec.taints or []]
            if (node.metadata.labels or {}).get(REGISTERED_LABEL) != "true" or not any(
                t["key"] == STARTUP_TAINT["key"] for t in taints
            ):
                continue
            body = {
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": [_camel(t) for t in taints if t["key"] != STARTUP_TAINT["key"]]},
            }
            with contextlib.suppress(ApiException):  # 409: changed meanwhile, next scan
                self.api.patch_node(node.metadata.name, body)

    def _runs_here(self, node: str) -> bool:
        """A node we made, or one of Karpenter's (adopted the first time a pod is bound to it,
        while some namespace is left to Karpenter: no extra API call otherwise)."""
        if node in self.nodes or node in self.adopted:
            return True
        if node in self._foreign or not self.leave_to_karpenter:
            return False
        from kubernetes.client.exceptions import ApiException

        try:
            n = self.api.read_node(node)
        except ApiException as e:
            if e.status == 404:
                return False  # gone (or not there yet): asked again next time
            raise
        if _karpenters(n):
            self.adopted.add(node)
            return True
        self._foreign.add(node)
        return False

    def _tend(self, key: str, pod: Any) -> None:
        phase = pod.status.phase if pod.status else None
        if phase in ("Succeeded", "Failed"):
            if pod.metadata.deletion_timestamp is not None:
                self._final_delete(pod)
            return
        if pod.metadata.deletion_timestamp is not None:
            self._terminate(key, pod)
            return
        if key in self.shutting:
            self._finish_shutdown(key, pod)
            return
        if key not in self.procs:
            if (pod.metadata.labels or {}).get(
                "airflow-spot/probe"
            ) == "true" or not pod.spec.containers:
                self._running(pod, None)
                self.procs[key] = None  # nothing runs: a pause container
                return
            self._start_container(key, pod)
            return
        proc = self.procs[key]
        if proc is None:
            return
        self._write_annotations(pod)
        rc = proc.poll()
        if rc is not None:
            self._terminated(pod, rc)
            return
        self._maybe_reclaim(key, pod)

    def _start_container(self, key: str, pod: Any) -> None:
        c = pod.spec.containers[0]
        env = {**os.environ, **self._container_env(pod, c)}
        podinfo = self.workdir / pod.metadata.namespace / pod.metadata.name
        podinfo.mkdir(parents=True, exist_ok=True)
        env["AIRFLOW_SPOT_NOTICE_ANNOTATIONS"] = str(podinfo / "annotations")
        if "AIRFLOW_SPOT_HOLD" in env:  # a held pod waits on the same (downward-API) file
            env["AIRFLOW_SPOT_HOLD"] = str(podinfo / "annotations")
        self._write_annotations(pod)
        with open(podinfo / "container.log", "ab") as log:
            self.procs[key] = subprocess.Popen(
                list(c.command or []) + list(c.args or []),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started[key] = time.time()
        if (pod.metadata.labels or {}).get(CAPACITY_LABEL) == "spot":
            self.spot_ordinal[key] = len(self.spot_ordinal) + 1
        self._running(pod, c)

    def _running(self, pod: Any, c: Any) -> None:
        now = now_iso()
        status: dict[str, Any] = {
            "phase": "Running",
            "startTime": now,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
        }
        if c is not None:
            status["containerStatuses"] = [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
            ]
        self.api.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )

    def _terminated(self, pod: Any, rc: int, **extra: Any) -> None:
        c = pod.spec.containers[0]
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        self.procs.pop(key, None)
        now = now_iso()
        ready = [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
            for t in ("Ready", "ContainersReady")
        ]
        conditions = ready + extra.pop("conditions", [])
        status = {
            "phase": "Succeeded" if rc == 0 else "Failed",
            **extra,
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": rc if rc >= 0 else 128 - rc,
                            "reason": "Completed" if rc == 0 else "Error",
                            **(
                                {"startedAt": _iso(self.started[key])}
                                if key in self.started
                                else {}
                            ),
                            "finishedAt": now,
                            **self._termination_message(pod, c, rc),
                        }
                    },
                }
            ],
        }
        self.api.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )

    def _terminate(self, key: str, pod: Any) -> None:
        """The pod is being deleted: SIGTERM, SIGKILL after its grace (capped), status, delete."""
        proc = self.procs.get(key)
        if proc is not None and proc.poll() is None:
            grace = pod.metadata.deletion_grace_period_seconds
            grace = 30.0 if grace is None else float(grace)
            _kill(proc, signal.SIGTERM)
            try:
                proc.wait(min(grace, self.grace_cap_s))
            except subprocess.TimeoutExpired:
                _kill(proc, signal.SIGKILL)
                proc.wait()
        if key in self.procs:
            rc = proc.returncode if proc is not None else 0
            self._terminated(pod, rc if rc is not None else 137)
        self._final_delete(pod)

    def _final_delete(self, pod: Any) -> None:
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        with contextlib.suppress(Exception):
            self.api.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                body=V1DeleteOptions(
                    grace_period_seconds=0, preconditions=V1Preconditions(uid=pod.metadata.uid)
                ),
            )

    # -- the cloud -------------------------------------------------------------------------------
    def _provision(self, pod: Any, pods: list) -> None:
        """A node for a pod that fits nowhere (one per pod, as Karpenter would)."""
        spot = (pod.metadata.labels or {}).get(CAPACITY_LABEL) == "spot" or any(
            (pod.spec.node_selector or {}).get(k) == v for k, v in SPOT_LABELS.items()
        )
        if spot and (not self.spot_available or not self._spot_room()):
            return
        if any(p.status.nominated_node_name for p in [pod] if p.status):
            return
        waiting = [
            n
            for n, labels in self.nodes.items()
            if labels.get("airflow-spot/made-for") == pod.metadata.uid
        ]
        if waiting:
            return
        labels = dict(pod.spec.node_selector or {})
        labels["airflow-spot/made-for"] = pod.metadata.uid
        taints = [
            {"key": t.key, "value": t.value or "", "effect": t.effect}
            for t in pod.spec.tolerations or []
            if t.operator in (None, "Equal")
            and t.effect == "NoSchedule"
            and t.key
            and not t.key.startswith("node.kubernetes.io/")
        ]
        kind = "spot" if spot else "od"
        self.add_node(f"{kind}-{next(self._n)}", labels, taints)

    def _give_back(self, pods: list) -> None:
        """A node we made for a pod is deleted once it has been empty a while."""
        busy = {p.spec.node_name for p in pods if p.spec.node_name}
        now = time.monotonic()
        for node, labels in list(self.nodes.items()):
            if "airflow-spot/made-for" not in labels or node in busy:
                self.empty_since.pop(node, None)
                continue
            since = self.empty_since.setdefault(node, now)
            if now - since >= self.give_back_after_s:
                with contextlib.suppress(Exception):
                    self.api.delete_node(node)
                self.nodes.pop(node, None)
                self.empty_since.pop(node, None)
                self.released.append(node)

    def _maybe_reclaim(self, key: str, pod: Any) -> None:
        ordinal = self.spot_ordinal.get(key)
        if ordinal in self.plan and time.time() - self.started[key] >= self.plan[ordinal][1]:
            how = self.plan.pop(ordinal)[0]
            self.reclaim(pod.spec.node_name, how)
            if not self.plan and self.spot_gone_after_plan:
                self.spot_available = False

    def reclaim(self, node: str, how: str) -> None:
        """Take spot node ``node`` away, ``how`` being one of :data:`RECLAIMS`."""
        if how not in RECLAIMS:
            raise ValueError(f"how={how!r}: one of {', '.join(RECLAIMS)}")
        with self._lock:
            on = [
                p
                for p in self.api.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}"
                ).items
            ]
            for p in on:
                self.reclaimed.append((p.metadata.name, node, how))
            if how == "delete":
                self._lose(node, on)
                self.api.delete_node(node)
                self.nodes.pop(node, None)
            elif how == "unreachable":
                self._lose(node, on)
                labels = dict(self.nodes[node])
                self.api.patch_node(node, {"metadata": {"labels": {KWOK_LABEL[0]: None}}})
                labels.pop(KWOK_LABEL[0], None)
                self.nodes[node] = labels
            elif how == "drain":
                self._notice(node)
                for p in on:
                    self.evict(p.metadata.name, p.metadata.namespace)
            else:
                for p in on:
                    key = f"{p.metadata.namespace}/{p.metadata.name}"
                    proc = self.procs.get(key)
                    if proc is not None:
                        _kill(proc, signal.SIGTERM)
                    self.shutting[key] = time.time()

    def reclaim_all(self, nodes: list[str], how: str) -> None:
        """Take several spot nodes at once (a zone's capacity gone): no pod of one is tended
        (its exit written) between their reclaims."""
        with self._lock:
            for node in nodes:
                self.reclaim(node, how)

    def _lose(self, node: str, on: list) -> None:
        """The machine under ``node`` is gone: whatever ran there dies with it."""
        self.lost.add(node)
        for p in on:
            proc = self.procs.pop(f"{p.metadata.namespace}/{p.metadata.name}", None)
            if proc is not None:
                _kill(proc, signal.SIGKILL)
                proc.wait()

    def _finish_shutdown(self, key: str, pod: Any) -> None:
        proc = self.procs.get(key)
        if proc is not None and proc.poll() is None:
            if time.time() - self.shutting[key] < self.grace_cap_s:
                return
            _kill(proc, signal.SIGKILL)
            proc.wait()
        self.shutting.pop(key)
        cond = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "TerminationByKubelet",
            "message": SHUTDOWN_MSG,
            "lastTransitionTime": now_iso(),
        }
        rc = proc.returncode if proc is not None else 143
        self._terminated(
            pod,
            rc if rc is not None else 137,
            reason="Terminated",
            message=SHUTDOWN_MSG,
            conditions=[cond],
        )

    def _notice(self, node: str) -> None:
        """Karpenter's spot interruption: a Warning event on the node and its disrupted taint."""
        uid = self.api.read_node(node).metadata.uid
        self.api.create_namespaced_event(
            "default",
            {
                "metadata": {"name": f"{node}.{uuid.uuid4().hex[:16]}"},
                "reason": "SpotInterrupted",
                "type": "Warning",
                "message": "Spot interruption warning was triggered",
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
                "source": {"component": "karpenter"},
                "firstTimestamp": now_iso(),
                "lastTimestamp": now_iso(),
                "count": 1,
            },
        )
        node_obj = self.api.read_node(node)
        taints = [t.to_dict() for t in node_obj.spec.taints or []]
        if any(t["key"] == "karpenter.sh/disrupted" for t in taints):
            return  # noticed before (a drain after its notice)
        taints.append({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})
        self.api.patch_node(node, {"spec": {"taints": [_camel(t) for t in taints]}})

    def evict(self, name: str, namespace: str = "default") -> None:
        """Evict a pod through the Eviction API (policy/v1), as a drain does."""
        from kubernetes.client import V1Eviction, V1ObjectMeta

        self.api.create_namespaced_pod_eviction(
            name, namespace, V1Eviction(metadata=V1ObjectMeta(name=name, namespace=namespace))
        )

    # -- a count trace -------------------------------------------------------------------------
    def spot_nodes(self) -> list[str]:
        """The spot nodes the cloud holds now (ours, not lost)."""
        with self._lock:
            return [n for n in self.nodes if n.startswith("spot-") and n not in self.lost]

    def _spot_room(self) -> bool:
        return self.spot_limit is None or len(self.spot_nodes()) < self.spot_limit

    def set_spot_count(self, count: int | None, how: str = "delete", seed: int = 0) -> list[str]:
        """The cloud now has ``count`` spot nodes (None: no limit): those above it go, the
        empty ones first, then busy ones drawn (seeded: a count trace says how many, not
        which) and reclaimed ``how``; returns the nodes taken."""
        import random

        with self._lock:
            self.spot_limit = count
            have = self.spot_nodes()
            excess = 0 if count is None else len(have) - count
            if excess <= 0:
                return []
            pods = self.api.list_pod_for_all_namespaces().items
            busy = {p.spec.node_name for p in pods if p.spec.node_name}
            taken = sorted(n for n in have if n in busy)
            random.Random(f"{seed}:{len(self.reclaimed)}").shuffle(taken)
            victims = (sorted(n for n in have if n not in busy) + taken)[:excess]
            for node in victims:
                if node in busy:
                    self.reclaim(node, how)
                    continue
                with contextlib.suppress(Exception):
                    self.api.delete_node(node)
                self.nodes.pop(node, None)
            return victims

    def follow(self, trace: list[tuple[float, int]], how: str = "delete", seed: int = 0) -> None:
        """Follow a count trace in the background: at each ``(seconds from now, count)`` the
        cloud has ``count`` spot nodes (:meth:`set_spot_count`); :meth:`stop_trace` ends it."""
        self.stop_trace()
        stop = self._trace_stop = threading.Event()
        t0 = time.monotonic()

        def run() -> None:
            for at, count in trace:
                if stop.wait(max(0.0, t0 + at - time.monotonic())):
                    return
                try:
                    self.set_spot_count(count, how, seed)
                except Exception as e:  # noqa: BLE001 - the tests see the effects
                    self.errors.append(f"trace: {e!r}")

        self._trace = threading.Thread(target=run, name="count-trace", daemon=True)
        self._trace.start()

    def stop_trace(self) -> None:
        """Stop following a count trace (the limit it set stays)."""
        self._trace_stop.set()
        if self._trace is not None:
            self._trace.join(5)
            self._trace = None

    # -- the container's environment -------------------------------------------------------------
    def _container_env(self, pod: Any, c: Any) -> dict[str, str]:
        """The container's variables: values as given (a pod's name under a headless Service
        answered with the emulated network's one address), ``valueFrom.fieldRef`` resolved
        from the pod as the downward API does."""
        out: dict[str, str] = {}
        for e in c.env or []:
            if e.value is not None:
                out[e.name] = self._resolve(e.value, pod.metadata.namespace)
            elif e.value_from is not None and e.value_from.field_ref is not None:
                value = _field(pod, e.value_from.field_ref.field_path)
                if value is not None:
                    out[e.name] = value
        return out

    def _resolve(self, value: str, namespace: str) -> str:
        """``value``, or 127.0.0.1 if cluster DNS would answer it with a pod's address."""
        m = _POD_DNS.fullmatch(value)
        if m is None or (m[5] and m[5] != namespace):
            return value
        from kubernetes.client.exceptions import ApiException

        try:
            svc = self.api.read_namespaced_service(m[3], namespace)
        except ApiException:
            return value
        return "127.0.0.1" if svc.spec.cluster_ip == "None" else value

    def _termination_message(self, pod: Any, c: Any, rc: int) -> dict[str, str]:
        """A failed container's message under ``FallbackToLogsOnError``: its log's last 80
        lines, at most 2048 bytes, as the kubelet writes it."""
        if rc == 0 or c.termination_message_policy != "FallbackToLogsOnError":
            return {}
        path = self.workdir / pod.metadata.namespace / pod.metadata.name / "container.log"
        with contextlib.suppress(OSError):
            tail = path.read_bytes().splitlines()[-80:]
            return {"message": b"\n".join(tail)[-2048:].decode("utf-8", "replace")}
        return {}

    # -- files -------------------------------------------------------------------------------
    def _write_annotations(self, pod: Any) -> None:
        podinfo = self.workdir / pod.metadata.namespace / pod.metadata.name
        podinfo.mkdir(parents=True, exist_ok=True)
        ann = pod.metadata.annotations or {}
        text = "\n".join(f'{k}="{v}"' for k, v in sorted(ann.items()))
        path = podinfo / "annotations"
        if not path.exists() or path.read_text() != text:
            tmp = podinfo / ".annotations.tmp"
            tmp.write_text(text)
            tmp.replace(path)

    def _serve_logs(self) -> None:
        """The kubelet's ``/containerLogs/<ns>/<pod>/<container>`` over HTTPS on 127.0.0.1."""
        root = self.workdir

        class Logs(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                m = re.match(r"/containerLogs/([^/]+)/([^/]+)/([^/?]+)(?:\?(.*))?$", self.path)
                path = root / m[1] / m[2] / "container.log" if m else None
                if path is None or not path.exists():
                    self.send_error(404)
                    return
                lines = path.read_bytes().splitlines(keepends=True)
                tail = re.search(r"tailLines=(\d+)", m[4] or "") if m else None
                if tail:
                    lines = lines[-int(tail[1]) :]
                body = b"".join(lines)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        ca = pki.Authority(self.workdir / ".kubelet-pki")
        pair = ca.issue("kubelet", "kubelet", server=True, ips=("127.0.0.1",), dns=("localhost",))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Logs)
        self._http.socket = ctx.wrap_socket(self._http.socket, server_side=True)
        threading.Thread(target=self._http.serve_forever, name="kubelet-logs", daemon=True).start()


def _karpenters(node: Any) -> bool:
    """Made by Karpenter's kwok provider: its NodePool's label and a ``kwok://`` provider ID."""
    labels = node.metadata.labels or {}
    return KARPENTER_NODEPOOL in labels and (node.spec.provider_id or "").startswith("kwok://")


def _unschedulable(pod: Any) -> bool:
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return True
    return False


def _camel(t: dict) -> dict:
    out = {"key": t.get("key"), "effect": t.get("effect")}
    if t.get("value"):
        out["value"] = t["value"]
    return out


def _kill(proc: subprocess.Popen | None, sig: int) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# <hostname>.<service>[.<namespace>.svc[.cluster.local]]: a pod's name in cluster DNS
_POD_DNS = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z]([-a-z0-9]*[a-z0-9])?)"
    r"(?:\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?)?"
)


def _field(pod: Any, path: str) -> str | None:
    """A downward-API ``fieldPath`` of the pod, as the kubelet resolves it."""
    meta = pod.metadata
    m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
    if m:
        return ((meta.annotations if m[1] == "annotations" else meta.labels) or {}).get(m[2])
    return {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }.get(path)
