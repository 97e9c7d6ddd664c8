"""What the operator remembers between looks about spot's availability."""

from __future__ import annotations

import pytest

from airflow_spot.jobstate import JobState


def test_spot_runs_seen_whole_are_remembered_across_a_save() -> None:
    """The live operator feeds the policy the same facts as the simulator: the age of the
    current run, the time spot was down, and the length of the last spot run and outage
    whose start it saw; the state survives the round trip through the task's store."""
    st = JobState(started_at=1000.0, deadline_at=1000.0 + 3600.0, time_scale=60.0)
    looks = [(1000.0, True), (1020.0, True), (1030.0, False), (1050.0, True), (1052.0, False)]
    for wall, up in looks[:4]:
        st.see_spot(up, wall)
    assert (st.spot_last_up_s, st.spot_last_down_s) == (None, 1200.0)  # first run: age unknown
    st = JobState.from_dict(st.to_dict())
    st.see_spot(looks[4][1], looks[4][0])
    assert (st.spot_last_up_s, st.spot_last_down_s) == (120.0, 1200.0)
    assert st.spot_age_s(1060.0) == 480.0 and st.spot_down_s == 1200.0 + 0.0
    st.see_spot(None, 1070.0)  # unknown: nothing changes but the clock
    assert st.spot_last is False and st.spot_down_s == 1200.0 + 1080.0


def test_a_spot_request_that_never_got_capacity_is_not_billed() -> None:
    """A spot request that waited two hours for capacity and was then cancelled cost nothing:
    the ledger shows the wait as idle, not as a paid changeover."""
    from airflow_spot.jobstate import AttemptRecord
    from airflow_spot.ledger import Phase
    from airflow_spot.policy import Capacity

    st = JobState(started_at=0.0, deadline_at=20 * 3600.0)
    st.attempts.append(
        AttemptRecord(1, "spot", {}, launched_at=3600.0, ended_at=3 * 3600.0, outcome="cancelled")
    )
    st.attempts.append(  # an on-demand attempt that got capacity and ran an hour
        AttemptRecord(
            2,
            "on_demand",
            {},
            launched_at=3 * 3600.0,
            granted_at=3 * 3600.0,
            started_at=3 * 3600.0 + 600,
            ended_at=4 * 3600.0 + 600,
            outcome="succeeded",
            step_end=3600,
            price=3.0,
        )
    )
    led = st.ledger(4 * 3600.0 + 600, 1.0, 3.0, 3600.0)
    assert led.hours(Capacity.SPOT) == 0.0
    assert led.hours(phase=Phase.IDLE) == 3.0  # before the request, and the whole wait
    assert abs(led.cost - 3.0 * (1 + 1 / 6)) < 1e-9  # the on-demand changeover and run only


def test_measured_changeover_discounts_every_step_the_first_look_saw() -> None:
    """The first progress seen may report many steps (a look every few minutes, or on
    Kubernetes the first checkpoint): the changeover is the time before the first of them."""
    from airflow_spot.jobstate import AttemptRecord

    st = JobState(started_at=0.0, deadline_at=20 * 3600.0)
    st.attempts.append(
        AttemptRecord(
            1,
            "spot",
            {},
            launched_at=0.0,
            granted_at=0.0,
            step_start=100,
            first_step=150,  # seen 600 s after the grant, 50 steps of 9.6 s in
            first_step_at=600.0,
        )
    )
    assert abs(st.measured_changeover_s(9.6) - 120.0) < 1e-9


