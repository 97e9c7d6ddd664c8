"""A waiting spot gang ends on its capacity check's "fewer than N", on the real control plane
(issue 36: "no partial gang bills for long"), far before its partial-gang timeout (10 min, the
default, left as is here).

* Karpenter v1.14.1's kwok provider, the test cloud out of spot (every spot offering fails
  with an ``InsufficientCapacityError``, :meth:`Karpenter.out_of_capacity`: the emulated part;
  Karpenter's handling is its own): a gang of two holds one spot node that Karpenter made
  before the cloud ran out, and its second placeholder's NodeClaim fails for capacity.
  Karpenter then finds no offering left for it, so no NodeClaim is on its way: the gang ends
  ``spot_unavailable`` about :data:`CAPACITY_SETTLE_S` after the ICE, billed for the node it
  held (``held_node_s``), as its timeout would have ended it.
* A ``check-capacity`` ProvisioningRequest answered ``CapacityIsNotFound`` (the condition
  written by the test, as cluster-autoscaler writes it: it cannot be built here, see
  test_real_provisioning_request.py) ends its gang the same way; a 403 on deleting the
  request is a clear error naming the RBAC rule.
* A gang with no answer shows its own waiting: "fewer than N: k of N pods pending for T s".
* An on-demand gang with ``karpenter-reserved``'s fallback gets its N nodes from a capacity
  reservation, launched by Karpenter itself (kwok's ``reserved`` offering, the patched
  provider naming its reservation label).
"""

from __future__ import annotations

import time

import pytest

from airflow_spot.backends.base import Outcome, State, TaskIdentity
from airflow_spot.backends.kubernetes import gating
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.capacity_signals import CAPACITY_SETTLE_S
from airflow_spot.backends.kubernetes.gang_launch import JOB_NAME_LABEL
from airflow_spot.backends.kubernetes.gating import PLACEHOLDER_LABEL
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.backends.kubernetes.provisioning import GROUP, PLURAL, VERSION, request_name
from airflow_spot.exceptions import BackendError
from airflow_spot.testing.cluster.karpenter import (
    CAPACITY_TYPE,
    NODEPOOL_LABEL,
    RESERVATION,
    RESERVATION_LABEL,
    TOLERATION,
)
from airflow_spot.testing.cluster.looks import look

N = 2
EARLY_S = 30.0  # the gang's end comes within this of its launch (its timeout: 600 s)
NS = "ml-training"  # docker/rbac.yaml's namespace
RUN = "manual__2026-01-01T00:00:00+00:00"
# one placeholder a node (on a cloud, a rank's GPUs do that; kwok's instance types have none)
APART = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {
                    "matchExpressions": [{"key": PLACEHOLDER_LABEL, "operator": "Exists"}]
                },
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
}


def until(what: str, fn, timeout: float = 30.0, every: float = 0.3):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if got := fn():
            return got
        time.sleep(every)
    raise AssertionError(f"no {what} within {timeout} s")


def ended(b: KubernetesBackend, h, timeout: float) -> tuple[object, float, list]:
    """Look (the operator's way) until the gang's verdict: it, seconds from the launch, and
    every status on the way."""
    seen: list = []

    def verdict():
        seen.append(look(b, h))
        return seen[-1] if seen[-1].terminal else None

    st = until("verdict", verdict, timeout)
    return st, time.time() - h.launched_at, seen


