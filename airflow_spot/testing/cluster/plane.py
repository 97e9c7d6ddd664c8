"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (node heartbeats and leases), each a process of its own.

The binaries are built from Go modules by ``tools/k8s/build.sh`` (issue 20) into
``~/.cache/airflow-spot/k8s/<version>/bin`` (``AIRFLOW_SPOT_K8S_BIN`` points elsewhere). Nodes
are simulated (kwok keeps them Ready); what runs on them is :class:`~.kubelet.Kubelet`'s.
Only a checkout of the repository has ``tools/k8s/``: an installed package starts a plane
from binaries built there, and says so (:func:`binaries_needed`) when they are missing.

    with ControlPlane(tmp_path).start() as cp:
        cp.add_node("spot-1", {"karpenter.sh/capacity-type": "spot"}, gpus=1)
        ... KubernetesBackend(config_file=cp.kubeconfig) ...

:meth:`ControlPlane.stop` stops every process it started, and an ``atexit`` hook does so if
the caller never does.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_spot.testing.cluster import pki

VERSION = "v1.34.4"
BIN_ENV = "AIRFLOW_SPOT_K8S_BIN"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_LABEL = ("airflow-spot/kwok", "managed")  # kwok keeps nodes with this label alive
CACHE_ENV = "AIRFLOW_SPOT_K8S_CACHE"  # build.sh's cache folder (the binaries in <version>/bin)
REPOSITORY = "https://github.com/airflow-spot/airflow-spot"
# the build script of the checkout this package runs from; an installed wheel has none
_BUILD = Path(__file__).resolve().parents[3] / "tools" / "k8s" / "build.sh"

# kwok's own node stages (sigs.k8s.io/kwok v0.8.0 kustomize/stage/node, Apache-2.0), and only
# those: any Stage given replaces all of kwok's defaults, so kwok leaves pods to our kubelet.
_KWOK_STAGES = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-initialize}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type  | Quote}}
      {{ end }}
      addresses:
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
      allocatable:
      {{ with .status.allocatable }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      nodeInfo:
        architecture: amd64
        kubeletVersion: {{ printf "kwok-%s" Version }}
        operatingSystem: linux
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-heartbeat-with-lease}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay: {durationMilliseconds: 600000, jitterDurationMilliseconds: 610000}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started (the message says which part, why)."""


def bin_dir() -> Path:
    """Where the binaries are: ``$AIRFLOW_SPOT_K8S_BIN`` or the build script's cache."""
    if os.environ.get(BIN_ENV):
        return Path(os.environ[BIN_ENV])
    root = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "airflow-spot" / "k8s")
    return Path(root) / VERSION / "bin"


def missing_binaries(where: Path | None = None) -> list[str]:
    where = where or bin_dir()
    return [b for b in BINARIES if not os.access(where / b, os.X_OK)]


def in_checkout() -> bool:
    """Whether this package runs from a checkout of the repository, whose
    ``tools/k8s/build.sh`` can build missing binaries (an installed wheel cannot)."""
    return _BUILD.exists()


def binaries_needed(where: Path, missing: Sequence[str]) -> str:
    """What a plane run from an installed package needs, and how to get it: the binaries are
    built from a checkout, where the Go modules that pin them live."""
    return (
        f"Kubernetes binaries missing from {where}: {', '.join(missing)}. This airflow_spot is "
        f"installed, not a checkout (there is no tools/k8s/build.sh in {_BUILD.parents[2]}), "
        f"and only a checkout builds them: git clone {REPOSITORY}, then run "
        "tools/k8s/build.sh there (a Go toolchain as new as tools/k8s/*/go.mod ask, and the Go "
        "module proxy; cold: about 30 min on 2 cores). It writes them to "
        f"~/.cache/airflow-spot/k8s/{VERSION}/bin (${CACHE_ENV}/{VERSION}/bin if set), where "
        f"this package looks; or set {BIN_ENV} to a folder that holds them"
    )


