"""The gang's capacity signals, pure: Karpenter's NodeClaims for its pods counted
(:mod:`airflow_spot.backends.kubernetes.capacity_signals`) and a check-capacity
ProvisioningRequest read (:mod:`airflow_spot.backends.kubernetes.provisioning`), on the shapes
the real control plane stored (test_real_capacity_claims.py, test_real_provisioning_request.py)."""

from __future__ import annotations

import pytest

from airflow_spot.backends.kubernetes.capacity_signals import claim_count, claim_signal
from airflow_spot.backends.kubernetes.provisioning import (
    ATOMIC_SCALE_UP,
    CHECK_CAPACITY,
    CLASS_ANNOTATION,
    CLASSES,
    CONSUME_ANNOTATION,
    build_pod_template,
    build_request,
    check_capacity_check,
    consume,
    request_signal,
)
from airflow_spot.exceptions import ConfigError

T0 = 1796561440.0  # 2026-12-06T12:50:40Z
PODS = ["g-probe-80aa41-0", "g-probe-80aa41-1"]


def iso(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def nominated(pod: str, claim: str, t: float) -> dict:
    """Karpenter's event on a pod it made a NodeClaim for (v1.14.1, as stored)."""
    return {
        "reason": "Nominated",
        "type": "Normal",
        "message": f"Pod should schedule on: nodeclaim/{claim}",
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "t1"},
        "source": {"component": "karpenter"},
        "lastTimestamp": iso(t),
    }


def ice(claim: str, t: float) -> dict:
    """Karpenter's event on a NodeClaim whose launch failed for capacity (the test cloud's)."""
    return {
        "reason": "InsufficientCapacityError",
        "type": "Warning",
        "message": f"NodeClaim {claim} event: insufficient capacity: all 4 offerings of NodeClaim "
        f"{claim} are out of capacity in the test cloud (karpenter.sh/capacity-type=spot)",
        "involvedObject": {"kind": "NodeClaim", "name": claim},
        "source": {"component": "karpenter"},
        "lastTimestamp": iso(t),
    }


def nodeclaim(name: str, launched_at: float | None) -> dict:
    conds = [{"type": "Launched", "status": "Unknown", "reason": "AwaitingReconciliation"}]
    if launched_at is not None:
        conds = [{"type": "Launched", "status": "True", "reason": "Launched",
                  "lastTransitionTime": iso(launched_at)}]  # fmt: skip
    return {"metadata": {"name": name}, "status": {"conditions": conds}}


def test_one_nodeclaim_of_ours_failed_for_capacity_is_fewer_than_n() -> None:
    events = [nominated(p, "airflow-spot-5xnz2", T0 + 1) for p in PODS]
    count = claim_count(2, PODS, events, [ice("airflow-spot-5xnz2", T0 + 2)], [], T0, T0 + 3)
    assert count.stranded == PODS
    sig = claim_signal(count, "")
    assert sig is not None and sig.up is False and sig.at == T0 + 2 and sig.source == "karpenter"
    assert sig.detail.startswith("fewer than 2: 1 of 1 NodeClaims for the gang's 2 pods")


def test_k_of_n_nodeclaims_failed() -> None:
    events = [nominated(PODS[0], "np-a", T0 + 1), nominated(PODS[1], "np-b", T0 + 1)]
    count = claim_count(
        2, PODS, events, [ice("np-b", T0 + 2)], [nodeclaim("np-a", T0 + 2)], T0, T0 + 3
    )
    assert count.stranded == [PODS[1]]
    sig = claim_signal(count, "pool-a")
    assert sig is not None and not sig.up and "1 of 2 NodeClaims" in sig.detail
    assert sig.pool == "pool-a"


def test_all_n_launched_is_n_seen() -> None:
    events = [nominated(PODS[0], "np-a", T0 + 1), nominated(PODS[1], "np-b", T0 + 1)]
    claims = [nodeclaim("np-a", T0 + 2), nodeclaim("np-b", T0 + 3)]
    sig = claim_signal(claim_count(2, PODS, events, [], claims, T0, T0 + 4), "")
    assert sig is not None and sig.up and sig.at == T0 + 3 and sig.detail.startswith("2 seen")


@pytest.mark.parametrize(
    "why, events, ices, claims, now",
    [
        ("nothing nominated yet", [], [], [], T0 + 3),
        ("one pod nominated only", [nominated(PODS[0], "np-a", T0 + 1)], [],
         [nodeclaim("np-a", T0 + 2)], T0 + 3),
        ("a launch on its way", [nominated(p, "np-a", T0 + 1) for p in PODS], [],
         [nodeclaim("np-a", None)], T0 + 3),
        ("another gang's NodeClaim failed", [nominated(p, "np-a", T0 + 1) for p in PODS],
         [ice("np-z", T0 + 2)], [], T0 + 3),
        ("a nomination from before our pods", [nominated(p, "np-a", T0 - 60) for p in PODS],
         [ice("np-a", T0 - 59)], [], T0 + 3),
        ("an ICE Karpenter has forgotten (3 min)", [nominated(p, "np-a", T0 + 1) for p in PODS],
         [ice("np-a", T0 + 2)], [], T0 + 200),
        ("NodeClaims gone", [nominated(p, "np-a", T0 + 1) for p in PODS], [], [], T0 + 3),
    ],
)  # fmt: skip
def test_unknown(why, events, ices, claims, now) -> None:
    assert claim_signal(claim_count(2, PODS, events, ices, claims, T0, now), "") is None, why


