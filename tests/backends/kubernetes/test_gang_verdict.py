"""A gang's pure parts on the API's own shapes (issue 36): the Job and Service it is launched
as, the capacity gate, and the verdict's rules that the real control plane shows only by
timing (``real/test_real_gang.py`` runs every case there): the settle window a survivor's
failure waits in, a reclaim too late to explain a failure, ranks that fail in the same
second, ranks stopped by the gang's end, pods gone with their nodes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_spot.backends.base import Outcome, State
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.gang_launch import (
    GATE,
    INDEX,
    build_job,
    build_service,
    rendezvous_port,
    service_name,
)
from airflow_spot.backends.kubernetes.gang_ranks import GangLook
from airflow_spot.backends.kubernetes.gang_verdict import (
    LIFT_GATES,
    STOP_RANKS,
    Timeouts,
    judge_gang,
)
from airflow_spot.backends.kubernetes.gating import (
    GRANTED_ANNOTATION,
    PLACEHOLDER_LABEL,
    build_placeholders,
    read_gate,
    timed_out,
)
from airflow_spot.backends.kubernetes.verdict import GIVE_UP, RELAY_NOTICE
from airflow_spot.exceptions import ConfigError
from airflow_spot.jobstate import AttemptHandle

T0 = 1_800_000_000.0  # the look's clock: wall seconds
T = Timeouts(pending_s=60.0, gang_s=60.0, settle_s=10.0)
GLOO = "ValueError: UNKNOWN: Gloo AllGather failed: Read error: Connection reset by peer"


def ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rank_pod(
    k: int,
    *,
    phase: str = "Running",
    node: str | None = None,
    exit_code: int | None = None,
    at: float = T0,
    message: str = "",
    disruption: str | None = None,
    deleting: bool = False,
    gated: bool = False,
    hold: str | None = None,
) -> dict[str, Any]:
    """A rank pod as the API returns it (the fields the verdict reads)."""
    node = node if node is not None else (f"n{k}" if phase != "Pending" else None)
    state: dict[str, Any] = {"running": {"startedAt": ts(T0 - 60)}}
    if exit_code is not None:
        term = {"exitCode": exit_code, "finishedAt": ts(at), "startedAt": ts(T0 - 60)}
        state = {"terminated": {**term, **({"message": message} if message else {})}}
    conds = (
        [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(T0 - 61)}]
        if node
        else []
    )
    if disruption:
        conds.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": disruption,
                "lastTransitionTime": ts(at),
            }
        )
    ann = {INDEX: str(k), **({"airflow-spot/hold": hold} if hold else {})}
    return {
        "metadata": {
            "name": f"job-a1-{k}-x",
            "uid": f"uid-{k}",
            "annotations": ann,
            **({"deletionTimestamp": ts(at)} if deleting else {}),
        },
        "spec": {
            **({"nodeName": node} if node else {}),
            **({"schedulingGates": [{"name": GATE}]} if gated else {}),
        },
        "status": {
            "phase": phase,
            "conditions": conds,
            **({"containerStatuses": [{"name": "train", "state": state}]} if node else {}),
        },
    }  # fmt: skip


def node(name: str, *, ready: bool = True, since: float = T0 - 3600, taints=()) -> dict[str, Any]:
    cond = {
        "type": "Ready",
        "status": "True" if ready else "Unknown",
        "lastTransitionTime": ts(since),
    }
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"karpenter.sh/capacity-type": "spot"}},
        "spec": {"taints": [{"key": t, "effect": "NoSchedule"} for t in taints]},
        "status": {"conditions": [cond]},
    }  # fmt: skip


def handle(**kw: Any) -> AttemptHandle:
    base = dict(launched_at=T0 - 120, kind="kubernetes", attempt=1, capacity="spot", pod="job-a1")
    return AttemptHandle(**{**base, "was_spot": True, "node": "n0,n1", **kw})


def judge(pods, nodes=None, now: float = T0 + 1, h: AttemptHandle | None = None, t=T, **kw):
    nodes = {"n0": node("n0"), "n1": node("n1")} if nodes is None else nodes
    job = kw.pop("job", {"metadata": {"name": "job-a1", "uid": "job-uid", "annotations": {}}})
    look = GangLook.of(2, job, pods, kw.pop("placeholders", ()), nodes, kw.pop("events", {}), now)
    return judge_gang(h or handle(), look, t)


# -- the verdict ----------------------------------------------------------------------------
def test_a_survivors_collective_failure_waits_for_the_lost_ranks_record() -> None:
    """Rank 0 failed on a gloo error while rank 1 still runs on a Ready node: no verdict yet
    (the node monitor marks a lost node NotReady only after its grace); once rank 1's node is
    NotReady the gang is preempted, rank 1 its victim, rank 0 stopped with it."""
    failed = rank_pod(0, phase="Failed", exit_code=1, message=GLOO)
    waiting = judge([failed, rank_pod(1)], now=T0 + 3)
    assert not waiting.status.terminal and waiting.status.state is State.PREEMPTING
    lost = {"n0": node("n0"), "n1": node("n1", ready=False, since=T0 + 6)}
    st = judge([failed, rank_pod(1)], lost, now=T0 + 7).status
    assert st.outcome is Outcome.PREEMPTED and st.evidence["victims"] == [1], st.reason
    assert [r["outcome"] for r in st.evidence["ranks"]] == ["stopped", "preempted"]
    assert STOP_RANKS in st.due  # rank 1's pod (on the lost node) is deleted with the gang


def test_without_the_settle_window_the_survivor_would_be_blamed() -> None:
    """The window is what saves it: with none, the same look reads rank 0's exit as the
    application's; past the window with no record, it is (a real crash with a peer hung)."""
    failed = rank_pod(0, phase="Failed", exit_code=1, message=GLOO)
    no_window = Timeouts(60.0, 60.0, settle_s=0.0)
    st = judge([failed, rank_pod(1)], now=T0 + 3, t=no_window).status
    assert st.outcome is Outcome.APP_FAILURE
    st = judge([failed, rank_pod(1)], now=T0 + 11).status
    assert st.outcome is Outcome.APP_FAILURE and st.evidence["rank"] == 0