def ensure_binaries(build: bool = True) -> Path:
    """The binaries' folder, built first (``tools/k8s/build.sh``) when some are missing."""
    where = bin_dir()
    missing = missing_binaries(where)
    if missing and build and _BUILD.exists() and not os.environ.get(BIN_ENV):
        subprocess.run(["bash", str(_BUILD), *missing], check=True)
        missing = missing_binaries(where)
    if missing and not in_checkout():
        raise ControlPlaneError(binaries_needed(where, missing))
    if missing:
        raise ControlPlaneError(
            f"Kubernetes binaries missing from {where}: {', '.join(missing)}; build them with "
            f"tools/k8s/build.sh (cold: about 30 min on 2 cores) or set {BIN_ENV}"
        )
    return where


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(
    path: Path, server: str, ca: Path, *, pair: pki.Pair | None = None, token: str | None = None
) -> Path:
    user: dict[str, Any] = {"token": token} if token else {}
    if pair is not None:
        user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return path


def spawn(
    binary: Path, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``binary`` in a session of its own (so :func:`terminate` stops all of it), its
    output appended to ``log_path``."""
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(binary), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


def terminate(p: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the process's session, SIGKILL after ``grace_s``; waits until it is gone."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on 127.0.0.1.

    ``node_grace_s``: the controller-manager's ``--node-monitor-grace-period`` (a node whose
    lease is not renewed is NotReady after it); ``toleration_s``: the API server's default
    ``not-ready`` / ``unreachable`` NoExecute toleration (the taint manager evicts after it);
    ``kubelet_port``: the port nodes advertise for their kubelet (pods/log), if any."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        node_grace_s: int = 6,
        toleration_s: int = 2,
        lease_s: int = 4,
        kubelet_port: int | None = None,
        binaries: Path | None = None,
    ) -> None:
        self.root = Path(workdir)
        self.node_grace_s, self.toleration_s, self.lease_s = node_grace_s, toleration_s, lease_s
        self.kubelet_port = kubelet_port
        self._bin = binaries
        self.procs: dict[str, subprocess.Popen] = {}
        self.server = ""
        self.kubeconfig = ""
        self.version = ""
        self._ssl: ssl.SSLContext | None = None
        self.ca: pki.Authority | None = None

    # -- life ---------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> ControlPlane:
        where = self._bin or ensure_binaries()
        atexit.register(self.stop)
        try:
            self._start(where, time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, where: Path, until: float) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        pk = self.root / "pki"
        ca = self.ca = pki.Authority(pk)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            ips=("127.0.0.1", "10.0.0.1"),
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        )
        sa_key, sa_pub = pki.service_account_keys(pk)
        etcd_port, peer, api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        etcd = f"http://127.0.0.1:{etcd_port}"
        self._run(
            "etcd",
            where,
            "--name=cp",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={etcd}",
            f"--advertise-client-urls={etcd}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=cp=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        )
        self._run(
            "kube-apiserver",
            where,
            f"--etcd-servers={etcd}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca.cert}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            f"--default-not-ready-toleration-seconds={self.toleration_s}",
            f"--default-unreachable-toleration-seconds={self.toleration_s}",
            "--profiling=false",
            "--v=1",
        )
        admin = ca.issue("admin", "airflow-spot-admin", "system:masters")
        self.kubeconfig = str(
            write_kubeconfig(self.root / "admin.kubeconfig", self.server, ca.cert, pair=admin)
        )
        self._ssl = ssl.create_default_context(cafile=str(ca.cert))
        self._ssl.load_cert_chain(str(admin.cert), str(admin.key))
        self._wait(until, "kube-apiserver /readyz", lambda: self.get("/readyz") == "ok")
        self.version = json.loads(self.get("/version"))["gitVersion"]
        cm = write_kubeconfig(
            self.root / "cm.kubeconfig",
            self.server,
            ca.cert,
            pair=ca.issue("cm", "system:kube-controller-manager"),
        )
        self._run(
            "kube-controller-manager",
            where,
            f"--kubeconfig={cm}",
            f"--authentication-kubeconfig={cm}",
            f"--authorization-kubeconfig={cm}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--leader-elect=false",
            f"--root-ca-file={ca.cert}",
            f"--service-account-private-key-file={sa_key}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={ca.cert}",
            f"--cluster-signing-key-file={pk / 'ca.key'}",
            "--node-monitor-period=1s",
            f"--node-monitor-grace-period={self.node_grace_s}s",
            "--v=1",
        )
        sched = write_kubeconfig(
            self.root / "scheduler.kubeconfig",
            self.server,
            ca.cert,
            pair=ca.issue("scheduler", "system:kube-scheduler"),
        )
        self._run(
            "kube-scheduler",
            where,
            f"--kubeconfig={sched}",
            f"--authentication-kubeconfig={sched}",
            f"--authorization-kubeconfig={sched}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--leader-elect=false",
            "--v=1",
        )
        kwok_cfg = self.root / "kwok.yaml"
        kwok_cfg.write_text(
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
            f"  nodeLeaseDurationSeconds: {self.lease_s}\n"
            # written out: a configuration file given gets none of kwok's defaults
            "  nodeLeaseParallelism: 4\n  nodePlayStageParallelism: 4\n"
            "  podPlayStageParallelism: 4\n  podsOnNodeSyncParallelism: 1\n"
            "  enablePodsOnNodeSyncListPager: true\n  enablePodsOnNodeSyncStreamWatch: false\n"
            "  enableDebuggingHandlers: false\n---" + _KWOK_STAGES
        )
        kw = write_kubeconfig(
            self.root / "kwok.kubeconfig",
            self.server,
            ca.cert,
            pair=ca.issue("kwok", "kwok-controller", "system:masters"),
        )
        self._run(
            "kwok",
            where,
            f"--kubeconfig={kw}",
            f"--config={kwok_cfg}",
            f"--manage-nodes-with-label-selector={KWOK_LABEL[0]}={KWOK_LABEL[1]}",
            "--node-ip=127.0.0.1",
            # nodes advertise our kubelet's port; kwok's own server (else on 0.0.0.0:<that
            # port>) is kept on 127.0.0.1
            *([f"--node-port={self.kubelet_port}"] if self.kubelet_port else []),
            f"--server-address=127.0.0.1:{free_port()}",
            f"--node-lease-duration-seconds={self.lease_s}",
        )
        self._wait(
            until,
            "the default service account (made by kube-controller-manager)",
            lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"),
        )

    def stop(self) -> None:
        """Stop every process started, the last started first; SIGKILL after 10 s."""
        for name in reversed(list(self.procs)):
            terminate(self.procs.pop(name))
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -------------------------------------------------------------------------------
    def _run(self, name: str, where: Path, *args: str) -> None:
        self.procs[name] = spawn(where / name, args, self.root / f"{name}.log")

    def issue_kubeconfig(self, stem: str, cn: str, org: str | None = None) -> Path:
        """A kubeconfig for a client certificate of user ``cn`` (group ``org``) of this plane."""
        if self.ca is None:
            raise ControlPlaneError("the control plane is not started")
        pair = self.ca.issue(stem, cn, org)
        return write_kubeconfig(
            self.root / f"{stem}.kubeconfig", self.server, self.ca.cert, pair=pair
        )

    def _wait(self, until: float, what: str, ready: Any) -> None:
        last: object = None
        while time.monotonic() < until:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited {p.returncode} while waiting for {what}; its log: "
                        f"{self.root / (name + '.log')}:\n{self.log_tail(name)}"
                    )
            try:
                if ready():
                    return
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = e
            time.sleep(0.2)
        raise ControlPlaneError(f"timed out waiting for {what} (last error: {last!r})")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def get(self, path: str) -> str:
        """GET ``path`` on the API server as the admin."""
        with urllib.request.urlopen(self.server + path, context=self._ssl, timeout=5) as r:
            return r.read().decode()

    def _exists(self, path: str) -> bool:
        try:
            self.get(path)
            return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise
