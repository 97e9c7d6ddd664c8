"""What the operator remembers between looks about spot's availability."""

from __future__ import annotations

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
