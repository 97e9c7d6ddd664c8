"""RBAC for real (issue 20): ``docker/rbac.yaml`` applied to the real API server; the backend,
through a kubeconfig holding that ServiceAccount's token, does everything it needs (launch,
status, logs, the notice relay, spot signals, probes, cancel), is not cluster-admin, and a
missing verb gives its clear error naming the permission."""

from __future__ import annotations

import time

import pytest

from airflow_spot.backends.base import Outcome, State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.exceptions import BackendError

NS = "ml-training"  # docker/rbac.yaml's namespace (the sa_kubeconfig fixture, conftest.py)
IDENT = TaskIdentity("nightly_train", "train", "manual__2026-01-01T00:00:00+00:00")


def backend(cfg: str) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1", config_file=cfg, namespace=NS, preset="karpenter", gpus=1
    )


def test_the_service_account_of_rbac_yaml_can_do_everything_the_backend_needs(
    kube_cluster, sa_kubeconfig
) -> None:
    """Launch, status (pod, node, events), the notice relay (patch), logs, spot signals, a
    probe and its answer, and cancel, all as the ServiceAccount; and it is no cluster-admin."""
    from kubernetes import client

    cfg, _ = sa_kubeconfig
    b = backend(cfg)
    h = b.launch(
        IDENT, 1, "spot", ["sh", "-c", "echo started; sleep 600"], checkpoint_uri="file:///tmp/x"
    )
    until = time.monotonic() + 60
    while (st := b.status(h)).state is not State.RUNNING:
        assert time.monotonic() < until and not st.terminal, st
        time.sleep(0.2)
    node = b.api.core.read_namespaced_pod(h.pod, NS).spec.node_name
    kube_cluster.kubelet._notice(node)  # an interruption warning on its node: relayed (patch)
    until = time.monotonic() + 30
    while not h.notice_sent:
        st = b.status(h)
        b.carry_out(h, st)
        assert time.monotonic() < until, "the notice was not relayed"
        time.sleep(0.2)
    ann = b.api.core.read_namespaced_pod(h.pod, NS).metadata.annotations
    assert ann["airflow-spot/preemption-notice"]
    time.sleep(0.5)
    assert "started" in b.log_tail(h)
    assert not any(s.up for s in b.spot_signals(time.time()))  # its node's one GPU is taken
    spare = kube_cluster.kubelet.add_node("spare-spot", {"karpenter.sh/capacity-type": "spot"})
    kube_cluster.kubelet.wait_ready(spare)
    signals = b.spot_signals(time.time())
    assert any(s.up and spare in s.detail for s in signals), signals  # a Ready spot node, free
    probe = b.probe(IDENT)
    until = time.monotonic() + 30
    while (sig := b.probe_signal(probe, time.time())) is None:
        assert time.monotonic() < until, "the probe never answered"
        time.sleep(0.2)
    assert sig.up is True, sig
    b.drop_probe(probe)
    st = b.cancel(h, wait_s=30)
    assert st.outcome is Outcome.CANCELLED, st
    review = client.AuthorizationV1Api(b.api.core.api_client).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(
            spec={"resourceAttributes": {"verb": "*", "resource": "*", "group": "*"}}
        )
    )
    assert review.status.allowed is False  # never cluster-admin
    for verb, res, ns in [
        ("delete", "nodes", None),
        ("create", "pods", "default"),
        ("get", "secrets", NS),
    ]:
        r = client.AuthorizationV1Api(b.api.core.api_client).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(
                spec={"resourceAttributes": {"verb": verb, "resource": res, "namespace": ns}}
            )
        )
        assert r.status.allowed is False, (verb, res, ns)


def test_without_get_on_nodes_the_error_names_the_permission(kube_cluster, sa_kubeconfig) -> None:
    """With ``get`` taken off nodes in the ClusterRole, reading the attempt's status fails
    with the backend's error that names the missing permission and docker/rbac.yaml."""
    from kubernetes import client

    cfg, docs = sa_kubeconfig
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    cut = {
        **role,
        "rules": [
            {
                **r,
                "verbs": [v for v in r["verbs"] if not (v == "get" and "nodes" in r["resources"])],
            }
            for r in role["rules"]
        ],
    }
    client.RbacAuthorizationV1Api(kube_cluster.api.api_client).replace_cluster_role(
        role["metadata"]["name"], cut
    )
    b = backend(cfg)
    h = b.launch(IDENT, 1, "spot", ["sleep", "600"], checkpoint_uri="file:///tmp/x")
    until = time.monotonic() + 60
    with pytest.raises(BackendError) as err:  # noqa: PT012 - polls until the pod is bound
        while time.monotonic() < until:
            b.status(h)
            time.sleep(0.2)
    msg = str(err.value)
    assert "403" in msg and "nodes" in msg and "rbac.yaml" in msg, msg