def test_a_reclaim_long_after_an_application_failure_does_not_explain_it() -> None:
    """Rank 0 crashed; rank 1's node went NotReady 30 s later (past the 10 s window): the
    application's failure, naming rank 0."""
    crashed = rank_pod(0, phase="Failed", exit_code=3, message="ValueError: loss is NaN")
    lost = {"n0": node("n0"), "n1": node("n1", ready=False, since=T0 + 30)}
    st = judge([crashed, rank_pod(1)], lost, now=T0 + 31).status
    assert st.outcome is Outcome.APP_FAILURE and st.reason.startswith("rank 0 of 2"), st.reason


def test_ranks_that_fail_in_the_same_second_are_told_apart_by_their_messages() -> None:
    """The API keeps whole seconds: rank 1's crash and rank 0's gloo error share a second.
    The crash is the cause; the exit code is rank 1's; every rank ended on healthy
    capacity, so no window is waited."""
    pods = [
        rank_pod(0, phase="Failed", exit_code=1, message=GLOO),
        rank_pod(1, phase="Failed", exit_code=1, message="RuntimeError: rank 1 crashed"),
    ]
    st = judge(pods, now=T0 + 0.5).status
    assert st.outcome is Outcome.APP_FAILURE and st.evidence["rank"] == 1, st.reason
    assert st.reason.startswith("rank 1 of 2")


def test_a_rank_stopped_by_the_gangs_end_is_never_the_cause() -> None:
    """Rank 0 exited 143 while being deleted (the Job controller stops the others when one
    fails), a second before rank 1's real exit 3 was written: rank 1 is the cause."""
    pods = [
        rank_pod(0, phase="Failed", exit_code=143, deleting=True, at=T0 - 1),
        rank_pod(1, phase="Failed", exit_code=3),
    ]
    st = judge(pods).status
    assert st.outcome is Outcome.APP_FAILURE and st.evidence["rank"] == 1, st.reason


def test_a_pod_gone_with_its_recorded_node_is_a_preemption() -> None:
    """Rank 1's pod and its node are gone (force-deleted by pod GC): the handle's record of
    its node makes it a reclaim; a pod gone from a healthy node was stopped with the gang."""
    st = judge([rank_pod(0)], {"n0": node("n0"), "n1": None}).status
    assert st.outcome is Outcome.PREEMPTED and st.evidence["victims"] == [1], st.reason
    st = judge([rank_pod(0, phase="Succeeded", exit_code=0)], now=T0 + 1).status
    assert st.outcome is Outcome.INFRA_DISRUPTION and st.reason.startswith("every rank was stopped")


