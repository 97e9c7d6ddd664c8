"""pytest fixtures for a real control plane; in a ``conftest.py``:
``pytest_plugins = ["airflow_spot.testing.cluster.pytest_plugin"]``.

* ``kube_control_plane`` (session): the :class:`~.plane.ControlPlane` and its
  :class:`~.kubelet.Kubelet`, started once (the binaries built first if missing);
* ``kube_cluster`` (function): the same, with a namespace of the test's own, a kubelet reset
  to its defaults, and at the end the test's pods and the nodes it made deleted;
* ``karpenter`` (session, started only for the tests that ask for it): Karpenter's kwok
  provider against that plane (:class:`~.karpenter.Karpenter`), stopped at the end;
* ``karpenter_cluster`` (function): ``kube_cluster`` whose namespace Karpenter serves (our
  kubelet makes no node for its pods, and runs their pods on Karpenter's nodes); at the end the
  test's pods are deleted, then Karpenter's NodeClaims, and their nodes are waited for.

Run from an installed package (no ``tools/k8s/build.sh`` beside it) without the binaries, the
tests that ask for these fixtures are skipped, and the reason says what they need
(:func:`~.plane.binaries_needed`). pytest is imported only when it loads this plugin
(:func:`pytest_configure` registers the fixtures): the package installs without pytest, and
every module of it imports.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from airflow_spot.testing.cluster.karpenter import Karpenter, built, karpenter_needed, module_dir
from airflow_spot.testing.cluster.kubelet import Kubelet
from airflow_spot.testing.cluster.plane import (
    ControlPlane,
    bin_dir,
    binaries_needed,
    free_port,
    in_checkout,
    missing_binaries,
)

if TYPE_CHECKING:
    import pytest

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


def _skip_outside_a_checkout(needed: str | None) -> None:
    """Skip the test, saying what it ``needed``, when binaries are missing (``needed`` given)
    and nothing here can build them (an installed package); in a checkout, starting the
    plane builds them, or fails saying why."""
    if needed and not in_checkout():
        import pytest

        pytest.skip(needed)


def kube_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The plane and its kubelet, with two anchor nodes, for the session."""
    missing = missing_binaries()
    _skip_outside_a_checkout(binaries_needed(bin_dir(), missing) if missing else None)
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


def kube_cluster(kube_control_plane: Cluster) -> Iterator[Cluster]:
    """The plane with a namespace of the test's own and no node of an earlier test."""
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
        k.stop_trace()
        k.spot_available = True
        k.spot_limit = None
        k.autoscale = True
        with contextlib.suppress(client.ApiException):
            c.api.delete_namespace(ns)


def karpenter(kube_control_plane: Cluster) -> Iterator[Karpenter]:
    """Karpenter's kwok provider against the plane, for the session."""
    ready = built() and module_dir().is_dir()
    _skip_outside_a_checkout(None if ready else karpenter_needed(bin_dir()))
    k = Karpenter(kube_control_plane.plane).start()
    try:
        yield k
    finally:
        k.stop()


def karpenter_cluster(kube_cluster: Cluster, karpenter: Karpenter) -> Iterator[Cluster]:
    """``kube_cluster`` whose namespace's pods Karpenter makes nodes for."""
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


# the fixtures above, by name, with their scope
FIXTURES: dict[str, Literal["session", "function"]] = {
    "kube_control_plane": "session",
    "kube_cluster": "function",
    "karpenter": "session",
    "karpenter_cluster": "function",
}


def pytest_configure(config: pytest.Config) -> None:
    """Register :data:`FIXTURES` with pytest, which is imported here and not at the module's
    import (see the module's docstring)."""
    import pytest

    name = "airflow_spot.testing.cluster.fixtures"
    if config.pluginmanager.has_plugin(name):
        return
    holder = types.ModuleType(name, "the real control plane's pytest fixtures")
    for fixture, scope in FIXTURES.items():
        setattr(holder, fixture, pytest.fixture(globals()[fixture], scope=scope))
    config.pluginmanager.register(holder, name)
