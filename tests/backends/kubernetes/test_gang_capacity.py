"""A waiting spot gang's capacity check in its verdict, pure (issue 36: "no partial gang bills
for long"): a "fewer than N" that stands with no launch on its way ends the gang before its
timeout, billed as the timeout bills it; a gang with no answer shows its own waiting. On the
shapes the real control plane stores (Karpenter v1.14.1's events and NodeClaims, a
check-capacity ProvisioningRequest's conditions, the gang's pods); the real cases are
``real/test_real_gang_capacity.py``."""

from __future__ import annotations

import time
from typing import Any

from airflow_spot.backends.base import Outcome, State
from airflow_spot.backends.kubernetes.capacity_signals import (
    CAPACITY_SETTLE_S,
    claim_count,
    claim_signal,
    in_flight,
)
from airflow_spot.backends.kubernetes.gang_launch import GATE, INDEX
from airflow_spot.backends.kubernetes.gang_ranks import GangLook
from airflow_spot.backends.kubernetes.gang_verdict import Timeouts, judge_gang
from airflow_spot.backends.kubernetes.gating import GangCapacity
from airflow_spot.backends.kubernetes.provisioning import request_signal
from airflow_spot.backends.kubernetes.verdict import GIVE_UP
from airflow_spot.jobstate import AttemptHandle

T0 = 1796561440.0  # 2026-12-06T12:50:40Z: the look's clock
T = Timeouts(pending_s=600.0, gang_s=600.0, settle_s=10.0)  # the defaults' timeouts
HELD = ["job-a1-place-0", "job-a1-place-1"]


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def gated_rank(k: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"job-a1-{k}-x", "uid": f"uid-{k}", "annotations": {INDEX: str(k)}},
        "spec": {"schedulingGates": [{"name": GATE}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                   "reason": "SchedulingGated"}]},
    }  # fmt: skip


def placeholder(k: int, placed_at: float | None) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(placed_at or 0)}
    return {
        "metadata": {"name": HELD[k]},
        "spec": {"nodeName": f"n{k}"} if placed_at else {},
        "status": {"phase": "Pending" if placed_at is None else "Running",
                   "conditions": [cond] if placed_at else []},
    }  # fmt: skip


def nominated(pod: str, claim: str, t: float) -> dict[str, Any]:
    return {
        "reason": "Nominated", "type": "Normal",
        "message": f"Pod should schedule on: nodeclaim/{claim}",
        "involvedObject": {"kind": "Pod", "name": pod}, "lastTimestamp": iso(t),
    }  # fmt: skip


def ice(claim: str, t: float) -> dict[str, Any]:
    return {
        "reason": "InsufficientCapacityError", "type": "Warning",
        "message": f"NodeClaim {claim} event: insufficient capacity: all 4 offerings of NodeClaim "
        f"{claim} are out of capacity in the test cloud (karpenter.sh/capacity-type=spot)",
        "involvedObject": {"kind": "NodeClaim", "name": claim}, "lastTimestamp": iso(t),
    }  # fmt: skip


def nodeclaim(name: str, initialized_at: float | None = None, deleting: bool = False) -> dict:
    conds = [
        {"type": "Launched", "status": "True", "reason": "Launched"},
        {"type": "Initialized", "status": "Unknown", "reason": "AwaitingReconciliation"},
    ]
    if initialized_at is not None:
        conds[1] = {
            "type": "Initialized",
            "status": "True",
            "reason": "Initialized",
            "lastTransitionTime": iso(initialized_at),
        }
    meta = {"name": name, **({"deletionTimestamp": iso(T0)} if deleting else {})}
    return {"metadata": meta, "status": {"conditions": conds}}  # fmt: skip


def karpenter(failed_at: float, claims: list[dict] | None = None) -> GangCapacity:
    """Placeholder 1's NodeClaim failed for capacity at ``failed_at``; ``claims``: the
    cluster's NodeClaims as listed."""
    events = [nominated(HELD[1], "np-b", failed_at - 1)]
    count = claim_count(2, HELD, events, [ice("np-b", failed_at)], claims or [], T0 - 60, T0)
    return GangCapacity(claim_signal(count, ""), count.trying)


def judge(capacity: GangCapacity | None, placed: float | None = T0 - 30, launched=T0 - 40):
    h = AttemptHandle(launched_at=launched, kind="kubernetes", attempt=1, capacity="spot",
                      pod="job-a1")  # fmt: skip
    job = {"metadata": {"name": "job-a1", "uid": "job-uid", "annotations": {}}}
    held = [placeholder(0, placed), placeholder(1, None)]
    look = GangLook.of(2, job, [gated_rank(0), gated_rank(1)], held, {}, {}, T0)
    return judge_gang(h, look, T, capacity).status


