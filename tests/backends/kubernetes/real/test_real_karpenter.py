"""Karpenter for real (issue 20): ``sigs.k8s.io/karpenter`` v1.14.1 with its kwok provider
against the real control plane, one NodePool of spot and on-demand (``testing.cluster.karpenter``);
each attempt is launched and judged by the real backend and the real ``classify()``.

What Karpenter did, as recorded here on 2026-12-02 (every event ``source.component: karpenter``
and in namespace ``default`` unless said; NodeClaims are named ``airflow-spot-<5 chars>``):

* **A spot pod pending** (kube-scheduler: ``FailedScheduling``): about 2 s to Running.
  Pod ``Nominated`` "Pod should schedule on: nodeclaim/airflow-spot-xzkd7"; NodeClaim
  ``Launched``, ``Registered``, ``Initialized``, ``Ready``, each "Status condition
  transitioned, Type: Launched, Status: Unknown -> True, Reason: Launched" (sometimes also
  ``DisruptionBlocked`` "Node isn't initialized"). The node is created tainted
  ``karpenter.sh/unregistered:NoExecute`` (and ``node.kubernetes.io/not-ready:NoSchedule``);
  registration swaps that for the NodePool's taint and startup taint, which our kubelet lifts
  (then ``Initialized``). Without the startup taint the pod was bound the moment
  ``unregistered`` went, and the taint eviction controller, its node cache a few ms behind,
  deleted it at once in about one run in five (kubernetes/kubernetes#119862). The node is
  ``kwok-airflow-spot-xzkd7-<words>-<n>``, providerID ``kwok://`` + its name, labels
  ``karpenter.sh/capacity-type: spot``, ``karpenter.sh/nodepool``, ``karpenter.sh/registered``,
  ``karpenter.sh/initialized``, ``node.kubernetes.io/instance-type: c-1x-amd64-linux``
  (the cheapest with 600m free), ``topology.kubernetes.io/zone: test-zone-[a-d]``,
  ``kubernetes.io/hostname: <the NodeClaim's name>``, ``kwok.x-k8s.io/node: fake``, the
  NodePool's template labels, and its taint. The NodeClaim has the same capacity-type label.
* **Its NodeClaim deleted** (how Karpenter's interruption controller ends a reclaimed
  instance; kwok has none, so the test does it): in 1 s the node has a ``deletionTimestamp``
  and the taint ``karpenter.sh/disrupted:NoSchedule``, 0.1 s later the pod is evicted
  (``DisruptionTarget/EvictionByEvictionAPI``). Node ``FailedDraining`` (Warning) "Failed to
  drain node, 1 pods are waiting to be evicted"; pod ``Evicted`` "Evicted pod: Forceful
  Termination"; NodeClaim and Node ``Finalized`` "Finalized karpenter.sh/termination";
  NodeClaim ``Drained``. No ``DisruptionTerminating``. Node gone about 5 s later.
* **Consolidation** (a 600m pod alone on a 1-CPU node, a 3-CPU pod then given a 4-CPU node
  with room for it): 15 s later NodeClaim ``DisruptionTerminating`` "Disrupting NodeClaim:
  Underutilized" and Node ``DisruptionTerminating`` "Disrupting Node: Underutilized", then the
  same taint, deletion and eviction, and pod ``Evicted`` "Evicted pod: Underutilized" (the new
  node had ``DisruptionBlocked`` "Node is nominated for a pending pod" for a while).
* **An empty node**: 15-30 s after its last pod, NodeClaim/Node ``DisruptionTerminating``
  "Disrupting NodeClaim: Empty" / "Disrupting Node: Empty", then (node-controller)
  ``RemovingNode``.

Karpenter's recorder drops an event it published in the last 2 minutes with the same reason
and dedupe values; for ``Evicted`` those are the pod's *name* only (any namespace), so a pod
name reused within 2 minutes gets no ``Evicted`` event: each test here has its own task.

``classify()`` read the drain alone as "evicted by a drain without cloud evidence" in both
cases, and a pod already gone (404) on spot as preempted in both; it now reads Karpenter's own
words (``classify.karpenter_disruption`` / ``karpenter_forceful``).
"""

from __future__ import annotations

import time

from airflow_spot.backends.base import Outcome, State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.testing.cluster.karpenter import (
    CAPACITY_TYPE,
    NODEPOOL_LABEL,
    TOLERATION,
    karpenter_backend,
)
from airflow_spot.testing.cluster.looks import wait_ended, wait_running