def test_a_partial_gang_ends_when_karpenter_has_no_capacity_left_for_it(karpenter_cluster):
    c = karpenter_cluster
    pool = c.karpenter.nodepool
    spot = Placement({CAPACITY_TYPE: "spot", NODEPOOL_LABEL: pool}, (TOLERATION,), APART)
    # a spot node Karpenter makes while the cloud has spot: it runs another workload
    filler = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "filler"},
        "spec": {
            "nodeSelector": spot.node_selector, "tolerations": [TOLERATION],
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "600"],
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
        },
    }  # fmt: skip
    c.api.create_namespaced_pod(c.namespace, filler)
    node = until(
        "the filler on a Karpenter node",
        lambda: c.api.read_namespaced_pod("filler", c.namespace).spec.node_name,
        60,
    )
    c.karpenter.out_of_capacity({CAPACITY_TYPE: "spot"})
    try:
        b = KubernetesBackend(
            image="ghcr.io/me/train:1", config_file=c.kubeconfig, namespace=c.namespace,
            preset={"spot": spot, "on_demand": Placement({CAPACITY_TYPE: "on-demand"})},
            resources={"requests": {"cpu": "100m", "memory": "64Mi"}}, nodes=N,
        )  # fmt: skip
        assert b.gang_timeout_s == 600.0 and b.pending_timeout_s == 600.0
        began = time.time()
        h = b.launch(TaskIdentity("gang_dag", "short", RUN), 1, "spot", ["sleep", "60"],
                     checkpoint_uri="file:///tmp/x")  # fmt: skip
        st, took, seen = ended(b, h, EARLY_S + 15)
    finally:
        c.karpenter.out_of_capacity()
    assert st.outcome is Outcome.SPOT_UNAVAILABLE and st.granted_at is None, st
    assert st.reason.startswith(f"a partial gang: 1 of {N} nodes, fewer than {N} for "), st.reason
    cap = st.evidence["capacity"]
    assert cap["source"] == "karpenter" and f"{h.pod}-place-1" in cap["detail"], cap
    assert st.evidence["held"] == 1, st.evidence
    # billed as the timeout bills: the node-seconds its placeholder held, since it was placed
    held_s = st.evidence["held_node_s"]
    # the handle's launch is stamped before any pod is created (Kubernetes keeps whole seconds)
    assert began <= h.launched_at
    assert 0 < held_s <= took + 1 and st.evidence["held_since"] >= int(h.launched_at)
    assert all(s.state is State.WAITING for s in seen[:-1])
    assert CAPACITY_SETTLE_S - 1.5 <= took <= EARLY_S, took  # events keep whole seconds
    # the gang is gone (Job, placeholders); the node it held goes back to the other workload
    label = f"{JOB_NAME_LABEL}={h.pod}"
    until("the gang deleted", lambda: not c.api.list_namespaced_pod(
        c.namespace, label_selector=f"{PLACEHOLDER_LABEL}={h.pod}").items and not
        c.api.list_namespaced_pod(c.namespace, label_selector=label).items)  # fmt: skip
    print(f"\npartial gang ended {took:.1f} s after launch ({held_s:.1f} node-s held on {node})")


def pr_backend(cfg: str) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1", config_file=cfg, namespace=NS, preset="karpenter", gpus=1,
        nodes=N, capacity_check="provisioning-request", grace_period_s=1,
    )  # fmt: skip


def test_a_provisioning_requests_capacity_is_not_found_ends_its_gang(
    kube_cluster, sa_kubeconfig, crd
):
    b = pr_backend(sa_kubeconfig[0])
    h = b.launch(TaskIdentity("gang_dag", "pr-short", RUN), 1, "spot", ["sleep", "60"],
                 checkpoint_uri="file:///tmp/x")  # fmt: skip
    name = request_name(h.pod)
    try:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": "Provisioned", "status": "False", "reason": "CapacityIsNotFound",
                "message": "Capacity is not found, CA will try to find it later.",
                "lastTransitionTime": now}  # fmt: skip
        crd.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, name, {"status": {"conditions": [cond]}}
        )
        st, took, seen = ended(b, h, EARLY_S)
        assert st.outcome is Outcome.SPOT_UNAVAILABLE, st
        assert st.reason.startswith(f"no node: 0 of {N} nodes, fewer than {N} for"), st.reason
        assert st.evidence["capacity"]["source"] == "autoscaler" and took <= EARLY_S
        assert "held_node_s" not in st.evidence  # it held nothing: its ranks were gated
        print(f"\nCapacityIsNotFound -> the gang ended in {took:.1f} s after its launch")
    finally:
        b.cancel(h, wait_s=10)
    until("the request deleted", lambda: name not in {
        r["metadata"]["name"]
        for r in crd.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
    }, 10)  # fmt: skip


def test_a_403_deleting_the_request_names_the_rbac_rule(kube_cluster, sa_kubeconfig, crd):
    from kubernetes import client

    from airflow_spot.backends.kubernetes.gang_launch import service_name

    cfg, docs = sa_kubeconfig
    b = pr_backend(cfg)
    h = b.launch(TaskIdentity("gang_dag", "pr-403", RUN), 1, "spot", ["sleep", "60"],
                 checkpoint_uri="file:///tmp/x")  # fmt: skip
    role = next(d for d in docs if d["kind"] == "Role")
    rules = [
        {**r, "verbs": [v for v in r["verbs"] if v != "delete"]}
        if PLURAL in r["resources"] else r
        for r in role["rules"]
    ]  # fmt: skip
    rbac = client.RbacAuthorizationV1Api(kube_cluster.api.api_client)
    rbac.replace_namespaced_role(role["metadata"]["name"], NS, {**role, "rules": rules})
    # (sa_kubeconfig puts it back)
    with pytest.raises(BackendError) as refused:
        b.cancel(h, wait_s=5)
    msg = str(refused.value)
    assert f"could not delete the gang's ProvisioningRequest {request_name(h.pod)}: 403" in msg
    assert "delete on podtemplates and on provisioningrequests" in msg
    assert "docker/rbac.yaml" in msg
    # the gang itself went first: its Job and Service are gone
    batch = client.BatchV1Api(kube_cluster.api.api_client)
    until("the Job gone", lambda: not batch.list_namespaced_job(
        NS, field_selector=f"metadata.name={h.pod}").items, 10)  # fmt: skip
    assert not kube_cluster.api.list_namespaced_service(
        NS, field_selector=f"metadata.name={service_name(h.pod)}"
    ).items


