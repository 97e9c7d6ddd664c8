"""The verdict of one look at an attempt's pod, judged without a cluster: real client model
objects (made from the API JSON a server sends), the handle as it was, and the time of the
look given. Each case checks the status the backend reports and what the handle records;
every case also checks that the inputs are left as they were."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiClient

from airflow_spot.backends.base import Outcome, State
from airflow_spot.backends.kubernetes.verdict import GIVE_UP, RELAY_NOTICE, identities, judge
from airflow_spot.jobstate import AttemptHandle

T0 = 1_772_445_600.0  # 2026-03-02T10:00:00Z: the launch
NOW = T0 + 120.0  # the look
_CLIENT = ApiClient()


def model(kind: str, body: dict[str, Any]) -> Any:
    """A model object as the client makes it from the server's JSON."""
    return _CLIENT.deserialize(SimpleNamespace(data=json.dumps(body)), kind)


def at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SCHEDULED = {"type": "PodScheduled", "status": "True", "lastTransitionTime": at(T0 + 10)}


def pod(
    phase: str = "Running",
    *,
    node: str | None = "n1",
    conditions: tuple[dict[str, Any], ...] = (SCHEDULED,),
    state: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    reason: str | None = None,
) -> Any:
    if state is None:
        state = {"running": {"startedAt": at(T0 + 20)}} if phase == "Running" else {}
    return model(
        "V1Pod",
        {
            "metadata": {
                "name": "train-a1",
                "namespace": "ml",
                "uid": "pod-uid",
                "annotations": annotations or {},
            },
            "spec": {"nodeName": node, "containers": [{"name": "train", "image": "img"}]},
            "status": {
                "phase": phase,
                "reason": reason,
                "conditions": list(conditions),
                "containerStatuses": [
                    {
                        "name": "train",
                        "image": "img",
                        "imageID": "",
                        "ready": phase == "Running",
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            },
        },
    )


def exited(code: int, reason: str = "Error") -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason,
            "startedAt": at(T0 + 20),
            "finishedAt": at(T0 + 100),
        }
    }