def ident(task_id: str) -> TaskIdentity:
    """A task of its own per test: Karpenter drops an ``Evicted`` event for a pod *name* it
    evicted in the last 2 minutes (its recorder's dedupe key is the reason and the pod's name,
    whatever the namespace), so a name reused across tests would lose its event."""
    return TaskIdentity("nightly_train", task_id, "manual__2026-01-01T00:00:00+00:00")


# the training process: on SIGTERM it "checkpoints" for 2 s and exits 143, as a real one does
TRAIN = ["sh", "-c", 'trap "sleep 2; exit 143" TERM; sleep 600 & wait']
REQUESTS = {"cpu": "600m", "memory": "256Mi"}  # one per 1-CPU node (900m allocatable)


def backend(cluster) -> KubernetesBackend:
    return karpenter_backend(cluster, resources={"requests": REQUESTS}, pending_timeout_s=120.0)


def running(b: KubernetesBackend, task_id: str, command: list[str] = TRAIN, capacity: str = "spot"):
    h = b.launch(ident(task_id), 1, capacity, command, checkpoint_uri="file:///tmp/x")
    return h, wait_running(b, h)


def ended(b: KubernetesBackend, h, timeout: float = 60.0):
    return wait_ended(b, h, timeout)


def events(api, kind: str, name: str) -> dict[str, list[str]]:
    """Karpenter's events about one object: reason -> messages."""
    out: dict[str, list[str]] = {}
    for e in api.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    ).items:
        if (e.source.component if e.source else None) == "karpenter":
            out.setdefault(e.reason, []).append(e.message)
    return out


def wait_event(api, kind: str, name: str, reason: str, timeout: float = 30.0) -> list[str]:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        got = events(api, kind, name)
        if reason in got:
            return got[reason]
        time.sleep(0.25)
    raise AssertionError(f"no {reason} event on {kind} {name} in {timeout} s: {got}")