def test_a_gang_with_no_answer_shows_its_pods_pending(kube_cluster, monkeypatch):
    """Our kubelet's autoscaler has one spot node for a gang of two (no Karpenter: no
    answer): once the gang has waited (2 s here, 30 s by default) its status says "fewer than
    2: 1 of 2 pods pending", before its timeout ends it."""
    monkeypatch.setattr(gating, "PENDING_SIGNAL_S", 2.0)
    kube_cluster.kubelet.spot_limit = 1
    b = KubernetesBackend(
        image="ghcr.io/me/train:1", config_file=kube_cluster.kubeconfig,
        namespace=kube_cluster.namespace, preset="karpenter", gpus=1, nodes=N,
        gang_timeout_s=60, grace_period_s=1,
    )  # fmt: skip
    h = b.launch(TaskIdentity("gang_dag", "pending", RUN), 1, "spot", ["sleep", "60"],
                 checkpoint_uri="file:///tmp/x")  # fmt: skip
    try:
        st = until("the pending evidence", lambda: (s := look(b, h)).evidence.get("capacity")
                   and "1 of" in s.evidence["capacity"]["detail"] and s, 20)  # fmt: skip
        cap = st.evidence["capacity"]
        assert st.state is State.WAITING and cap["up"] is False and cap["source"] == "request"
        assert cap["detail"].startswith(f"fewer than {N}: 1 of {N} pods pending for "), cap
        assert cap["detail"].endswith("(holding 1)")
    finally:
        b.cancel(h, wait_s=10)


def test_an_on_demand_gang_gets_reserved_nodes_from_karpenter(karpenter_cluster):
    """``karpenter-reserved``'s fallback (capacity type In [reserved, on-demand]) on
    Karpenter itself: the test cloud has a capacity reservation (a ``reserved`` offering of
    kwok's, :data:`RESERVATION`), and Karpenter's ReservedCapacity feature launches the gang's
    N nodes from it, never on-demand while it lasts; the gang runs on them, not on spot, and
    reports how long the N nodes took (``acquired_s``)."""
    from airflow_spot.backends.kubernetes.placement import PRESETS

    c = karpenter_cluster
    pool = c.karpenter.nodepool
    fallback = PRESETS["karpenter-reserved"]["on_demand"].affinity or {}
    spread = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchExpressions": [{"key": JOB_NAME_LABEL, "operator": "Exists"}]},
        "topologyKey": "kubernetes.io/hostname"}]}}  # fmt: skip
    b = KubernetesBackend(
        image="ghcr.io/me/train:1", config_file=c.kubeconfig, namespace=c.namespace,
        preset={
            "spot": Placement({CAPACITY_TYPE: "spot", NODEPOOL_LABEL: pool}, (TOLERATION,)),
            "on_demand": Placement({NODEPOOL_LABEL: pool}, (TOLERATION,), {**fallback, **spread}),
        },
        resources={"requests": {"cpu": "100m", "memory": "64Mi"}}, nodes=N, grace_period_s=1,
    )  # fmt: skip
    h = b.launch(TaskIdentity("gang_dag", "reserved", RUN), 1, "on_demand", ["sleep", "60"],
                 checkpoint_uri="file:///tmp/x")  # fmt: skip
    try:
        st = until("the gang running", lambda: (s := look(b, h)).state is State.RUNNING and s, 60)
        assert st.evidence["spot_node"] is False and 0 <= st.evidence["acquired_s"] <= 60, st
        nodes = [c.api.read_node(n).metadata.labels for n in st.evidence["nodes"]]
        assert len(set(st.evidence["nodes"])) == N
        for labels in nodes:
            assert labels[CAPACITY_TYPE] == "reserved", labels
            assert labels[RESERVATION_LABEL] == RESERVATION["id"], labels
            assert labels["node.kubernetes.io/instance-type"] == RESERVATION["instance_type"]
        claims = [nc for nc in c.karpenter.nodeclaims() if nc["status"].get("nodeName") in
                  st.evidence["nodes"]]  # fmt: skip
        assert len(claims) == N and all(
            nc["metadata"]["labels"][CAPACITY_TYPE] == "reserved" for nc in claims
        ), claims
        print(f"\nreserved fallback: {N} nodes from Karpenter in {st.evidence['acquired_s']} s")
    finally:
        b.cancel(h, wait_s=10)
