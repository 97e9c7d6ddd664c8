"""Test doubles for a Kubernetes cluster, for our tests and our users' tests.

* :class:`FakeKube`: an in-memory Kubernetes API server over HTTP on 127.0.0.1 (kmock's
  emulator behind aiohttp, in a thread of its own), with server-side defaults, selectors and
  watch fixes added. Faster than :mod:`airflow_spot.testing_cluster` (a real control plane,
  which every Kubernetes behaviour the README claims is tested on), and far less exact: it
  validates nothing and has no scheduler, eviction or controllers.
* :class:`FakeCloud`: a kubelet and a cloud that schedule pods onto spot or on-demand nodes,
  run each pod's command as a local process, and inject every preemption signal in the shape
  a real cluster produces it.

Needs the dev dependency ``kmock``. No test of ours runs on it any more: every Kubernetes
behaviour is tested on the real control plane (``tests/backends/kubernetes/real/``);
``tests/fixtures/upgrade/capture.py`` still drives the backend on it to capture the stored
state of earlier releases. ``autoscaler_status`` lives in
:mod:`airflow_spot.testing_cluster.autoscaler` (imported here for ``FakeCloud``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import os as _os
import re
import signal as _signal
import subprocess as _subprocess
import threading
import time as _time
import uuid
from pathlib import Path

import aiohttp.test_utils
import aiohttp.web
import kmock

from airflow_spot.testing_cluster.autoscaler import autoscaler_status

_rv = itertools.count(1)


def _path(obj, dotted):  # "involvedObject.name" -> obj["involvedObject"]["name"]
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def _match_labels(labels, selector):
    for term in filter(None, (t.strip() for t in re.split(r",(?![^()]*\))", selector))):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\((.*)\)", term):
            vals = {v.strip() for v in m[3].split(",")}
            if (labels.get(m[1]) in vals) != (m[2] == "in"):
                return False
        elif m := re.fullmatch(r"([\w./-]+)\s*(!=|==|=)\s*(.*)", term):
            if (labels.get(m[1]) == m[3]) != (m[2] != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _match_fields(obj, selector):
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, op, val = re.fullmatch(r"([\w.]+)\s*(!=|==|=)\s*(.*)", term).groups()
        if (_path(obj, key) == val) != (op != "!="):
            return False
    return True


class Emulator(kmock.KubernetesEmulator):
    """Set emulator.pod_logs[(ns, name)] = "text" to serve pods/log, or emulator.log_root to
    serve FakeCloud's container logs (``<log_root>/<pod>/container.log``); emulator.forbidden
    to answer 403 for resources RBAC would forbid.
    Adds server-side defaults on create, resourceVersion bumps, label/field selectors."""

    log_root: Path | None = None
    # resources RBAC forbids: "configmaps" (anywhere) or "configmaps/kube-system" (one namespace)
    forbidden: frozenset[str] = frozenset()
    keep_history = False  # kmock re-scans ALL past requests per request: O(n) latency growth

    async def __call__(self, raw):
        # kubernetes/kubernetes_asyncio send "?watch=True"; kmock only recognises "watch=true".
        if raw.method == "GET" and raw.query.get("watch", "").lower() in ("true", "1"):
            raw = raw.clone(rel_url=raw.rel_url.update_query(watch="true"))
        try:
            return await super().__call__(raw)
        finally:  # forget the finished request (kmock.requests history is then unavailable)
            if not self.keep_history:
                for lst in [self._requests] + [p._requests for p in self._payloads]:
                    lst[:] = [r for r in lst if r._raw_request is not raw]

    async def _handle(self, request):
        plural = request.resource.plural if request.resource is not None else None
        if request.action == kmock.action.DELETE and plural == "pods" and request.name:
            # FakeCloud(kube=...): the container is stopped (SIGTERM, its grace) before the pod
            # goes, as a kubelet does while the pod is Terminating
            grace = request.params.get("gracePeriodSeconds")
            for hook in getattr(self, "pod_delete_hooks", ()):
                await asyncio.to_thread(
                    hook, request.namespace, request.name, None if grace is None else int(grace)
                )
        if plural and {plural, f"{plural}/{request.namespace}"} & set(self.forbidden):
            raise kmock.KubernetesError(
                status=403,
                reason="Forbidden",
                message=f'{plural} is forbidden: User "system:serviceaccount:airflow:worker" '
                f'cannot {request.method.lower()} resource "{plural}" in namespace '
                f'"{request.namespace or ""}"',
            )
        if (
            request.subresource == "log" and request.method == "GET"
        ):  # else kmock returns the pod JSON
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].history[-1] is None:  # soft-deleted
                raise kmock.KubernetesObjectNotFoundError()
            text = getattr(self, "pod_logs", {}).get((request.namespace, request.name))
            log_file = Path(self.log_root or "/nonexistent") / request.name / "container.log"
            if text is None:
                text = log_file.read_text(errors="replace") if log_file.exists() else ""
            if request.params.get("tailLines"):
                text = "".join(text.splitlines(True)[-int(request.params["tailLines"]) :])
            return aiohttp.web.Response(text=text)
        data = request.data if isinstance(request.data, dict) else None
        if request.action == kmock.action.CREATE and data is not None:
            meta = data.setdefault("metadata", {})
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp",
                datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            if request.resource.plural == "pods":
                data.setdefault("status", {}).setdefault("phase", "Pending")
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE) and data is not None:
            data.setdefault("metadata", {})["resourceVersion"] = str(next(_rv))
        return await super()._handle(request)

    def _keep(self, request, obj):
        ls, fs = request.params.get("labelSelector"), request.params.get("fieldSelector")
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return (not ls or _match_labels(labels, ls)) and (not fs or _match_fields(obj, fs))

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        result["items"] = [o for o in result["items"] if self._keep(request, o)]
        result["metadata"]["resourceVersion"] = str(next(_rv))  # real-looking, not '...'
        return result

    async def _serve_watch(self, request):  # + selectors, + timeoutSeconds (kmock never ends)
        agen, loop = super()._serve_watch(request), asyncio.get_running_loop()
        deadline = loop.time() + float(request.params.get("timeoutSeconds") or 3600)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(agen.__anext__(), deadline - loop.time())
                except (StopAsyncIteration, TimeoutError):
                    return
                if not isinstance(event, dict) or self._keep(request, event["object"]):
                    yield event
        finally:
            await agen.aclose()


class FakeKube:
    """Start with FakeKube().start(); .url, .kubeconfig(path), .call(fn), .stop()."""

    def __init__(self):
        self.loop = self.emulator = self.url = None
        self._ready, self._thread = threading.Event(), None

    def start(self, timeout=10.0) -> FakeKube:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="fake-kube", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("fake kube-apiserver did not start")
        if isinstance(self.url, BaseException):
            raise self.url
        return self

    async def _main(self):
        try:
            self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self.emulator = Emulator()
            self.emulator.resources.load_bundled()
            # RawTestServer instead of kmock.Server: the latter also monkeypatches aiohttp's
            # TCPConnector._resolve_host process-wide (LIFO-only unpatching across threads).
            async with (
                self.emulator,
                aiohttp.test_utils.RawTestServer(self.emulator, host="127.0.0.1", port=0) as srv,
            ):
                srv.runner._shutdown_timeout = 0.2  # default 60 s: open watches would block stop()
                self.url = str(srv.make_url("")).rstrip("/")
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:
            self.url = e
            self._ready.set()

    def call(self, fn, *args):
        """Run fn(*args) (sync or async) on the server loop, e.g. to read/seed emulator.objects."""

        async def _run():
            r = fn(*args)
            return await r if asyncio.iscoroutine(r) else r

        return asyncio.run_coroutine_threadsafe(_run(), self.loop).result(10)

    def stop(self, timeout=10.0):
        if self._thread and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)

    def kubeconfig(self, path) -> str:
        Path(path).write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{self.url}"}}}}]
users: [{{name: fake, user: {{token: sekrit}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: default}}}}]
current-context: fake
""")
        return str(path)