def nodeclaim_of(karpenter, node: str, timeout: float = 15.0) -> dict:
    """The NodeClaim of ``node``, once registered (its ``status.nodeName`` is set a moment
    after the node can take pods)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        claims = [c for c in karpenter.nodeclaims() if c["status"].get("nodeName") == node]
        if len(claims) == 1:
            return claims[0]
        time.sleep(0.2)
    raise AssertionError(f"no NodeClaim of node {node}: {karpenter.nodeclaims()}")


def wait_gone(cluster, node: str, nodeclaim: str, timeout: float = 60.0) -> None:
    from kubernetes import client

    until = time.monotonic() + timeout
    while time.monotonic() < until:
        names = {c["metadata"]["name"] for c in cluster.karpenter.nodeclaims()}
        try:
            cluster.api.read_node(node)
        except client.ApiException as e:
            if e.status == 404 and nodeclaim not in names:
                return
        time.sleep(0.5)
    raise AssertionError(f"node {node} / NodeClaim {nodeclaim} still there after {timeout} s")


def test_karpenter_listens_on_127_0_0_1_only(karpenter) -> None:
    """The patched operator binds its metrics and health servers to 127.0.0.1, nothing else."""
    got = karpenter.listening()
    assert sorted(got) == sorted(
        [("127.0.0.1", karpenter.metrics_port), ("127.0.0.1", karpenter.health_port)]
    ), got


def test_a_spot_pod_makes_karpenter_launch_a_spot_nodeclaim_and_node(karpenter_cluster) -> None:
    """A pending spot training pod makes Karpenter create a spot NodeClaim and its kwok node,
    with its real events, and the attempt runs there, read as on spot capacity."""
    c = karpenter_cluster
    b = backend(c)
    h, node = running(b, "launch")
    claim = nodeclaim_of(c.karpenter, node)
    name = claim["metadata"]["name"]
    assert claim["metadata"]["labels"][CAPACITY_TYPE] == "spot"
    assert claim["metadata"]["labels"][NODEPOOL_LABEL] == c.karpenter.nodepool
    for reason in ("Launched", "Registered", "Initialized"):
        msg = wait_event(c.api, "NodeClaim", name, reason)
        assert msg == [
            f"Status condition transitioned, Type: {reason}, Status: Unknown -> True, "
            f"Reason: {reason}"
        ]
    n = c.api.read_node(node)  # initialized: its startup taint lifted, as our kubelet does
    labels = n.metadata.labels
    assert labels[CAPACITY_TYPE] == "spot"
    assert labels[NODEPOOL_LABEL] == c.karpenter.nodepool
    assert labels["kwok.x-k8s.io/node"] == "fake"
    assert labels["kubernetes.io/hostname"] == name
    assert labels["node.kubernetes.io/instance-type"] == "c-1x-amd64-linux"
    assert labels["karpenter.sh/initialized"] == "true"
    assert n.spec.provider_id == f"kwok://{node}"
    assert [t.key for t in n.spec.taints] == ["airflow-spot/karpenter"]
    nominated = wait_event(c.api, "Pod", h.pod, "Nominated")
    assert nominated == [f"Pod should schedule on: nodeclaim/{name}"]
    st = b.status(h)
    assert st.state is State.RUNNING and st.evidence["spot_node"] is True, st


def test_an_on_demand_pod_gets_an_on_demand_nodeclaim_of_the_same_nodepool(
    karpenter_cluster,
) -> None:
    """The same NodePool serves on-demand: an on-demand attempt gets an on-demand NodeClaim
    and node (never a spot one), and the backend reads it as not on spot."""
    c = karpenter_cluster
    b = backend(c)
    h, node = running(b, "on-demand", capacity="on_demand")
    claim = nodeclaim_of(c.karpenter, node)
    assert claim["metadata"]["labels"][CAPACITY_TYPE] == "on-demand"
    assert claim["metadata"]["labels"][NODEPOOL_LABEL] == c.karpenter.nodepool
    assert c.api.read_node(node).metadata.labels[CAPACITY_TYPE] == "on-demand"
    st = b.status(h)
    assert st.state is State.RUNNING and not st.evidence.get("spot_node"), st


def test_deleting_the_nodeclaim_is_a_preemption(karpenter_cluster) -> None:
    """A spot interruption as Karpenter carries it out (its NodeClaim deleted: the node is
    tainted, deleted and drained by Karpenter) is a preemption, not an infrastructure
    disruption."""
    c = karpenter_cluster
    b = backend(c)
    h, node = running(b, "interrupted")
    name = nodeclaim_of(c.karpenter, node)["metadata"]["name"]
    c.karpenter.delete_nodeclaim(name)
    st = ended(b, h)
    assert st.outcome is Outcome.PREEMPTED, st
    assert "Karpenter" in st.reason or "vanished" in st.reason, st
    assert wait_event(c.api, "Pod", h.pod, "Evicted") == ["Evicted pod: Forceful Termination"]
    wait_gone(c, node, name)
    assert "DisruptionTerminating" not in events(c.api, "Node", node)


def test_a_consolidation_eviction_is_not_a_preemption(karpenter_cluster) -> None:
    """Karpenter's consolidation (the training pod's 1-CPU node deleted once a 4-CPU node has
    room for it) drains the pod the same way, yet it is an infrastructure disruption, never a
    spot reclaim."""
    c = karpenter_cluster
    b = backend(c)
    h, node = running(b, "consolidated")
    name = nodeclaim_of(c.karpenter, node)["metadata"]["name"]
    filler = {
        "metadata": {"name": "filler"},
        "spec": {
            "nodeSelector": {CAPACITY_TYPE: "spot", NODEPOOL_LABEL: c.karpenter.nodepool},
            "tolerations": [TOLERATION],
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "command": ["sleep", "600"],
                    "resources": {"requests": {"cpu": "3", "memory": "256Mi"}},
                }
            ],
        },
    }
    c.api.create_namespaced_pod(c.namespace, filler)
    st = ended(b, h, timeout=90)
    assert st.outcome is Outcome.INFRA_DISRUPTION, st
    assert "Underutilized" in st.reason, st
    assert wait_event(c.api, "Node", node, "DisruptionTerminating") == [
        "Disrupting Node: Underutilized"
    ]
    assert wait_event(c.api, "NodeClaim", name, "DisruptionTerminating") == [
        "Disrupting NodeClaim: Underutilized"
    ]
    assert wait_event(c.api, "Pod", h.pod, "Evicted") == ["Evicted pod: Underutilized"]
    filler_node = c.api.read_namespaced_pod("filler", c.namespace).spec.node_name
    assert filler_node != node
    assert c.api.read_node(filler_node).metadata.labels["karpenter.sh/capacity-type"] == "spot"


def test_an_empty_node_is_given_back(karpenter_cluster) -> None:
    """Once the attempt succeeded and its pod is deleted, Karpenter consolidates the empty node
    away: NodeClaim and Node are deleted (``Disrupting Node: Empty``)."""
    c = karpenter_cluster
    b = backend(c)
    h, node = running(b, "emptied", ["sleep", "3"])
    name = nodeclaim_of(c.karpenter, node)["metadata"]["name"]
    st = ended(b, h)
    assert st.outcome is Outcome.SUCCEEDED, st
    b.release(h, st.outcome.value)
    wait_gone(c, node, name, timeout=90)
    assert events(c.api, "Node", node)["DisruptionTerminating"] == ["Disrupting Node: Empty"]
    assert events(c.api, "NodeClaim", name)["DisruptionTerminating"] == [
        "Disrupting NodeClaim: Empty"
    ]