def test_the_xcom_summary_of_a_long_job_stays_small() -> None:
    """60 h of spot at a price changing every 10 minutes, 40 attempts and 2,000 decisions:
    the XCom keeps every figure, bounded lists with counts of what it left out, and segments
    that still add up to the cost; the decision log in the state says how much it dropped."""
    import json

    from airflow_spot.jobstate import MAX_DECISIONS, AttemptRecord
    from airflow_spot.operators.summary import XCOM_DECISIONS, xcom_summary

    hour = 3600.0
    st = JobState(started_at=0.0, deadline_at=70 * hour)
    for i in range(40):
        t0 = i * 1.5 * hour
        st.attempts.append(
            AttemptRecord(
                i + 1,
                "spot",
                {},
                launched_at=t0,
                granted_at=t0,
                started_at=t0 + 300,
                ended_at=t0 + 1.5 * hour,
                outcome="preempted",
                prices=[[t0 + k * 600.0, 0.9 + 0.01 * (k % 7)] for k in range(9)],
            )
        )
    for k in range(2000):
        st.record_decision(k * 100.0, "spot", "keep spot: slack 3.1 h above reserve 2.4 h", k)
    assert len(st.decisions) == MAX_DECISIONS and st.decisions_dropped == 2000 - MAX_DECISIONS
    summary = st.ledger(60 * hour, 1.0, 3.06, 48 * hour).summary()
    summary.update(
        attempts=[{"attempt": a.attempt, "reason": a.reason} for a in st.attempts],
        decisions=st.decisions,
        decisions_dropped=st.decisions_dropped,
    )
    assert len(summary["segments"]) > 300  # one per price piece
    full = len(json.dumps(summary))
    small = xcom_summary(summary)
    assert len(json.dumps(small)) < 64_000 < full
    assert small["decisions"] == st.decisions[-XCOM_DECISIONS:]
    assert small["decisions_omitted"] == 2000 - XCOM_DECISIONS
    assert small["attempts_omitted"] == 0 and small["segments_omitted"] == 0
    assert sum(
        s["price_per_h"] * (s["end_s"] - s["start_s"]) / hour for s in small["segments"]
    ) == (pytest.approx(summary["cost"]))
    figures = {k: v for k, v in summary.items() if not isinstance(v, list)}
    figures.pop("decisions_dropped")
    assert figures.items() <= small.items()


def test_the_ledger_changeover_lasts_until_training_began() -> None:
    """The process's own start-up and restore (importing torch, loading a checkpoint) are part
    of the changeover, as the policy measures it: the ledger's changeover hours run to the
    first step, not to the process's start (a PyTorch job reported 0.6 h of changeover for
    ~3 h of start-ups). The cost is the same; only the split moves."""
    from airflow_spot.jobstate import AttemptRecord
    from airflow_spot.ledger import Phase

    st = JobState(started_at=0.0, deadline_at=20 * 3600.0)
    st.attempts.append(
        AttemptRecord(
            1,
            "on_demand",
            {},
            launched_at=0.0,
            granted_at=0.0,
            started_at=600.0,  # the instance is up and the process started
            step_start=0,
            first_step=10,  # first seen 2600 s in, 10 steps of 100 s done
            first_step_at=2600.0,
            step_end=30,
            last_step_at=4600.0,
            ended_at=4600.0,
            outcome="succeeded",
            price=3.0,
        )
    )
    led = st.ledger(4600.0, 100.0, 3.0, 3000.0)
    assert abs(led.hours(phase=Phase.LAUNCHING) - 1600 / 3600) < 1e-9  # to 1600 s, not 600 s
    assert abs(led.cost - 3.0 * 4600 / 3600) < 1e-9


def test_a_state_written_by_a_newer_version_loads() -> None:
    """In a rolling deploy (or after a rollback) a worker may read a task state that a newer
    version wrote: fields it does not know are dropped, not a TypeError on every try."""
    st = JobState(started_at=0.0, deadline_at=3600.0)
    from airflow_spot.jobstate import AttemptRecord

    st.attempts.append(AttemptRecord(1, "spot", {}, launched_at=0.0))
    d = st.to_dict()
    d["a_later_field"] = 1
    d["attempts"][0]["another_one"] = "x"
    back = JobState.from_dict(d)
    assert back.attempts[0].capacity == "spot" and back.deadline_at == 3600.0
