"""Fixtures of the real-control-plane tests: docker/rbac.yaml's ServiceAccount, for real."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from airflow_spot.backends.kubernetes.probe import build_priority_class
from airflow_spot.testing.cluster import write_kubeconfig

RBAC = Path(__file__).resolve().parents[4] / "docker" / "rbac.yaml"
CRD = Path(__file__).parent / "data" / "provisioningrequests-crd.yaml"  # cluster-autoscaler's
NS = "ml-training"


def apply_rbac(api, docs: list[dict]) -> None:
    from kubernetes import client, utils

    with_ns = client.V1Namespace(metadata=client.V1ObjectMeta(name=NS))
    try:
        api.create_namespace(with_ns)
    except client.ApiException as e:
        assert e.status == 409
    for doc in docs:
        try:
            utils.create_from_dict(api.api_client, doc)
        except utils.FailToCreateError as e:
            if any(x.status != 409 for x in e.api_exceptions):
                raise
            rbac = client.RbacAuthorizationV1Api(api.api_client)
            name = doc["metadata"]["name"]
            if doc["kind"] == "ClusterRole":
                rbac.replace_cluster_role(name, doc)
            elif doc["kind"] == "Role":
                rbac.replace_namespaced_role(name, doc["metadata"]["namespace"], doc)


@pytest.fixture
def sa_kubeconfig(kube_cluster, tmp_path):
    """The ServiceAccount of docker/rbac.yaml, applied for real, as a token kubeconfig."""
    from kubernetes import client

    api = kube_cluster.api
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    apply_rbac(api, docs)
    # the PriorityClass probes need, made once by an admin (the worker may not create it)
    sched = client.SchedulingV1Api(api.api_client)
    try:
        sched.create_priority_class(build_priority_class())
    except client.ApiException as e:
        assert e.status == 409
    token = api.create_namespaced_service_account_token(
        "airflow-spot",
        NS,
        client.AuthenticationV1TokenRequest(spec={"audiences": [], "expirationSeconds": 3600}),
    ).status.token
    cfg = write_kubeconfig(
        tmp_path / "sa.kubeconfig",
        kube_cluster.plane.server,
        kube_cluster.plane.root / "pki" / "ca.crt",
        token=token,
    )
    yield str(cfg), docs
    apply_rbac(api, docs)  # put back what a test took away
    for p in api.list_namespaced_pod(NS).items:
        api.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=0)


@pytest.fixture
def crd(kube_cluster):
    """cluster-autoscaler's ProvisioningRequest CRD on the real API server, Established."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube_cluster.api.api_client)
    doc = yaml.safe_load(CRD.read_text())
    try:
        ext.create_custom_resource_definition(doc)
    except client.ApiException as e:
        assert e.status == 409
    until = time.monotonic() + 20
    while time.monotonic() < until:
        got = ext.read_custom_resource_definition(doc["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in got.status.conditions or []):
            return client.CustomObjectsApi(kube_cluster.api.api_client)
        time.sleep(0.2)
    raise AssertionError("the ProvisioningRequest CRD is not Established")
