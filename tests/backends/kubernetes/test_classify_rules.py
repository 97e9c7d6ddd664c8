"""The classifier's table of rules: its order, the walk, and single rules on minimal API dicts."""

from __future__ import annotations

import inspect

import pytest

from airflow_spot.backends.kubernetes import classify as classify_module
from airflow_spot.backends.kubernetes.classify import (
    RULES,
    Classification,
    Verdict,
    classify,
    exit_on_healthy_capacity,
    exit_while_reclaimed,
    pod_vanished,
    signal_after_notice,
    unknown_phase,
    unschedulable_too_long,
)
from airflow_spot.backends.kubernetes.facts import Facts


def failed(exit_code: int) -> dict:
    return {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "train", "state": {"terminated": {"exitCode": exit_code}}}
            ],
        }
    }


def unschedulable() -> dict:
    return {
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available",
                }
            ],
        }
    }


def test_rules_are_named_module_functions_in_order():
    assert isinstance(RULES, tuple)
    assert [r.__name__ for r in RULES] == [
        "pod_vanished",
        "pod_succeeded",
        "kubelet_termination",
        "node_lost_condition",
        "drain_eviction",
        "scheduler_preemption",
        "other_disruption",
        "kubelet_shutdown_status",
        "evicted_status",
        "node_lost_while_running",
        "oom_killed",
        "signal_after_notice",
        "lease_expired",
        "checkpoint_unwritable",
        "exit_on_healthy_capacity",
        "exit_while_reclaimed",
        "failed_unexplained",
        "container_cannot_start",
        "unschedulable_too_long",
        "still_pending",
        "still_running",
        "unknown_phase",
    ]
    for rule in RULES:
        assert inspect.isfunction(rule)
        assert getattr(classify_module, rule.__name__) is rule  # module level, by its name
        doc = inspect.getdoc(rule)
        assert doc and "\n" not in doc, rule.__name__  # one line: the signal it reads
    # the last rule answers anything, so the walk always ends with a verdict
    assert RULES[-1] is unknown_phase
    assert unknown_phase(Facts.of({"status": {"phase": "Odd"}})).default_used


def test_a_rule_answering_none_passes_to_the_next(monkeypatch):
    seen = []

    def silent(f: Facts) -> Classification | None:
        seen.append("silent")
        return None

    def answers(f: Facts) -> Classification | None:
        seen.append("answers")
        return Classification(Verdict.RUNNING, "from the second rule")

    def never(f: Facts) -> Classification | None:
        seen.append("never")
        return Classification(Verdict.APP_FAILURE, "too late")

    monkeypatch.setattr(classify_module, "RULES", (silent, answers, never))
    assert classify({"status": {"phase": "Running"}}).reason == "from the second rule"
    assert seen == ["silent", "answers"]


def test_the_real_table_passes_a_running_pod_down_to_still_running():
    f = Facts.of({"status": {"phase": "Running"}})
    answered = [r.__name__ for r in RULES if r(f) is not None]
    assert answered == ["still_running", "unknown_phase"]
    assert classify({"status": {"phase": "Running"}}).verdict == Verdict.RUNNING


def test_pod_vanished():
    assert pod_vanished(Facts.of({"status": {"phase": "Running"}})) is None
    gone_before = pod_vanished(Facts.of(None))
    assert gone_before is not None and gone_before.verdict == Verdict.INFRA_DISRUPTION
    assert gone_before.evidence == ("pod not found",)
    gone_after = pod_vanished(Facts.of(None, was_running=True, was_spot=True))
    assert gone_after is not None and gone_after.verdict == Verdict.PREEMPTED
    on_demand = pod_vanished(Facts.of(None, was_running=True, was_spot=False))
    assert on_demand is not None and on_demand.verdict == Verdict.INFRA_DISRUPTION
    assert on_demand.reason.endswith("(not on spot capacity)")


@pytest.mark.parametrize(
    ("exit_code", "notice_age_s", "preempted"),
    [(143, 10.0, True), (137, None, True), (143, 901.0, False), (1, 10.0, False)],
)
def test_signal_after_notice(exit_code, notice_age_s, preempted):
    f = Facts.of(
        failed(exit_code),
        was_spot=True,
        notice="node taint karpenter.sh/disrupted",
        notice_age_s=notice_age_s,
    )
    got = signal_after_notice(f)
    if not preempted:
        assert got is None  # a stale notice or an application's exit code: the next rules decide
        return
    assert got is not None and got.verdict == Verdict.PREEMPTED
    assert got.evidence == (f"exit {exit_code}", "node taint karpenter.sh/disrupted")


def test_exits_on_healthy_or_reclaimed_capacity():
    healthy = Facts.of(failed(2), {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    got = exit_on_healthy_capacity(healthy)
    assert got is not None and got.verdict == Verdict.APP_FAILURE
    assert exit_while_reclaimed(healthy) is None
    not_ready = Facts.of(
        failed(2), {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    assert exit_on_healthy_capacity(not_ready) is None
    got = exit_while_reclaimed(not_ready)
    assert got is not None and got.verdict == Verdict.INFRA_DISRUPTION  # no spot label
    assert got.evidence == ("exit 2",)


def test_unschedulable_too_long():
    assert unschedulable_too_long(Facts.of(unschedulable(), pending_for_s=599.0)) is None
    assert (
        unschedulable_too_long(Facts.of({"status": {"phase": "Pending"}}, pending_for_s=1e6))
        is None
    )
    got = unschedulable_too_long(Facts.of(unschedulable(), pending_for_s=600.0))
    assert got is not None and got.verdict == Verdict.SPOT_UNAVAILABLE
    assert got.reason == "unschedulable for 600 s: 0/3 nodes are available"
    got = unschedulable_too_long(Facts.of(unschedulable(), pending_for_s=600.0, was_spot=False))
    assert got is not None and got.verdict == Verdict.INFRA_DISRUPTION
