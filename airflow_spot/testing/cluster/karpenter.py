"""Karpenter (``sigs.k8s.io/karpenter`` core with its ``kwok`` cloud provider) against a
:class:`~.plane.ControlPlane`: NodeClaims, nodes, consolidation and their events are the real
ones, only the instances are simulated.

``tools/k8s/build.sh karpenter-kwok`` builds it from a copy of the module whose operator binds
its metrics and health servers to 127.0.0.1 (upstream binds every interface, with no flag), and
keeps that copy, whose CRDs are applied here, beside the binaries. The same copy's kwok provider
can run out of capacity (``tools/k8s/patches/kwok_ice.go``): :meth:`Karpenter.out_of_capacity`
names offerings whose launches then fail with an ``InsufficientCapacityError``, as a cloud's do
(the test cloud's ICE; Karpenter's own handling of it is the real one). Karpenter runs outside the
cluster (kubeconfig, leader election off, no webhooks), with one KWOKNodeClass and one NodePool:

* ``karpenter.sh/capacity-type`` In [spot, on-demand, reserved], amd64 / linux; spot is the
  cheaper offering of every kwok instance type (none has GPUs). One capacity reservation
  (:data:`RESERVATION`: instance type, zone, id, capacity) is a ``reserved`` offering added to
  kwok's instance types (the file it reads, ``INSTANCE_TYPES_FILE_PATH``), which Karpenter's
  ReservedCapacity feature launches (the patched provider names its reservation label,
  :data:`RESERVATION_LABEL`); only pods that allow ``reserved`` get it;
* its nodes are tainted :data:`TAINT`, so Karpenter makes nodes only for pods that tolerate it
  (:data:`TOLERATION`) and leaves everyone else's pending pods to our kubelet's autoscaler;
* labelled for our kwok (which keeps them Ready) and adopted by our kubelet (which runs their
  pods), and started with :data:`STARTUP_TAINT`, which our kubelet removes once Karpenter has
  registered the node, as a node agent (a CNI, say) does. Without it a pending pod is bound the
  moment Karpenter lifts ``karpenter.sh/unregistered:NoExecute``, and the taint eviction
  controller, its node cache a few ms behind, sometimes deletes it at once
  (kubernetes/kubernetes#119862);
* consolidation ``WhenEmptyOrUnderutilized`` after ``consolidate_after``. Karpenter's own
  timings still apply: the disruption loop polls every 10 s and checks a decision again after
  15 s, so an empty node goes back 15-30 s after its last pod.

    with Karpenter(plane).start() as k:
        ... a pod tolerating TOLERATION, selecting karpenter.sh/nodepool=k.nodepool ...
        k.nodeclaims()  # [NodeClaim as API JSON]
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from airflow_spot.testing.cluster.plane import (
    _BUILD,
    BIN_ENV,
    KWOK_LABEL,
    ControlPlane,
    ControlPlaneError,
    bin_dir,
    binaries_needed,
    free_port,
    in_checkout,
    spawn,
    terminate,
)

KARPENTER_VERSION = "v1.14.1"  # tools/k8s/karpenter/go.mod
BINARY = "karpenter-kwok"
STAMP = "karpenter-kwok.loopback-ice-reserved"  # written by build.sh beside a patched binary
ICE_FILE_ENV = "AIRFLOW_SPOT_KWOK_ICE_FILE"  # read by the patched kwok provider at each call
ICE_TTL_ENV = "AIRFLOW_SPOT_KWOK_ICE_TTL"  # how long it lists an ICE'd offering unavailable
GROUP, VERSION = "karpenter.sh", "v1"
KWOK_GROUP, KWOK_VERSION = "karpenter.kwok.sh", "v1alpha1"
CRDS = (
    "kwok/charts/crds/karpenter.sh_nodepools.yaml",
    "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
    "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)
TAINT = {"key": "airflow-spot/karpenter", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
STARTUP_TAINT = {"key": "airflow-spot/node-agent-not-ready", "effect": "NoSchedule"}
REGISTERED_LABEL = "karpenter.sh/registered"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
RESERVATION_LABEL = "airflow-spot.test/reservation-id"  # tools/k8s/patches/kwok_ice.go
RESERVATION = {"instance_type": "c-1x-amd64-linux", "zone": "test-zone-a", "id": "kwok-cr-1",
               "capacity": 4}  # fmt: skip


def karpenter_backend(cluster: Any, **fields: Any) -> Any:
    """A :class:`KubernetesBackend` on ``cluster`` (the ``karpenter_cluster`` fixture's) whose
    spot and on-demand attempts ask Karpenter's NodePool for that capacity type (its label
    and taint's toleration); ``fields`` are the backend's others."""
    from airflow_spot.backends.kubernetes.backend import KubernetesBackend
    from airflow_spot.backends.kubernetes.placement import Placement

    pool = cluster.karpenter.nodepool

    def placement(capacity: str) -> Placement:
        return Placement({CAPACITY_TYPE: capacity, NODEPOOL_LABEL: pool}, (TOLERATION,))

    return KubernetesBackend(
        image="ghcr.io/me/train:1",
        config_file=cluster.kubeconfig,
        namespace=cluster.namespace,
        preset={"spot": placement("spot"), "on_demand": placement("on-demand")},
        **fields,
    )


def module_dir() -> Path:
    """The patched copy of the Karpenter module that build.sh keeps (its CRDs are applied)."""
    return bin_dir().parent / "src" / f"karpenter@{KARPENTER_VERSION}-loopback"


def built(where: Path | None = None) -> bool:
    """Whether karpenter-kwok is in ``where`` (the binaries' folder), built patched (its stamp
    beside it)."""
    where = where or bin_dir()
    return os.access(where / BINARY, os.X_OK) and (where / STAMP).exists()


def karpenter_needed(where: Path) -> str:
    """What Karpenter run from an installed package needs (see :func:`.plane.binaries_needed`)."""
    return binaries_needed(where, [BINARY]) + (
        f"; `tools/k8s/build.sh {BINARY}` builds it to bind 127.0.0.1 and keeps beside it the "
        f"copy of Karpenter's module whose CRDs are applied ({module_dir()})"
    )


def ensure_karpenter(build: bool = True) -> Path:
    """The karpenter-kwok binary, built patched first (``tools/k8s/build.sh``) if missing."""
    where = bin_dir()
    if not built(where) and build and _BUILD.exists() and not os.environ.get(BIN_ENV):
        subprocess.run(["bash", str(_BUILD), BINARY], check=True)
    if not (built(where) and module_dir().is_dir()) and not in_checkout():
        raise ControlPlaneError(karpenter_needed(where))
    if not built(where):
        raise ControlPlaneError(
            f"{BINARY} (built to bind 127.0.0.1, stamp {STAMP}) missing from {where}: build it "
            f"with tools/k8s/build.sh {BINARY}"
        )
    if not module_dir().is_dir():
        raise ControlPlaneError(f"Karpenter's module copy (its CRDs) missing: {module_dir()}")
    return where / BINARY


def nodeclass(name: str) -> dict[str, Any]:
    """The KWOKNodeClass: nodes registered at once."""
    return {
        "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}",
        "kind": "KWOKNodeClass",
        "metadata": {"name": name},
        "spec": {"nodeRegistrationDelay": "0s"},
    }


def instance_types() -> list[dict[str, Any]]:
    """kwok's instance types (its embedded file) with :data:`RESERVATION`'s ``reserved``
    offering added, priced below spot (a reservation is paid for already)."""
    import json

    path = module_dir() / "kwok" / "cloudprovider" / "instance_types.json"
    types = json.loads(path.read_text())
    it = next(t for t in types if t["name"] == RESERVATION["instance_type"])
    spot = min(o["Price"] for o in it["offerings"])
    it["offerings"].append(
        {
            "Price": spot / 1000,
            "Available": True,
            "ReservationCapacity": RESERVATION["capacity"],
            "Requirements": [
                {"key": CAPACITY_TYPE, "operator": "In", "values": ["reserved"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In",
                 "values": [RESERVATION["zone"]]},
                {"key": RESERVATION_LABEL, "operator": "In", "values": [RESERVATION["id"]]},
            ],
        }
    )  # fmt: skip
    return types


def nodepool(name: str, nodeclass_name: str, consolidate_after: str = "0s") -> dict[str, Any]:
    """The NodePool: spot and on-demand, tainted, our kwok's label, fast consolidation."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"labels": {KWOK_LABEL[0]: KWOK_LABEL[1]}},
                "spec": {
                    "nodeClassRef": {
                        "group": KWOK_GROUP,
                        "kind": "KWOKNodeClass",
                        "name": nodeclass_name,
                    },
                    "requirements": [
                        {
                            "key": CAPACITY_TYPE,
                            "operator": "In",
                            "values": ["spot", "on-demand", "reserved"],
                        },
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    ],
                    "taints": [TAINT],
                    "startupTaints": [STARTUP_TAINT],
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": consolidate_after,
                "budgets": [{"nodes": "100%"}],
            },
            "limits": {"cpu": "64"},
        },
    }


