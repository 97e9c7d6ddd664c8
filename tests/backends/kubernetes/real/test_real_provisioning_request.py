"""A spot gang gated on a ProvisioningRequest (``capacity_check="atomic-scale-up"``, class
``best-effort-atomic-scale-up``, or ``"provisioning-request"``, ``check-capacity``) on the real
control plane, as docker/rbac.yaml's ServiceAccount.

The API side is real: cluster-autoscaler's ProvisioningRequest CRD (``data/``, bundled from
kubernetes/autoscaler) is installed on the real API server, which validates the request and
PodTemplate the backend creates, stores their status, and garbage-collects nothing we did not
delete. cluster-autoscaler itself does not run: the Go module proxy refuses
``k8s.io/autoscaler/cluster-autoscaler`` (403, "This module version is not available"), so it
cannot be built here the way Karpenter is. The test therefore writes the conditions
cluster-autoscaler's classes write (``Provisioned`` False ``CapacityIsNotFound`` "Capacity is
not found, CA will try to find it later.", then True: ``CapacityIsProvisioned`` for the atomic
class, ``CapacityIsFound`` for check-capacity): that part is emulated. Our kubelet then makes the nodes
for the ranks once their gates are lifted.
"""

from __future__ import annotations

import time

import pytest

from airflow_spot.backends.base import State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.gang_launch import GATE, JOB_NAME_LABEL
from airflow_spot.backends.kubernetes.gating import GRANTED_ANNOTATION, PLACEHOLDER_LABEL
from airflow_spot.backends.kubernetes.provisioning import (
    ATOMIC_SCALE_UP,
    CHECK_CAPACITY,
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    GROUP,
    PLURAL,
    VERSION,
    request_name,
)
from airflow_spot.exceptions import ConfigError
from airflow_spot.testing.cluster.looks import look

NS = "ml-training"  # docker/rbac.yaml's namespace
N = 2
IDENT = TaskIdentity("gang_dag", "provreq", "manual__2026-01-01T00:00:00+00:00")


def condition(custom, name: str, status: str, reason: str, message: str) -> None:
    """Write ``Provisioned`` as cluster-autoscaler's check-capacity class does (emulated)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cond = {"type": "Provisioned", "status": status, "reason": reason, "message": message}
    cond |= {"lastTransitionTime": now}
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, name, {"status": {"conditions": [cond]}}
    )


def until(what: str, fn, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if got := fn():
            return got
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


@pytest.mark.parametrize(
    ("check", "cls", "found"),
    [
        ("atomic-scale-up", ATOMIC_SCALE_UP, "CapacityIsProvisioned"),
        ("provisioning-request", CHECK_CAPACITY, "CapacityIsFound"),
    ],
)
def test_a_spot_gang_waits_for_its_provisioning_request_then_its_gates_lift(
    kube_cluster, sa_kubeconfig, crd, check, cls, found
) -> None:
    """The gang's Job carries the consume annotation and its gate; no placeholders, a
    request of the class asked for N copies of the rank pod instead. Unanswered: unknown;
    ``CapacityIsNotFound``: "fewer than N" in the status; ``Provisioned=True`` (the atomic
    class's ``CapacityIsProvisioned``, check-capacity's ``CapacityIsFound``): the grant is
    recorded at the condition's time and the gates lift, the ranks run. Cancelling deletes the
    request and its PodTemplate."""
    from kubernetes import client

    cfg, _ = sa_kubeconfig
    b = KubernetesBackend(
        image="ghcr.io/me/train:1", config_file=cfg, namespace=NS, preset="karpenter", gpus=1,
        nodes=N, capacity_check=check, grace_period_s=1,
    )  # fmt: skip
    h = b.launch(IDENT, 1, "spot", ["sleep", "600"], checkpoint_uri="file:///tmp/x")
    name, core = request_name(h.pod), kube_cluster.api
    try:
        pr = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        assert pr["spec"] == {
            "provisioningClassName": cls,
            "podSets": [{"podTemplateRef": {"name": name}, "count": N}],
        }
        assert pr["metadata"]["ownerReferences"][0]["name"] == h.pod
        tmpl = core.read_namespaced_pod_template(name, NS).template.spec
        assert tmpl.scheduling_gates is None and tmpl.node_selector, tmpl
        pods = until("2 rank pods", lambda: core.list_namespaced_pod(
            NS, label_selector=f"{JOB_NAME_LABEL}={h.pod}").items if len(core.list_namespaced_pod(
            NS, label_selector=f"{JOB_NAME_LABEL}={h.pod}").items) == N else None)  # fmt: skip
        for p in pods:
            assert p.metadata.annotations[CONSUME_ANNOTATION] == name
            assert p.metadata.annotations[CLASS_ANNOTATION] == cls
            assert [g.name for g in p.spec.scheduling_gates] == [GATE]
        assert not core.list_namespaced_pod(NS, label_selector=f"{PLACEHOLDER_LABEL}={h.pod}").items
        st = look(b, h)
        assert st.state is State.WAITING and "capacity" not in st.evidence, st  # unanswered

        condition(crd, name, "False", "CapacityIsNotFound",
                  "Capacity is not found, CA will try to find it later.")  # fmt: skip
        st = look(b, h)
        cap = st.evidence["capacity"]
        assert st.state is State.WAITING and cap["up"] is False, st
        assert cap["source"] == "autoscaler" and f"fewer than {N}" in cap["detail"], cap
        assert f"({cls})" in cap["detail"], cap

        t0 = time.monotonic()
        condition(crd, name, "True", found, "Capacity is found in the cluster")
        granted = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        at = granted["status"]["conditions"][0]["lastTransitionTime"]
        st = until("the ranks running", lambda: (s := look(b, h)).state is State.RUNNING and s)
        took = time.monotonic() - t0
        job = client.BatchV1Api(core.api_client).read_namespaced_job(h.pod, NS)
        recorded = float(job.metadata.annotations[GRANTED_ANNOTATION])
        assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(recorded)) == at
        assert st.granted_at == recorded, st
        print(f"\nProvisioned=True -> {N} ranks running: {took:.1f} s")
    finally:
        b.cancel(h, wait_s=15)
    with pytest.raises(client.ApiException) as gone:
        crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    assert gone.value.status == 404
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_pod_template(name, NS)
    assert gone.value.status == 404
    review = client.AuthorizationV1Api(b.api.core.api_client).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(
            spec={"resourceAttributes": {"verb": "list", "resource": "nodeclaims",
                                         "group": "karpenter.sh"}}
        )
    )  # fmt: skip
    assert review.status.allowed is True  # the NodeClaim count's read (docker/rbac.yaml)


def test_a_bad_capacity_check_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"backend.capacity_check.*'atomic-scale-up'"):
        KubernetesBackend(image="x", nodes=2, capacity_check="provreq")
