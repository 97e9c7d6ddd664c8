"""pytest fixtures for a real control plane; in a ``conftest.py``:
``pytest_plugins = ["airflow_spot.testing_cluster.pytest_plugin"]``.

* ``kube_control_plane`` (session): the :class:`~.plane.ControlPlane` and its
  :class:`~.kubelet.Kubelet`, started once (the binaries built first if missing);
* ``kube_cluster`` (function): the same, with a namespace of the test's own, a kubelet reset
  to its defaults, and at the end the test's pods and the nodes it made deleted;
* ``karpenter`` (session, started only for the tests that ask for it): Karpenter's kwok
  provider against that plane (:class:`~.karpenter.Karpenter`), stopped at the end;
* ``karpenter_cluster`` (function): ``kube_cluster`` whose namespace Karpenter serves (our
  kubelet makes no node for its pods, and runs their pods on Karpenter's nodes); at the end the
  test's pods are deleted, then Karpenter's NodeClaims, and their nodes are waited for.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_spot.testing_cluster.karpenter import Karpenter
from airflow_spot.testing_cluster.kubelet import Kubelet
from airflow_spot.testing_cluster.plane import ControlPlane, free_port

_ns = itertools.count(1)


@dataclass
class Cluster:
    """A started control plane, its kubelet, and (per test) a namespace."""

    plane: ControlPlane
    kubelet: Kubelet
    namespace: str = "default"
    karpenter: Karpenter | None = None

    @property
    def kubeconfig(self) -> str:
        return self.plane.kubeconfig

    @property
    def api(self):  # noqa: ANN201 - kubernetes.client.CoreV1Api
        return self.kubelet.api


def anchors(kubelet: Kubelet, n: int = 2) -> list[str]:
    """Healthy nodes that run nothing (tainted ``NoSchedule``). The node lifecycle controller
    evicts nothing while every node of a zone is NotReady ("master disruption mode"); with
    these, one lost node among few is a normal disruption, as in a real cluster."""
    names = []
    for i in range(1, n + 1):
        name = kubelet.add_node(
            f"anchor-{i}",
            {"airflow-spot/anchor": "true"},
            [{"key": "airflow-spot/anchor", "value": "true", "effect": "NoSchedule"}],
            gpus=0,
        )
        kubelet.nodes.pop(name)  # not the tests' node: never cleaned up, no pods tended
        names.append(name)
    for name in names:
        kubelet.wait_ready(name)
    return names


@pytest.fixture(scope="session")
def kube_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = Path(tmp_path_factory.mktemp("k8s"))
    port = free_port()
    plane = ControlPlane(root / "plane", kubelet_port=port).start()
    kubelet = Kubelet(plane.kubeconfig, root / "nodes", port=port)
    try:
        kubelet.start()
        anchors(kubelet)
        yield Cluster(plane, kubelet)
    finally:
        kubelet.stop()
        plane.stop()


@pytest.fixture
def kube_cluster(kube_control_plane: Cluster) -> Iterator[Cluster]:
    from kubernetes import client

    c = kube_control_plane
    k = c.kubelet
    ns = f"t{next(_ns)}-{int(time.time()) % 100000}"
    c.api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    until = time.monotonic() + 30
    while time.monotonic() < until:  # pods are refused until its service account exists
        with contextlib.suppress(client.ApiException):
            c.api.read_namespaced_service_account("default", ns)
            break
        time.sleep(0.1)
    for node in list(k.nodes):  # every test starts with no node of an earlier one
        with contextlib.suppress(client.ApiException):
            c.api.delete_node(node)
        k.nodes.pop(node, None)
    k.lost.clear()
    k.reclaimed.clear()  # a test's plan counts its own spot pods, from 1
    k.spot_ordinal.clear()
    try:
        yield Cluster(c.plane, k, ns)
    finally:
        k.plan.clear()
        k.spot_gone_after_plan = False
        for p in c.api.list_namespaced_pod(ns).items:
            with contextlib.suppress(client.ApiException):
                c.api.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
        for node in list(k.nodes):
            with contextlib.suppress(client.ApiException):
                c.api.delete_node(node)
            k.nodes.pop(node, None)
        k.spot_available = True
        k.autoscale = True
        with contextlib.suppress(client.ApiException):
            c.api.delete_namespace(ns)


@pytest.fixture(scope="session")
def karpenter(kube_control_plane: Cluster) -> Iterator[Karpenter]:
    k = Karpenter(kube_control_plane.plane).start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def karpenter_cluster(kube_cluster: Cluster, karpenter: Karpenter) -> Iterator[Cluster]:
    from kubernetes import client

    c = kube_cluster
    c.kubelet.leave_to_karpenter.add(c.namespace)
    try:
        yield Cluster(c.plane, c.kubelet, c.namespace, karpenter)
    finally:
        for p in c.api.list_namespaced_pod(c.namespace).items:  # first: no pod waits for a node
            with contextlib.suppress(client.ApiException):
                c.api.delete_namespaced_pod(p.metadata.name, c.namespace, grace_period_seconds=0)
        karpenter.clear()
        c.kubelet.leave_to_karpenter.discard(c.namespace)