# --------------------------------------------------------------------------------------------
# A small kubelet + cloud: schedules pods onto spot or on-demand nodes, runs each pod's command
# as a local process (the container), emulates the downward-API annotations file, reports the
# container's exit, and injects each preemption signal in its real shape.
# --------------------------------------------------------------------------------------------

SHUTDOWN_MSG = "Pod was terminated in response to imminent node shutdown."
SIGNALS = ("karpenter", "nth", "graceful_shutdown", "pod_gc", "taint_manager", "vanish")
CAPACITY_LABEL = {
    "spot": ("karpenter.sh/capacity-type", "spot"),
    "on_demand": ("karpenter.sh/capacity-type", "on-demand"),
}


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeCloud:
    """Kubelet and cloud for one namespace, stepping in a background thread.

    ``plan`` maps the ordinal of a spot pod (1, 2, ...) to ``(signal, seconds_running)``: that
    pod is reclaimed with that signal once it has run so long. ``spot_available`` decides
    whether spot pods can be scheduled at all (``spot_gone_after_plan``: not after the plan).

    Opt-in, as a cluster shows spot (defaults keep none of it):

    * ``ice_events``: a spot pod that cannot have a node gets a Karpenter-shaped Warning
      ``InsufficientCapacityError`` event on a NodeClaim (type and zone from its selector, else
      ``ice_instance_type`` / ``ice_zone``);
    * ``autoscaler_group``: the name of a cluster-autoscaler spot node group: the
      ``kube-system/cluster-autoscaler-status`` ConfigMap (v1.30+ YAML) shows it in ``Backoff``
      while spot cannot be had, a refused pod gets ``NotTriggerScaleUp ... in backoff``, and a
      pod waiting for its node ``TriggeredScaleUp``;
    * ``node_launch_delay_s``: a pod waits this long for its node;
    * ``gpus_per_node``: each node's allocatable ``nvidia.com/gpu``;
    * ``kube``: the :class:`FakeKube` serving ``kubeconfig``: a pod deleted with a grace period
      is then stopped as a kubelet stops it (SIGTERM, then SIGKILL after the grace, at most
      ``grace_s``) before the API answers; without it the container is killed once the pod
      is seen gone.

    A probe (label ``airflow-spot/probe=true``) runs nothing: while spot can be had it gets a
    node of its own (labelled with its node selector) and is bound there; once it is deleted,
    its empty node is given back (deleted).
    """

    def __init__(
        self,
        kubeconfig: str,
        workdir: str | Path,
        namespace: str = "default",
        plan: dict[int, tuple[str, float]] | None = None,
        grace_s: float = 3.0,
        spot_gone_after_plan: bool = False,
        *,
        ice_events: bool = False,
        ice_instance_type: str = "g4dn.xlarge",
        ice_zone: str = "eu-west-3b",
        autoscaler_group: str | None = None,
        node_launch_delay_s: float = 0.0,
        gpus_per_node: int = 0,
        kube: FakeKube | None = None,
    ) -> None:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        self.api = KubernetesHook(config_file=kubeconfig).core_v1_client
        self.ns = namespace
        self.workdir = Path(workdir)
        self.plan = dict(plan or {})
        self.grace_s = grace_s
        self.spot_available = True
        self.blocked_selectors: list[
            dict[str, str]
        ] = []  # spot pools (by node selector) with no capacity
        self.spot_gone_after_plan = spot_gone_after_plan
        self.procs: dict[str, _subprocess.Popen] = {}
        self.started: dict[str, float] = {}
        self.spot_ordinal: dict[str, int] = {}
        self.injected: list[tuple[str, str]] = []  # (pod, signal)
        self.reclaiming: dict[str, tuple[str, float]] = {}  # pod -> (signal, when the notice began)
        self.ice_events = ice_events
        self.ice_instance_type, self.ice_zone = ice_instance_type, ice_zone
        self.autoscaler_group = autoscaler_group
        self.node_launch_delay_s = node_launch_delay_s
        self.gpus_per_node = gpus_per_node
        self.first_seen: dict[str, float] = {}  # pod -> when it was first seen pending
        self.told: set[tuple[str, str]] = set()  # (pod, event reason) written once
        self.probe_nodes: dict[str, str] = {}  # probe -> the node made for it
        self.released: list[str] = []  # nodes given back after their probe went
        self._backoff_shown: bool | None = None  # what the status ConfigMap shows
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._n = itertools.count(1)
        if kube is not None:
            em = kube.emulator
            em.pod_delete_hooks = [*getattr(em, "pod_delete_hooks", ()), self._stop_container]

    # -- life -------------------------------------------------------------------------------
    def start(self) -> FakeCloud:
        self._thread = threading.Thread(target=self._loop, name="fake-cloud", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        for p in self.procs.values():
            self._kill(p, _signal.SIGKILL)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - keep the cluster alive; tests see the effects
                print(f"fake cloud step failed: {e!r}")
            _time.sleep(0.05)

    def _stop_container(self, namespace: str, name: str, grace: int | None) -> None:
        """A pod is being deleted: SIGTERM, up to its grace (at most ``grace_s``), SIGKILL."""
        proc = self.procs.get(name)
        if namespace != self.ns or proc is None or proc.poll() is not None:
            return
        if grace is None or grace > 0:
            self._kill(proc, _signal.SIGTERM)
            with contextlib.suppress(_subprocess.TimeoutExpired):
                proc.wait(min(self.grace_s, 30.0 if grace is None else float(grace)))
        self._kill(proc, _signal.SIGKILL)
        proc.wait()

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> None:
        pods = {p.metadata.name: p for p in self.api.list_namespaced_pod(self.ns).items}
        for name in list(self.procs):
            if name not in pods:  # deleted: the container goes with it
                self._kill(self.procs.pop(name), _signal.SIGKILL)
        for name, pod in pods.items():
            phase = pod.status.phase if pod.status else "Pending"
            if (pod.metadata.labels or {}).get("airflow-spot/probe") == "true":
                self._tend_probe(pod)
            elif phase == "Pending" and name not in self.procs:
                self._schedule(pod)
            elif name in self.procs:
                self._tend(pod)
        for probe in [p for p in self.probe_nodes if p not in pods]:
            self._give_back(self.probe_nodes.pop(probe), pods)
        if self.autoscaler_group:
            self._show_status()

    def _spot_refused(self, pod) -> bool:
        """Spot cannot be had for this pod (none at all, or its pool is blocked)."""
        selector = pod.spec.node_selector or {}
        blocked = any(
            all(selector.get(k) == v for k, v in b.items()) for b in self.blocked_selectors
        )
        return not self.spot_available or blocked

    def _waiting(self, pod) -> bool:
        """Its node is still being made (``node_launch_delay_s``): the autoscaler says so."""
        name = pod.metadata.name
        seen = self.first_seen.setdefault(name, _time.time())
        if _time.time() - seen >= self.node_launch_delay_s:
            return False
        if self.autoscaler_group:
            self._tell(
                pod,
                "TriggeredScaleUp",
                "Normal",
                f"pod triggered scale-up: [{{{self.autoscaler_group} 0->1 (max: 8)}}]",
            )
        return True

    def _unschedulable(self, name: str) -> None:
        self.api.patch_namespaced_pod_status(
            name,
            self.ns,
            {
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/3 nodes are available: no spot capacity",
                        }
                    ],
                }
            },
        )

    def _schedule(self, pod) -> None:
        cap = (pod.metadata.labels or {}).get("airflow-spot/capacity", "on_demand")
        name = pod.metadata.name
        if cap == "spot" and self._spot_refused(pod):
            self._unschedulable(name)
            self._refuse(pod)
            return
        if self.node_launch_delay_s and self._waiting(pod):
            return
        # as on a real cluster that adds a node per pod (Karpenter, cluster autoscaler): the
        # scheduler first reports that no node fits, in words that mention preemption
        self.api.create_namespaced_event(
            self.ns,
            {
                "metadata": {"name": f"{name}.failed-scheduling"},
                "reason": "FailedScheduling",
                "type": "Warning",
                "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node "
                "affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is "
                "not helpful for scheduling.",
                "involvedObject": {
                    "kind": "Pod",
                    "name": name,
                    "namespace": self.ns,
                    "uid": pod.metadata.uid,
                },
                "lastTimestamp": _now_iso(),
            },
        )
        node = self._new_node(cap, {})
        self.api.patch_namespaced_pod(name, self.ns, {"spec": {"nodeName": node}})
        c = pod.spec.containers[0]
        env = {**_os.environ, **{e.name: e.value for e in c.env or []}}
        podinfo = self.workdir / name
        podinfo.mkdir(parents=True, exist_ok=True)
        env["AIRFLOW_SPOT_NOTICE_ANNOTATIONS"] = str(podinfo / "annotations")
        if "AIRFLOW_SPOT_HOLD" in env:  # a held pod waits on the same (downward-API) file
            env["AIRFLOW_SPOT_HOLD"] = str(podinfo / "annotations")
        self._write_annotations(pod, podinfo)
        log = open(podinfo / "container.log", "ab")  # noqa: SIM115
        self.procs[name] = _subprocess.Popen(
            list(c.command) + list(c.args or []),
            env=env,
            stdout=log,
            stderr=_subprocess.STDOUT,
            start_new_session=True,
        )
        self.started[name] = _time.time()
        if cap == "spot":
            self.spot_ordinal[name] = len(self.spot_ordinal) + 1
        now = _now_iso()
        self.api.patch_namespaced_pod_status(
            name,
            self.ns,
            {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    ],
                    "containerStatuses": [
                        {
                            "name": "train",
                            "image": c.image,
                            "imageID": "",
                            "ready": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": now}},
                        }
                    ],
                }
            },
        )

    def _new_node(self, cap: str, labels: dict[str, str]) -> str:
        """A Ready node of capacity ``cap`` (with ``labels``, and GPUs if asked for)."""
        node = f"{cap.replace('_', '-')}-node-{next(self._n)}"
        key, value = CAPACITY_LABEL[cap]
        status: dict = {
            "conditions": [
                {"type": "Ready", "status": "True", "message": "kubelet is posting ready status"}
            ]
        }
        if self.gpus_per_node:
            gpus = {"nvidia.com/gpu": str(self.gpus_per_node)}
            status["capacity"], status["allocatable"] = dict(gpus), dict(gpus)
        self.api.create_node(
            {"metadata": {"name": node, "labels": {**labels, key: value}}, "status": status}
        )
        return node

    def _tell(self, pod, reason: str, kind: str, message: str) -> None:
        """An event on ``pod``, once per reason (a real one repeats with a count)."""
        name = pod.metadata.name
        if (name, reason) in self.told:
            return
        self.told.add((name, reason))
        self.api.create_namespaced_event(
            self.ns,
            {
                "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}"},
                "reason": reason,
                "type": kind,
                "message": message,
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "namespace": self.ns,
                    "uid": pod.metadata.uid,
                },
                "source": {"component": "cluster-autoscaler"},
                "count": 1,
                "firstTimestamp": _now_iso(),
                "lastTimestamp": _now_iso(),
            },
        )

    def _refuse(self, pod) -> None:
        """What the cluster shows when a spot pod cannot have a node: Karpenter's ICE event on
        a NodeClaim it made and deleted, and/or the autoscaler's backoff."""
        name = pod.metadata.name
        if self.ice_events and (name, "InsufficientCapacityError") not in self.told:
            self.told.add((name, "InsufficientCapacityError"))
            sel = pod.spec.node_selector or {}
            kind = sel.get("node.kubernetes.io/instance-type", self.ice_instance_type)
            zone = sel.get("topology.kubernetes.io/zone", self.ice_zone)
            claim = f"{sel.get('karpenter.sh/nodepool', 'default')}-{uuid.uuid4().hex[:5]}"
            self.api.create_namespaced_event(
                "default",  # a NodeClaim is cluster-scoped: its events go to "default"
                {
                    "metadata": {"name": f"{claim}.{uuid.uuid4().hex[:16]}"},
                    "reason": "InsufficientCapacityError",
                    "type": "Warning",
                    "message": f"NodeClaim {claim} event: insufficient capacity, with fleet "
                    f"error(s), InsufficientInstanceCapacity: We currently do not have "
                    f"sufficient {kind} capacity in the Availability Zone you requested "
                    f"({zone}). Our system will be working on provisioning additional capacity.",
                    "involvedObject": {
                        "apiVersion": "karpenter.sh/v1",
                        "kind": "NodeClaim",
                        "name": claim,
                        "uid": str(uuid.uuid4()),
                    },
                    "source": {"component": "karpenter"},
                    "reportingComponent": "karpenter",
                    "count": 1,
                    "firstTimestamp": _now_iso(),
                    "lastTimestamp": _now_iso(),
                },
            )
        if self.autoscaler_group:
            self._tell(
                pod,
                "NotTriggerScaleUp",
                "Normal",
                "pod didn't trigger scale-up: 1 in backoff after failed scale-up, 2 node(s) "
                "didn't match Pod's node affinity/selector",
            )

    def _tend_probe(self, pod) -> None:
        """A probe runs nothing: bound to a node of its own while spot can be had."""
        name = pod.metadata.name
        if pod.spec.node_name or name in self.probe_nodes:
            return
        if self._spot_refused(pod):
            if (name, "Unschedulable") not in self.told:
                self.told.add((name, "Unschedulable"))
                self._unschedulable(name)
            self._refuse(pod)
            return
        if self._waiting(pod):
            return
        node = self._new_node("spot", dict(pod.spec.node_selector or {}))
        self.probe_nodes[name] = node
        self.api.patch_namespaced_pod(name, self.ns, {"spec": {"nodeName": node}})
        now = _now_iso()
        self.api.patch_namespaced_pod_status(
            name,
            self.ns,
            {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
                    ],
                }
            },
        )

    def _give_back(self, node: str, pods: dict) -> None:
        """The node made for a deleted probe goes back once nothing else is on it."""
        if any(p.spec.node_name == node for p in pods.values()):
            return
        with contextlib.suppress(Exception):
            self.api.delete_node(node)
        self.released.append(node)

    def _show_status(self) -> None:
        """The autoscaler's status ConfigMap: its spot group in Backoff while spot cannot be
        had (after a refused pod), NoActivity otherwise; written when that changes."""
        backoff = not self.spot_available or bool(self.blocked_selectors)
        backoff = backoff and any(r == "NotTriggerScaleUp" for _, r in self.told)
        if backoff == self._backoff_shown:
            return
        self._backoff_shown = backoff
        body = autoscaler_status(self.autoscaler_group or "", backoff)
        try:
            self.api.create_namespaced_config_map("kube-system", body)
        except Exception:  # noqa: BLE001 - it exists: update it
            self.api.patch_namespaced_config_map("cluster-autoscaler-status", "kube-system", body)

    def _tend(self, pod) -> None:
        name = pod.metadata.name
        proc = self.procs[name]
        self._write_annotations(pod, self.workdir / name)
        rc = proc.poll()
        if name in self.reclaiming:
            sig, since = self.reclaiming[name]
            if rc is None and _time.time() - since > self.grace_s:
                self._kill(proc, _signal.SIGKILL)
                rc = proc.wait()
            if rc is not None:
                self._finish_reclaim(pod, sig, rc)
            return
        if rc is not None:
            self.procs.pop(name)
            self._terminated(
                name, "Succeeded" if rc == 0 else "Failed", rc, "Completed" if rc == 0 else "Error"
            )
            return
        ordinal = self.spot_ordinal.get(name)
        if ordinal in self.plan and _time.time() - self.started[name] >= self.plan[ordinal][1]:
            self.inject(name, self.plan.pop(ordinal)[0])
            if not self.plan and self.spot_gone_after_plan:
                self.spot_available = False  # the market dries up: only on-demand is left

    def _write_annotations(self, pod, podinfo: Path) -> None:
        ann = pod.metadata.annotations or {}
        text = "\n".join(f'{k}="{v}"' for k, v in sorted(ann.items()))
        path = podinfo / "annotations"
        if not path.exists() or path.read_text() != text:
            tmp = podinfo / ".annotations.tmp"
            tmp.write_text(text)
            tmp.replace(path)

    def _terminated(self, name: str, phase: str, rc: int, term_reason: str, **status) -> None:
        now = _now_iso()
        self.api.patch_namespaced_pod_status(
            name,
            self.ns,
            {
                "status": {
                    "phase": phase,
                    **status,
                    "containerStatuses": [
                        {
                            "name": "train",
                            "image": "x",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {
                                    "exitCode": rc,
                                    "reason": term_reason,
                                    "finishedAt": now,
                                }
                            },
                        }
                    ],
                }
            },
        )

    # -- preemption signals -----------------------------------------------------------------
    def inject(self, name: str, sig: str) -> None:
        """Reclaim the spot node under pod ``name`` with one signal, in its real shape."""
        if sig not in SIGNALS:
            raise ValueError(f"unknown signal {sig!r}; one of {SIGNALS}")
        pod = self.api.read_namespaced_pod(name, self.ns)
        node = pod.spec.node_name
        self.injected.append((name, sig))
        proc = self.procs[name]
        if sig in ("karpenter", "nth"):  # a notice first: the operator must relay it to the pod
            if sig == "karpenter":
                self.api.create_namespaced_event(
                    "default",
                    {
                        "metadata": {"name": f"{node}.spot-interrupted"},
                        "reason": "SpotInterrupted",
                        "type": "Warning",
                        "message": "Spot interruption warning was triggered",
                        "involvedObject": {
                            "kind": "Node",
                            "name": node,
                            "uid": self.api.read_node(node).metadata.uid,
                        },
                        "lastTimestamp": _now_iso(),
                    },
                )
                taint = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
            else:
                taint = {
                    "key": "aws-node-termination-handler/spot-itn",
                    "value": "evt-1",
                    "effect": "NoSchedule",
                }
            self.api.patch_node(node, {"spec": {"taints": [taint]}})
            self.reclaiming[name] = (sig, _time.time())
        elif sig == "graceful_shutdown":
            self._kill(proc, _signal.SIGTERM)
            self.reclaiming[name] = (sig, _time.time())
        else:  # the node is gone at once
            self._kill(proc, _signal.SIGKILL)
            proc.wait()
            self.reclaiming[name] = (sig, _time.time())
            self._finish_reclaim(pod, sig, -9)

    def _finish_reclaim(self, pod, sig: str, rc: int) -> None:
        name, node = pod.metadata.name, pod.spec.node_name
        self.procs.pop(name, None)
        self.reclaiming.pop(name, None)
        if sig in ("karpenter", "nth"):
            self._terminated(
                name,
                "Failed",
                rc,
                "Error",
                conditions=[
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting",
                    }
                ],
            )
            self.api.delete_node(node)
        elif sig == "graceful_shutdown":
            self._terminated(
                name,
                "Failed",
                rc,
                "Error",
                reason="Terminated",
                message=SHUTDOWN_MSG,
                conditions=[
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "message": SHUTDOWN_MSG,
                    }
                ],
            )
        elif sig == "pod_gc":
            self.api.delete_node(node)
            self._terminated(
                name,
                "Failed",
                rc,
                "Error",
                conditions=[
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByPodGC",
                        "message": "PodGC: node no longer exists",
                    }
                ],
            )
        elif sig == "taint_manager":
            self.api.patch_node(
                node,
                {
                    "spec": {
                        "taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
                    },
                    "status": {
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "Unknown",
                                "message": "Kubelet stopped posting node status.",
                            }
                        ]
                    },
                },
            )
            self._terminated(
                name,
                "Failed",
                rc,
                "Error",
                conditions=[
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByTaintManager",
                        "message": "Taint manager: deleting due to NoExecute taint",
                    }
                ],
            )
        elif sig == "vanish":
            self.api.delete_node(node)
            self.api.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    @staticmethod
    def _kill(proc: _subprocess.Popen, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            _os.killpg(proc.pid, sig)