def node(labels: dict[str, str] | None = None, taints: tuple[str, ...] = ()) -> Any:
    return model(
        "V1Node",
        {
            "metadata": {
                "name": "n1",
                "uid": "node-uid",
                "creationTimestamp": at(T0 - 3600),
                "labels": labels or {},
            },
            "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints] or None},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )


def event(reason: str, message: str = "", kind: str = "Node") -> Any:
    return model(
        "CoreV1Event",
        {
            "metadata": {"name": f"e-{reason}", "namespace": "ml"},
            "involvedObject": {"kind": kind, "name": "n1"},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "lastTimestamp": at(NOW - 5),
        },
    )


SPOT = {"karpenter.sh/capacity-type": "spot"}
ON_DEMAND = {"karpenter.sh/capacity-type": "on-demand"}


def launched(capacity: str = "spot", **seen: Any) -> AttemptHandle:
    """The handle as launch made it, with what earlier looks recorded."""
    h = AttemptHandle(
        launched_at=T0,
        kind="kubernetes",
        attempt=1,
        capacity=capacity,
        namespace="ml",
        pod="train-a1",
        was_spot=capacity == "spot",
        was_running=False,
        notice_sent=False,
        pending_since=T0,
    )
    for k, v in seen.items():
        setattr(h, k, v)
    return h


def judged(handle: AttemptHandle, p: Any, n: Any = None, events: tuple[Any, ...] = (), **kw: Any):
    """judge(), checking that it left its inputs as they were."""
    before = [copy.deepcopy(x) for x in (handle, p, n, list(events))]
    got = judge(handle, p, n, list(events), NOW, **kw)
    assert [handle, p, n, list(events)] == before, "judge changed its inputs"
    return got


def test_a_running_pod_on_a_spot_node_records_its_node_and_capacity() -> None:
    """Running: its node, the node's identity and capacity and that it ran are recorded; the
    times come from the pod, the heartbeat is the look's."""
    got = judged(launched(), pod(), node(SPOT))
    st = got.status
    assert st.state is State.RUNNING and not st.terminal and st.due == ()
    assert (st.granted_at, st.started_at, st.heartbeat) == (T0 + 10, T0 + 20, NOW)
    assert got.record == {
        "pod_uid": "pod-uid",
        "node": "n1",
        "node_uid": "node-uid",
        "node_created": T0 - 3600,
        "was_running": True,
        "pending_since": None,
    }
    assert st.evidence == {"node": "n1", "spot_node": True, "signals": [], "notice": None}
    assert not got.default_used


def test_a_spot_launch_on_an_on_demand_node_records_on_demand() -> None:
    got = judged(launched(), pod(), node(ON_DEMAND))
    assert got.record["was_spot"] is False and got.status.evidence["spot_node"] is False


def test_a_pod_that_succeeded_ends_succeeded_at_its_container_s_finish() -> None:
    got = judged(
        launched(was_running=True), pod("Succeeded", state=exited(0, "Completed")), node(SPOT)
    )
    st = got.status
    assert (st.state, st.outcome, st.exit_code) == (State.ENDED, Outcome.SUCCEEDED, 0)
    assert st.ended_at == T0 + 100  # the container's finish, not the look


def test_a_non_zero_exit_on_healthy_capacity_is_the_application_s() -> None:
    got = judged(launched("on_demand"), pod("Failed", state=exited(3)), node(ON_DEMAND))
    st = got.status
    assert (st.outcome, st.exit_code, st.reason) == (
        Outcome.APP_FAILURE,
        3,
        "exit code 3 on healthy capacity",
    )


def test_exit_73_on_healthy_capacity_is_an_unwritable_checkpoint_location() -> None:
    """The training helper's exit when its checkpoint location took no writes: not the
    application's failure (no budget spent)."""
    got = judged(launched("on_demand"), pod("Failed", state=exited(73)), node(ON_DEMAND))
    assert got.status.outcome is Outcome.CHECKPOINT_UNWRITABLE and got.status.exit_code == 73
    assert "checkpoint location took no writes" in got.status.reason


def test_an_oom_kill_is_its_own_outcome() -> None:
    got = judged(launched(), pod("Failed", state=exited(137, "OOMKilled")), node(SPOT))
    assert got.status.outcome is Outcome.OOM_KILLED and got.status.exit_code == 137


def test_a_pod_gone_after_running_on_spot_was_preempted_at_the_look() -> None:
    """The node took the pod with it: what earlier looks recorded decides."""
    h = launched(was_running=True, node="n1", pod_uid="pod-uid", pending_since=None)
    got = judged(h, None, None)
    st = got.status
    assert (st.state, st.outcome, st.ended_at, st.exit_code) == (
        State.ENDED,
        Outcome.PREEMPTED,
        NOW,
        None,
    )
    assert st.evidence["signals"] == ["pod not found"] and got.record == {}


def test_the_node_gone_under_a_running_pod_is_a_preemption() -> None:
    h = launched(was_running=True, node="n1", pending_since=None)
    got = judged(h, pod(), None)
    assert got.status.outcome is Outcome.PREEMPTED
    assert "node gone" in got.status.evidence["signals"]


def test_a_reclaim_taint_records_the_notice_and_asks_to_relay_it() -> None:
    """The cloud's taint on a running pod's node: the notice is kept (its node may be gone at
    the verdict), dated by the look, and relaying it is due; once relayed, none is due."""
    taint = "aws-node-termination-handler/spot-itn"
    got = judged(launched(), pod(), node(SPOT, (taint,)))
    assert got.status.state is State.PREEMPTING and got.status.due == (RELAY_NOTICE,)
    assert got.record["notice"] == f"node taint {taint}" and got.record["notice_at"] == NOW
    sent = launched(notice=f"node taint {taint}", notice_at=NOW - 30, notice_sent=True)
    again = judged(sent, pod(), node(SPOT, (taint,)))
    assert again.status.state is State.PREEMPTING and again.status.due == ()
    assert "notice" not in again.record and "notice_at" not in again.record  # the first stays


def test_the_cloud_s_word_replaces_karpenter_s_taint_as_the_notice_kept() -> None:
    h = launched(notice="node taint karpenter.sh/disrupted", notice_at=NOW - 30)
    got = judged(h, pod(), node(SPOT, ("karpenter.sh/disrupted",)), (event("SpotInterrupted"),))
    assert got.record == {
        "pod_uid": "pod-uid",
        "node": "n1",
        "node_uid": "node-uid",
        "node_created": T0 - 3600,
        "was_running": True,
        "pending_since": None,
        "notice": "event SpotInterrupted",
    }


def test_a_disruption_target_of_a_lost_node_on_spot_is_a_preemption() -> None:
    lost = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    got = judged(launched(was_running=True), pod("Failed", conditions=(lost,)), node(SPOT))
    assert got.status.outcome is Outcome.PREEMPTED
    assert got.status.evidence["signals"] == ["DisruptionTarget/DeletionByTaintManager"]


def test_a_drain_for_karpenter_s_consolidation_is_no_preemption() -> None:
    drained = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    said = event("DisruptionTerminating", "Disrupting Node: Underutilized/Delete")
    got = judged(
        launched(was_running=True), pod("Failed", conditions=(drained,)), node(SPOT), (said,)
    )
    assert got.status.outcome is Outcome.INFRA_DISRUPTION
    assert "Karpenter's own disruption" in (got.status.reason or "")


def test_a_pending_spot_pod_waits_then_spot_is_unavailable_and_it_is_given_up() -> None:
    """Unschedulable past pending_timeout_s: spot unavailable, and deleting it is due (it
    would start later beside the next attempt); before that it waits."""
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    waiting = pod("Pending", node=None, conditions=(unschedulable,), state={})
    got = judged(launched(), waiting, None, pending_timeout_s=600.0)
    assert got.status.state is State.WAITING and got.record == {"pod_uid": "pod-uid"}
    on_demand = judged(launched("on_demand"), waiting, None)
    assert on_demand.status.state is State.LAUNCHING  # on-demand is launching, not waiting
    late = judged(launched(pending_since=NOW - 601), waiting, None, pending_timeout_s=600.0)
    assert late.status.outcome is Outcome.SPOT_UNAVAILABLE and late.status.due == (GIVE_UP,)
    assert late.status.reason == "unschedulable for 601 s: no capacity"


def test_a_container_that_cannot_start_is_timed_from_the_first_look_that_saw_it() -> None:
    """A pull back-off is recorded at the look and fails the attempt once older than the
    timeout; an invalid image name fails it at once."""
    backoff = {"waiting": {"reason": "ImagePullBackOff", "message": "pull img: not found"}}
    stuck = pod("Pending", state=backoff)
    first = judged(launched(), stuck, node(SPOT))
    assert first.status.state is State.WAITING and first.record["start_error_since"] == NOW
    old = judged(launched(start_error_since=NOW - 700), stuck, node(SPOT))
    assert old.status.outcome is Outcome.APP_FAILURE and old.status.due == (GIVE_UP,)
    assert "ImagePullBackOff for 700 s" in (old.status.reason or "")
    invalid = {"waiting": {"reason": "InvalidImageName", "message": "bad name"}}
    at_once = judged(launched(), pod("Pending", state=invalid), node(SPOT))
    assert at_once.status.outcome is Outcome.APP_FAILURE
    assert at_once.status.reason == "the container cannot start (InvalidImageName): bad name"


def test_a_pod_we_gave_up_on_keeps_its_verdict_when_it_is_gone() -> None:
    h = launched(gave_up=["spot_unavailable", "unschedulable for 601 s", ["x"]])
    got = judged(h, None, None)
    assert got.status.outcome is Outcome.SPOT_UNAVAILABLE
    assert got.status.reason == "unschedulable for 601 s"


def test_a_held_pod_is_ready_not_started_until_released() -> None:
    held = judged(launched(), pod(annotations={"airflow-spot/hold": "wait"}), node(SPOT))
    st = held.status
    assert (st.state, st.started_at, st.ready_at) == (State.LAUNCHING, None, T0 + 20)
    released = pod(
        annotations={"airflow-spot/hold": "go", "airflow-spot/hold-released-at": repr(T0 + 50)}
    )
    go = judged(launched(), released, node(SPOT)).status
    assert (go.state, go.started_at, go.ready_at) == (State.RUNNING, T0 + 50, None)


def test_an_unknown_phase_takes_the_safe_default_and_says_so() -> None:
    got = judged(launched(), pod("Unknown", state={}), node(SPOT))
    assert got.default_used and got.status.outcome is Outcome.INFRA_DISRUPTION


def test_the_node_s_identity_is_recorded_once() -> None:
    """The node the pod ran on, not a namesake made later under its name."""
    first = identities(launched(), pod(), node(SPOT))
    assert first == {"pod_uid": "pod-uid", "node_uid": "node-uid", "node_created": T0 - 3600}
    assert identities(launched(node_uid="other"), pod(), node(SPOT)) == {"pod_uid": "pod-uid"}


def test_the_same_look_gives_the_same_judgement() -> None:
    """Nothing but the arguments decides: no clock, no state kept between calls."""
    args = (launched(), pod("Failed", state=exited(143)), node(SPOT), [event("SpotInterrupted")])
    assert judge(*args, NOW) == judge(*args, NOW)


@pytest.mark.parametrize("ended", [T0 + 100, None])
def test_a_lease_that_ran_out_is_no_application_failure(ended) -> None:
    state = exited(143)
    if ended is None:
        del state["terminated"]["finishedAt"]
    lease = {"airflow-spot/lease-until": repr(T0 + 90)}
    got = judged(launched(), pod("Failed", state=state, annotations=lease), node(ON_DEMAND))
    assert got.status.outcome is Outcome.INFRA_DISRUPTION
    assert got.status.reason.startswith("lease expired")
    assert got.status.ended_at == (ended or NOW)