def test_all_ranks_succeeded_and_a_held_gang_is_ready_once_every_rank_started() -> None:
    done = [rank_pod(k, phase="Succeeded", exit_code=0) for k in (0, 1)]
    assert judge(done).status.outcome is Outcome.SUCCEEDED
    held = judge([rank_pod(0, hold="wait"), rank_pod(1, hold="wait")]).status
    assert held.state is State.LAUNCHING and held.ready_at is not None and held.started_at is None
    one = judge([rank_pod(0, hold="wait"), rank_pod(1, phase="Pending")]).status
    assert one.ready_at is None


def test_a_notice_on_one_ranks_node_is_recorded_and_relayed_to_the_gang() -> None:
    """Karpenter's SpotInterrupted event on rank 1's node: recorded (the cloud's word), the
    status preempting with the relay due."""
    ev = {"reason": "SpotInterrupted", "involvedObject": {"kind": "Node", "name": "n1"}}
    seen = judge([rank_pod(0), rank_pod(1)], events={"n1": [ev]})
    assert seen.record["notice"] == "event SpotInterrupted" and seen.record["notice_at"] == T0 + 1
    assert RELAY_NOTICE in seen.status.due and seen.status.state is State.PREEMPTING


def test_the_look_records_each_ranks_node_by_rank() -> None:
    h = handle(node=None)
    seen = judge(
        [rank_pod(1, node="b"), rank_pod(0, node="a")], {"a": node("a"), "b": node("b")}, h=h
    )
    assert seen.record["node"] == "a,b" and seen.record["node_uid"] == "uid-a,uid-b"
    assert seen.record["pod_uid"] == "job-uid" and seen.record["was_running"] is True


# -- the gate -------------------------------------------------------------------------------
def placeholder(k: int, placed_at: float | None) -> dict[str, Any]:
    conds = (
        [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(placed_at)}]
        if placed_at
        else []
    )
    spec = {"nodeName": f"p{k}"} if placed_at else {}
    return {"metadata": {"name": f"job-a1-place-{k}"}, "spec": spec, "status": {"conditions": conds}}  # fmt: skip


def test_the_gates_are_lifted_when_all_n_placeholders_are_placed() -> None:
    gated = [rank_pod(k, phase="Pending", gated=True) for k in (0, 1)]
    h = handle(launched_at=T0 - 10, node=None)
    one = judge(gated, placeholders=[placeholder(0, T0 - 5), placeholder(1, None)], now=T0, h=h)
    assert one.status.state is State.WAITING and one.status.granted_at is None
    assert LIFT_GATES not in one.status.due and one.status.evidence["held_node_s"] == 5.0
    both = judge(gated, placeholders=[placeholder(0, T0 - 5), placeholder(1, T0 - 2)], now=T0, h=h)
    assert LIFT_GATES in both.status.due and both.status.granted_at == T0 - 2  # the N-th placed


def test_a_partial_gang_is_given_up_at_its_timeout_and_a_pending_one_at_its_own() -> None:
    gated = [rank_pod(k, phase="Pending", gated=True) for k in (0, 1)]
    h = handle(launched_at=T0 - 61, node=None)
    st = judge(
        gated, placeholders=[placeholder(0, T0 - 50), placeholder(1, None)], h=h, now=T0
    ).status
    assert st.outcome is Outcome.SPOT_UNAVAILABLE and GIVE_UP in st.due
    assert st.reason.startswith("a partial gang: 1 of 2 nodes after 60 s")
    gate = read_gate({}, gated, [placeholder(0, None)], 2, T0)
    limits = dict(pending_timeout_s=30.0, gang_timeout_s=60.0)
    assert timed_out(gate, T0 - 31, T0, **limits) == 30.0  # nothing held: the pending timeout
    granted = read_gate(
        {"metadata": {"annotations": {GRANTED_ANNOTATION: str(T0 - 59)}}}, gated, [], 2, T0
    )
    assert granted.lift and timed_out(granted, T0 - 600, T0, **limits) is None  # from the grant