def request(*conds: dict) -> dict:
    return {"metadata": {"name": "g-a1-capacity"}, "status": {"conditions": list(conds)}}


def cond(kind: str, status: str, reason: str, t: float = T0) -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": iso(t)}  # fmt: skip


@pytest.mark.parametrize(
    "conds, up",
    [
        ((cond("Provisioned", "True", "CapacityIsFound"),), True),
        ((cond("CapacityAvailable", "True", "CapacityIsFound"),), True),
        ((cond("Provisioned", "False", "CapacityIsNotFound"),), False),
        ((cond("Failed", "True", "CapacityIsNotFound"),), False),
        ((), None),
        ((cond("Accepted", "True", "Accepted"),), None),
        ((cond("Failed", "True", "FailedToCheckCapacity"),), None),
        ((cond("Provisioned", "True", "CapacityIsFound"), cond("BookingExpired", "True", "x")),
         None),
        ((cond("Provisioned", "False", "SomethingElse"),), None),
    ],
)  # fmt: skip
def test_a_provisioning_requests_conditions(conds, up) -> None:
    sig = request_signal(request(*conds), 4)
    assert (sig.up if sig is not None else None) is up, sig
    if sig is not None:
        assert sig.at == T0 and sig.source == "autoscaler"
        assert sig.detail.startswith("4 seen" if up else "fewer than 4")


def test_the_request_and_its_template() -> None:
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "g-a1", "uid": "u"}
    pod = {"metadata": {"name": "p"}, "spec": {"schedulingGates": [{"name": "x"}],
           "nodeSelector": {"karpenter.sh/capacity-type": "spot"}}}  # fmt: skip
    tmpl = build_pod_template(pod, job="g-a1", owner=ref, labels={"a": "b"})
    assert "schedulingGates" not in tmpl["template"]["spec"] and pod["spec"]["schedulingGates"]
    pr = build_request(job="g-a1", nodes=4, owner=ref, labels={"a": "b"}, cls=CHECK_CAPACITY)
    assert pr["spec"]["podSets"] == [{"podTemplateRef": {"name": "g-a1-capacity"}, "count": 4}]
    assert pr["spec"]["provisioningClassName"] == CHECK_CAPACITY
    assert (
        consume(pod, "g-a1", CHECK_CAPACITY)["metadata"]["annotations"][CONSUME_ANNOTATION]
        == "g-a1-capacity"
    )
    assert "annotations" not in pod["metadata"]


def test_the_atomic_class_asks_the_autoscaler_to_scale_up() -> None:
    """``capacity_check="atomic-scale-up"``: the request and the ranks' annotation name the
    class that scales up (check-capacity sees only the nodes already there); its
    ``CapacityIsProvisioned`` is the grant, and the signal names the class."""
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "g-a1", "uid": "u"}
    pr = build_request(job="g-a1", nodes=4, owner=ref, labels={}, cls=ATOMIC_SCALE_UP)
    assert CLASSES["atomic-scale-up"] == pr["spec"]["provisioningClassName"] == ATOMIC_SCALE_UP
    assert CLASSES["provisioning-request"] == CHECK_CAPACITY
    pod = consume({"metadata": {}}, "g-a1", ATOMIC_SCALE_UP)
    assert pod["metadata"]["annotations"][CLASS_ANNOTATION] == ATOMIC_SCALE_UP
    got = {**request(cond("Provisioned", "True", "CapacityIsProvisioned")), "spec": pr["spec"]}
    sig = request_signal(got, 4)
    assert sig is not None and sig.up and f"({ATOMIC_SCALE_UP})" in sig.detail, sig
    sig = request_signal(request(cond("Provisioned", "False", "CapacityIsNotFound")), 4)
    assert sig is not None and f"({CHECK_CAPACITY})" in sig.detail, sig  # no class: the check's
    assert "never scales up; for spot nodes that scale from zero use capacity_check='atomic" in (
        sig.detail
    )


def test_capacity_check_values() -> None:
    check_capacity_check("placeholders")
    check_capacity_check("provisioning-request")
    check_capacity_check("atomic-scale-up")
    with pytest.raises(ConfigError, match="backend.capacity_check"):
        check_capacity_check("check-capacity")
