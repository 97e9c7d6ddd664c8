"""The Kubernetes backend sees spot the way a cluster shows it, against an API server over HTTP
(FakeKube) with a cloud (FakeCloud) that shows spot as Karpenter and cluster-autoscaler do:
spot_signals() launches nothing; a probe finds spot (and its node goes back once dropped) or
finds nothing and costs nothing; unknown stays unknown; a source RBAC forbids is left out."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from airflow_spot.backends.kubernetes.backend import KubePool, KubernetesBackend
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.testing_kube import FakeCloud, FakeKube

IDENT = {
    "dag_id": "nightly_train",
    "task_id": "train",
    "run_id": "manual__2026-01-01T00:00:00+00:00",
    "map_index": -1,
    "try_number": 1,
}
SPOT = {"karpenter.sh/capacity-type": "spot"}


@pytest.fixture
def kube(tmp_path: Path):
    k = FakeKube().start()
    yield k, k.kubeconfig(tmp_path / "kubeconfig")
    k.stop()


@pytest.fixture
def cloud_of(kube, tmp_path: Path):
    """FakeCloud(**options), started, stopped after the test."""
    started: list[FakeCloud] = []

    def make(**kw) -> FakeCloud:
        c = FakeCloud(kube[1], tmp_path / "nodes", **kw)
        c.start()
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()


def wait_for(fn, timeout: float = 15.0):
    until = time.time() + timeout
    while time.time() < until:
        if got := fn():
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def nodes(b: KubernetesBackend) -> list[str]:
    return [n.metadata.name for n in b.api.list_node().items]


def test_a_probe_that_finds_nothing_costs_nothing(kube, cloud_of) -> None:
    """Spot cannot be had: Karpenter's ICE refuses the probe; no node is made or bound."""
    _, cfg = kube
    cloud = cloud_of(ice_events=True, gpus_per_node=1)
    cloud.spot_available = False
    b = KubernetesBackend(image="img", config_file=cfg, gpus=1)
    p = b.probe(IDENT)
    assert set(p) == {"namespace", "name", "pool", "created_at"} and p["pool"] == ""
    s = wait_for(lambda: b.probe_signal(p, time.time()))
    assert (s.up, s.source, s.pool) == (False, "probe", "")
    assert "InsufficientCapacityError" in s.detail and "g4dn.xlarge" in s.detail
    pod = b.api.read_namespaced_pod(p["name"], "default")
    assert pod.spec.node_name is None and nodes(b) == []
    sigs = b.spot_signals(time.time())
    assert [(x.source, x.up) for x in sigs] == [("karpenter", False)]
    b.drop_probe(p)
    wait_for(lambda: b.probe_signal(p, time.time()) is None and not _probes(b))
    b.drop_probe(p)  # already gone: fine


def _probes(b: KubernetesBackend) -> list[str]:
    return [
        x.metadata.name
        for x in b.api.list_namespaced_pod(
            "default", label_selector="airflow-spot/probe=true"
        ).items
    ]


def test_a_probe_found_and_not_used_gives_its_node_back(kube, cloud_of) -> None:
    """Spot is up: the probe is bound to a node made for it (paid for), with the probe's shape;
    dropped at once, the empty node goes back."""
    _, cfg = kube
    cloud = cloud_of(gpus_per_node=1, node_launch_delay_s=0.5, autoscaler_group="eks-gpu-spot-2a")
    b = KubernetesBackend(image="img", config_file=cfg, gpus=1)
    p = b.probe(IDENT)
    assert b.probe_signal(p, time.time()) is None  # a node is being made: nothing known yet
    s = wait_for(lambda: b.probe_signal(p, time.time()))
    assert (s.up, s.source) == (True, "probe")
    pod = b.api.read_namespaced_pod(p["name"], "default")
    assert pod.spec.priority_class_name == "airflow-spot-probe"
    assert pod.metadata.annotations == {"karpenter.sh/do-not-disrupt": "true"}
    assert pod.spec.node_selector == SPOT
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert pod.metadata.labels["airflow-spot/task-id"] == "train"
    pc = b._cluster.api.api_client  # the PriorityClass the backend made
    from kubernetes.client import SchedulingV1Api

    made = SchedulingV1Api(pc).read_priority_class("airflow-spot-probe")
    assert (made.value, made.preemption_policy) == (-10, "Never")
    (node,) = nodes(b)
    # its GPU is the probe's: the node shows no free GPU for the job
    assert [x for x in b.spot_signals(time.time()) if x.source == "node"] == []
    b.drop_probe(p)
    wait_for(lambda: node in cloud.released and nodes(b) == [])
    assert b.probe_signal(p, time.time()) is None


def test_a_new_probe_replaces_the_tasks_leftover_and_a_launch_removes_it(kube, cloud_of) -> None:
    _, cfg = kube
    cloud_of()
    b = KubernetesBackend(image="img", config_file=cfg)
    first = b.probe(IDENT)
    second = KubernetesBackend(image="img", config_file=cfg).probe(
        IDENT
    )  # a new try: 409 on the class
    assert _probes(b) == [second["name"]] != [first["name"]]
    b.launch(IDENT, 1, "on_demand", ["sleep", "5"], checkpoint_uri="/c")
    assert _probes(b) == []  # at most one pod of the task: a probe is no exception