def test_a_partial_gang_ends_once_fewer_than_n_stands_with_no_launch_on_its_way() -> None:
    """One node held, the other placeholder's NodeClaim failed for capacity 20 s ago and no
    NodeClaim is on its way: the gang ends now (not at its 600 s timeout), as the timeout
    ends it: spot_unavailable, deleted, the node-seconds it held reported."""
    st = judge(karpenter(T0 - 20))
    assert st.outcome is Outcome.SPOT_UNAVAILABLE and GIVE_UP in st.due, st
    assert st.reason.startswith("a partial gang: 1 of 2 nodes, fewer than 2 for 20 s"), st.reason
    assert "not waiting out the 600 s timeout" in st.reason
    assert st.evidence["held_node_s"] == 30.0 and st.evidence["held_since"] == T0 - 30
    assert st.granted_at is None and st.evidence["capacity"]["source"] == "karpenter"
    assert st.evidence["signals"] == ["held 1 of 2", "fewer than N 20 s"]


def test_fewer_than_n_waits_its_settle_window_and_for_launches_on_their_way() -> None:
    """Karpenter retries a pod whose launch failed on the offerings left (a new NodeClaim,
    not named to us): no end within the settle window, nor while a NodeClaim may still bring a
    node (not initialized, or initialized just now)."""
    young = judge(karpenter(T0 - CAPACITY_SETTLE_S + 1))
    assert young.state is State.WAITING and not young.terminal, young
    assert young.evidence["capacity"]["up"] is False  # the evidence shows all the same
    for claims in ([nodeclaim("np-c")], [nodeclaim("np-c", initialized_at=T0 - 3)]):
        st = judge(karpenter(T0 - 20, claims))
        assert st.state is State.WAITING, (claims, st)
    done = judge(karpenter(T0 - 20, [nodeclaim("np-c", T0 - 300), nodeclaim("np-d", None, True)]))
    assert done.outcome is Outcome.SPOT_UNAVAILABLE  # an old node, a claim being deleted


def test_in_flight_nodeclaims() -> None:
    claims = [nodeclaim("a"), nodeclaim("b", T0 - 5), nodeclaim("c", T0 - 60),
              nodeclaim("d", deleting=True), nodeclaim("failed")]  # fmt: skip
    assert in_flight(claims, ["failed"], T0) == ("a", "b")


def test_a_provisioning_requests_capacity_is_not_found_ends_the_gang() -> None:
    """check-capacity answered CapacityIsNotFound 20 s ago: the gang (holding nothing: its
    ranks are gated, no placeholders) ends; Provisioned=True does not end it."""

    def pr(status: str, reason: str) -> GangCapacity:
        cond = {"type": "Provisioned", "status": status, "reason": reason,
                "message": "Capacity is not found, CA will try to find it later.",
                "lastTransitionTime": iso(T0 - 20)}  # fmt: skip
        return GangCapacity(request_signal({"metadata": {"name": "job-a1-capacity"},
                                          "status": {"conditions": [cond]}}, 2))  # fmt: skip

    st = judge(pr("False", "CapacityIsNotFound"), placed=None)
    assert st.outcome is Outcome.SPOT_UNAVAILABLE and st.reason.startswith("no node: 0 of 2")
    assert "held_node_s" not in st.evidence and st.evidence["capacity"]["source"] == "autoscaler"
    assert not judge(pr("True", "CapacityIsFound"), placed=None).terminal


def test_a_gang_with_no_answer_shows_its_own_waiting_and_never_ends_on_it() -> None:
    """No capacity answer: after 30 s of waiting the status says "fewer than N" (source
    ``request``: the pods still pending), which only the timeouts act on."""
    assert "capacity" not in judge(None, launched=T0 - 20).evidence  # not after a while yet
    st = judge(GangCapacity(None), launched=T0 - 400)
    cap = st.evidence["capacity"]
    assert st.state is State.WAITING and cap["up"] is False and cap["source"] == "request", st
    assert cap["detail"] == "fewer than 2: 1 of 2 pods pending for 400 s (holding 1)"
    assert cap["at"] == T0
    timed = judge(None, launched=T0 - 601)
    assert timed.outcome is Outcome.SPOT_UNAVAILABLE and "after 600 s" in timed.reason
    assert timed.evidence["capacity"]["detail"].startswith("fewer than 2: 1 of 2 pods pending")