def test_placeholders_have_the_ranks_placement_and_belong_to_the_job() -> None:
    pod = {
        "spec": {
            "nodeSelector": {"karpenter.sh/capacity-type": "spot"},
            "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        }
    }
    bodies = build_placeholders(
        pod, job="job-a1", job_uid="u", nodes=3, labels={"a": "b"}, image="pause"
    )
    assert [b["metadata"]["name"] for b in bodies] == [f"job-a1-place-{k}" for k in range(3)]
    b = bodies[0]
    assert (
        b["metadata"]["labels"][PLACEHOLDER_LABEL] == "job-a1"
        and "airflow-spot/pool" not in b["metadata"]["labels"]
    )
    assert b["spec"]["nodeSelector"] == pod["spec"]["nodeSelector"]
    assert b["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert b["metadata"]["ownerReferences"][0] == {"apiVersion": "batch/v1", "kind": "Job", "name": "job-a1", "uid": "u"}  # fmt: skip


# -- the launch -----------------------------------------------------------------------------
def test_the_gang_is_an_indexed_job_whose_pods_know_their_rank_and_rendezvous() -> None:
    pod = {
        "metadata": {"labels": {"airflow-spot/attempt": "1"}, "annotations": {"airflow-spot/notice": ""}},
        "spec": {"containers": [{"name": "train", "env": [{"name": "RANK", "value": "9"}]}], "restartPolicy": "Never"},
    }  # fmt: skip
    job = build_job(pod, name="job-a1", nodes=4, port=29501, gated=True)
    spec = job["spec"]
    assert (
        spec["completionMode"],
        spec["completions"],
        spec["parallelism"],
        spec["backoffLimit"],
    ) == ("Indexed", 4, 4, 0)
    rules = spec["podFailurePolicy"]["rules"]
    assert (
        rules[0]["onPodConditions"] == [{"type": "DisruptionTarget"}]
        and rules[0]["action"] == "FailJob"
    )
    tmpl = spec["template"]
    assert tmpl["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert tmpl["spec"]["subdomain"] == "job-a1" and tmpl["spec"]["schedulingGates"] == [
        {"name": GATE}
    ]
    env = {
        e["name"]: e.get("value", e.get("valueFrom")) for e in tmpl["spec"]["containers"][0]["env"]
    }
    assert env["RANK"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}
    }  # ours win
    assert (env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
        "4",
        "job-a1-0.job-a1",
        "29501",
    )
    assert (
        "schedulingGates"
        not in build_job(pod, name="j", nodes=2, port=1, gated=False)["spec"]["template"]["spec"]
    )
    svc = build_service("7x-a1", "uid", 29501, {})
    assert svc["metadata"]["name"] == service_name("7x-a1") == "g7x-a1"  # a DNS-1035 label
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_rendezvous_ports_differ_between_attempts_and_stay_in_range() -> None:
    ports = [rendezvous_port("dag/task/run/-1", a) for a in range(1, 2001)]
    assert all(29500 <= p < 30500 for p in ports)
    assert all(a != b for a, b in zip(ports, ports[1:], strict=False))


@pytest.mark.parametrize(
    ("field", "value"),
    [("nodes", 0), ("nodes", 2.0), ("nodes", True), ("gang_timeout_s", 0), ("gang_settle_s", -1)],
)
def test_gang_settings_are_checked_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"backend.{field}"):
        KubernetesBackend(image="img", **{field: value})


def test_a_gang_backend_round_trips_and_the_operator_takes_it() -> None:
    from datetime import timedelta

    from airflow_spot.operators import SpotTrainingOperator

    b = KubernetesBackend(image="img", nodes=4, gang_timeout_s=300, gang_settle_s=45)
    assert KubernetesBackend.from_dict(b.to_dict()) == b
    args = dict(task_id="t", command=["x"], checkpoint_uri="/c", expected_compute=timedelta(hours=1), total_steps=10, deadline=timedelta(hours=2), backend=b)  # fmt: skip
    assert SpotTrainingOperator(nodes=4, **args).nodes == 4
    with pytest.raises(ConfigError, match="nodes"):
        SpotTrainingOperator(nodes=3, **args)