def test_unknown_stays_unknown(kube) -> None:
    """A quiet cluster shows nothing; a Karpenter ICE is down for 3 minutes, then nothing
    (Karpenter has forgotten it: unknown, not up)."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg, gpus=1)
    assert b.spot_signals(time.time()) == []
    _ice(
        b,
        "NodeClaim default-x7k2p event: insufficient capacity, all requested instance types were unavailable during launch",
    )
    now = time.time()
    (s,) = b.spot_signals(now)
    assert (s.source, s.up, s.pool) == ("karpenter", False, "")
    assert b.spot_signals(now + 200) == []


def _ice(b: KubernetesBackend, message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    b.api.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "default-x7k2p.17f3a2b9c0d1e2f3"},
            "involvedObject": {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodeClaim",
                "name": "default-x7k2p",
            },
            "reason": "InsufficientCapacityError",
            "message": message,
            "type": "Warning",
            "source": {"component": "karpenter"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        },
    )


def _spot_node(b: KubernetesBackend, name: str, labels: dict[str, str], gpus: int) -> None:
    b.api.create_node(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "7910m"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        }
    )


def test_without_configmap_access_one_warning_and_the_other_sources_are_still_read(
    kube, caplog
) -> None:
    k, cfg = kube
    k.emulator.forbidden = frozenset({"configmaps/kube-system"})
    b = KubernetesBackend(image="img", config_file=cfg, gpus=1)
    k8s_api = b.api
    with pytest.raises(Exception, match="403"):
        k8s_api.read_namespaced_config_map("cluster-autoscaler-status", "kube-system")
    _spot_node(b, "spot-a", SPOT, 2)
    _ice(
        b,
        "NodeClaim default-x7k2p event: insufficient capacity, all requested instance types were unavailable during launch",
    )
    with caplog.at_level(logging.WARNING):
        first = b.spot_signals(time.time())
        second = b.spot_signals(time.time())
    assert (
        sorted(s.source for s in first) == ["karpenter", "node"] == sorted(s.source for s in second)
    )
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "get configmaps in kube-system" in warned[0]
    assert "autoscaler-status" in b._cluster.forbidden


def test_autoscaler_backoff_is_seen_in_its_status_and_on_the_probe(kube, cloud_of) -> None:
    _, cfg = kube
    cloud = cloud_of(autoscaler_group="eks-gpu-spot-2a-5ec6a3b1")
    cloud.spot_available = False
    b = KubernetesBackend(image="img", config_file=cfg)
    p = b.probe(IDENT)
    s = wait_for(lambda: b.probe_signal(p, time.time()))
    assert (s.up, s.source) == (False, "probe") and "backoff" in s.detail

    def autoscaler() -> list:
        return [x for x in b.spot_signals(time.time()) if x.source == "autoscaler"]

    # the status ConfigMap's Backoff, and the NotTriggerScaleUp on our (probe) pod
    sigs = wait_for(lambda: len(got := autoscaler()) == 2 and got)
    assert {x.up for x in sigs} == {False} and {x.pool for x in sigs} == {""}
    details = sorted(x.detail for x in sigs)
    assert "node group eks-gpu-spot-2a-5ec6a3b1 in Backoff" in details[0]
    assert details[1].startswith(f"pod {p['name']}: pod didn't trigger scale-up: 1 in backoff")
    b.drop_probe(p)


def test_a_pool_whose_zone_has_no_capacity_is_down_and_the_other_is_up(kube, cloud_of) -> None:
    """Two pools: Karpenter's ICE names zone a; zone b has a Ready spot node with a free GPU."""
    _, cfg = kube
    cloud = cloud_of(ice_events=True)
    cloud.blocked_selectors.append({"topology.kubernetes.io/zone": "eu-west-3a"})
    zone = "topology.kubernetes.io/zone"
    pools = (
        KubePool("zone-a", Placement({**SPOT, zone: "eu-west-3a"}), 0.8),
        KubePool("zone-b", Placement({**SPOT, zone: "eu-west-3b"}), 1.2),
    )
    b = KubernetesBackend(image="img", config_file=cfg, pools=pools, gpus=1)
    _spot_node(b, "spot-b", {**SPOT, zone: "eu-west-3b"}, 1)
    p = b.probe(IDENT, pool="zone-a")
    s = wait_for(lambda: b.probe_signal(p, time.time()))
    assert (s.up, s.pool) == (False, "zone-a") and "eu-west-3a" in s.detail
    got = {(x.source, x.pool, x.up) for x in b.spot_signals(time.time())}
    assert got == {("karpenter", "zone-a", False), ("node", "zone-b", True)}
    b.drop_probe(p)


def test_a_worker_that_may_not_create_priority_classes_is_told_once(kube, caplog) -> None:
    """An admin may have made the PriorityClass: one warning, and the probe is still made."""
    from airflow_spot.exceptions import ConfigError

    k, cfg = kube
    k.emulator.forbidden = frozenset({"priorityclasses"})
    b = KubernetesBackend(image="img", config_file=cfg)
    with caplog.at_level(logging.WARNING):
        b.probe(IDENT)
        p = b.probe(IDENT)
    warned = [r.getMessage() for r in caplog.records if "priorityclasses" in r.getMessage()]
    assert len(warned) == 1 and "create priorityclasses (scheduling.k8s.io)" in warned[0]
    assert _probes(b) == [p["name"]]
    with pytest.raises(ConfigError, match="backend.pools: no pool named 'mars'"):
        b.probe(IDENT, pool="mars")