class Karpenter:
    """Karpenter's kwok provider against ``plane``, with one NodeClass and NodePool (module
    notes); its log is ``<plane root>/karpenter.log``."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        nodepool: str = "airflow-spot",
        consolidate_after: str = "0s",
        binary: Path | None = None,
    ) -> None:
        self.plane = plane
        self.nodepool = nodepool
        self.consolidate_after = consolidate_after
        self._binary = binary
        self.proc: subprocess.Popen | None = None
        self.metrics_port = self.health_port = 0
        self.log = plane.root / "karpenter.log"
        self.ice_file = plane.root / "karpenter-ice.rules"
        self.instance_types = plane.root / "kwok-instance-types.json"
        self._api_client: Any = None

    # -- life ---------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> Karpenter:
        binary = self._binary or ensure_karpenter()
        from kubernetes import config

        self._api_client = config.new_client_from_config(config_file=self.plane.kubeconfig)
        atexit.register(self.stop)
        try:
            self._start(binary, time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, binary: Path, until: float) -> None:
        self._apply_crds(until)
        kubeconfig = self.plane.issue_kubeconfig("karpenter", "karpenter", "system:masters")
        import json

        self.instance_types.write_text(json.dumps(instance_types()))
        self.metrics_port, self.health_port = free_port(), free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.plane.root),
            "KUBECONFIG": str(kubeconfig),
            "DISABLE_LEADER_ELECTION": "true",
            "METRICS_PORT": str(self.metrics_port),
            "HEALTH_PROBE_PORT": str(self.health_port),
            "LOG_LEVEL": "debug",
            # a batch closes 200 ms after the last pending pod (default 1 s), 2 s at most (10 s)
            "BATCH_IDLE_DURATION": "200ms",
            "BATCH_MAX_DURATION": "2s",
            "CPU_REQUESTS": "1000",
            ICE_FILE_ENV: str(self.ice_file),
            ICE_TTL_ENV: "3m",  # the AWS provider's unavailable-offerings cache
            "INSTANCE_TYPES_FILE_PATH": str(self.instance_types),
        }
        self.proc = spawn(binary, (), self.log, env=env)
        self._wait(until, "karpenter /readyz", lambda: self._health("/readyz"))
        co = self.custom
        self._create(
            co.create_cluster_custom_object,
            KWOK_GROUP,
            KWOK_VERSION,
            "kwoknodeclasses",
            nodeclass(self.nodepool),
        )
        pool = nodepool(self.nodepool, self.nodepool, self.consolidate_after)
        self._create(co.create_cluster_custom_object, GROUP, VERSION, "nodepools", pool)
        self._wait(until, f"NodePool {self.nodepool} Ready", self._nodepool_ready)

    def _apply_crds(self, until: float) -> None:
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self._api_client)
        names = []
        for rel in CRDS:
            doc = yaml.safe_load((module_dir() / rel).read_text())
            names.append(doc["metadata"]["name"])
            self._create(ext.create_custom_resource_definition, doc)

        def established() -> bool:
            for name in names:
                crd = ext.read_custom_resource_definition(name)
                conds = {c.type: c.status for c in (crd.status.conditions or [])}
                if conds.get("Established") != "True":
                    return False
            return True

        self._wait(until, "Karpenter's CRDs Established", established)

    def _nodepool_ready(self) -> bool:
        """The NodePool is Ready (the KWOKNodeClass is given Ready first: no controller of the
        kwok provider sets it, as Karpenter's own kwok e2e setup does not either)."""
        nc = self.custom.get_cluster_custom_object(
            KWOK_GROUP, KWOK_VERSION, "kwoknodeclasses", self.nodepool
        )
        if not _true(nc, "Ready"):
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            cond = {
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "",
                "lastTransitionTime": now,
                "observedGeneration": nc["metadata"].get("generation", 1),
            }
            self.custom.patch_cluster_custom_object_status(
                KWOK_GROUP,
                KWOK_VERSION,
                "kwoknodeclasses",
                self.nodepool,
                {"status": {"conditions": [cond]}},
            )
            return False
        np = self.custom.get_cluster_custom_object(GROUP, VERSION, "nodepools", self.nodepool)
        return _true(np, "Ready")

    def stop(self) -> None:
        """Stop Karpenter (SIGTERM, SIGKILL after 10 s). Its objects stay: the plane goes next."""
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()
            self._api_client = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> Karpenter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests read -----------------------------------------------------------------------
    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self._api_client)

    def nodeclaims(self) -> list[dict[str, Any]]:
        """This NodePool's NodeClaims (API JSON)."""
        got = self.custom.list_cluster_custom_object(
            GROUP, VERSION, "nodeclaims", label_selector=f"{NODEPOOL_LABEL}={self.nodepool}"
        )
        return list(got["items"])

    def delete_nodeclaim(self, name: str) -> None:
        """Delete a NodeClaim, as Karpenter's interruption controller does on a spot
        interruption (the drain, the node's deletion and the instance's are Karpenter's)."""
        self.custom.delete_cluster_custom_object(GROUP, VERSION, "nodeclaims", name)

    def clear(self, timeout: float = 60.0) -> None:
        """Delete this NodePool's NodeClaims and wait until they and their nodes are gone."""
        from kubernetes import client

        for nc in self.nodeclaims():
            with contextlib.suppress(client.ApiException):
                self.delete_nodeclaim(nc["metadata"]["name"])
        core = client.CoreV1Api(self._api_client)
        selector = f"{NODEPOOL_LABEL}={self.nodepool}"
        self._wait(
            time.monotonic() + timeout,
            "Karpenter's NodeClaims and nodes gone",
            lambda: not self.nodeclaims() and not core.list_node(label_selector=selector).items,
        )

    def out_of_capacity(self, *rules: dict[str, str]) -> None:
        """The test cloud has no capacity for the offerings each rule matches (all its labels:
        ``karpenter.sh/capacity-type``, ``topology.kubernetes.io/zone``,
        ``node.kubernetes.io/instance-type``): a NodeClaim all of whose offerings are out fails
        to launch with an ``InsufficientCapacityError``, and those offerings are then listed
        unavailable for 3 minutes while the file stays as written. No rules: capacity is back
        at once (and a later call starts afresh), and the ``InsufficientCapacityError`` events
        its refusals left are deleted: the next test on the session's plane would read them as
        a pool out of capacity for 3 minutes."""
        if not rules:
            self._forget_refusals()
        lines = [",".join(f"{k}={v}" for k, v in sorted(r.items())) for r in rules]
        # a new file each time: the provider keys what failed by the file's content
        lines.insert(0, f"# written at {time.time()!r}")
        tmp = self.ice_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in lines))
        tmp.replace(self.ice_file)  # read whole by the provider at every call

    def _forget_refusals(self) -> None:
        from kubernetes import client

        if self._api_client is None:  # not started, or stopped
            return
        core = client.CoreV1Api(self._api_client)
        found = core.list_event_for_all_namespaces(
            field_selector="reason=InsufficientCapacityError,involvedObject.kind=NodeClaim"
        ).items
        for e in found:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_event(e.metadata.name, e.metadata.namespace)

    def listening(self) -> list[tuple[str, int]]:
        """The (address, port) pairs Karpenter's process listens on (TCP)."""
        if self.proc is None:
            return []
        return listening(self.proc.pid)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- helpers -------------------------------------------------------------------------------
    def _health(self, path: str) -> bool:
        url = f"http://127.0.0.1:{self.health_port}{path}"
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)

    def _create(self, create: Callable[..., Any], *args: Any) -> None:
        """``create(*args)``; one already there (409: a plane reused) is fine."""
        from kubernetes import client

        try:
            create(*args)
        except client.ApiException as e:
            if e.status != 409:
                raise

    def _wait(self, until: float, what: str, ready: Callable[[], bool]) -> None:
        from kubernetes import client

        last: object = None
        while time.monotonic() < until:
            if self.proc is not None and self.proc.poll() is not None:
                raise ControlPlaneError(
                    f"karpenter exited {self.proc.returncode} while waiting for {what}; its log "
                    f"{self.log}:\n{self.log_tail()}"
                )
            try:
                if ready():
                    return
            except (OSError, urllib.error.URLError, client.ApiException) as e:
                last = e
            time.sleep(0.2)
        raise ControlPlaneError(
            f"timed out waiting for {what} (last error: {last!r}); karpenter's log {self.log}:\n"
            f"{self.log_tail()}"
        )


def _true(obj: dict[str, Any], kind: str) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conds)


def listening(pid: int) -> list[tuple[str, int]]:
    """TCP (address, port) pairs that process ``pid`` listens on, from ``/proc`` (Linux)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = f[1].split(":")
            out.append((_ip(hex_ip), int(hex_port, 16)))
    return out


def _ip(hex_ip: str) -> str:
    """An address as ``/proc/net/tcp{,6}`` prints it: 32-bit words in little-endian order."""
    import ipaddress

    raw = bytes.fromhex(hex_ip)
    return str(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))
