"""The ledger adds segments up into hours, cost, savings, preemptions and lost work."""

from __future__ import annotations

import pytest

from airflow_spot.ledger import Ledger, Phase, Segment
from airflow_spot.policy import HOUR, Capacity


def test_summary_figures() -> None:
    """Spot, on-demand and idle hours, cost, savings, preemptions and lost work add up."""
    led = Ledger(work_s=10 * HOUR, deadline_s=12 * HOUR, on_demand_price=3.0)
    led.add(Segment(Capacity.SPOT, Phase.LAUNCHING, 0, 0.5 * HOUR, 0, 0, 1.0))
    led.add(
        Segment(
            Capacity.SPOT,
            Phase.RUNNING,
            0.5 * HOUR,
            6.5 * HOUR,
            0,
            6 * HOUR,
            1.0,
            ended_by="preempted",
            lost_s=0.25 * HOUR,
        )
    )
    led.add(Segment(Capacity.NONE, Phase.IDLE, 6.5 * HOUR, 7 * HOUR, 5.75 * HOUR, 5.75 * HOUR))
    led.add(
        Segment(
            Capacity.ON_DEMAND,
            Phase.RUNNING,
            7 * HOUR,
            11.25 * HOUR,
            5.75 * HOUR,
            10 * HOUR,
            3.0,
            ended_by="completed",
        )
    )
    led.finished_s = 11.25 * HOUR
    s = led.summary()
    assert s["spot_hours"] == pytest.approx(6.5)
    assert s["on_demand_hours"] == pytest.approx(4.25)
    assert s["idle_hours"] == pytest.approx(0.5)
    assert s["cost"] == pytest.approx(6.5 + 4.25 * 3)
    assert s["on_demand_cost"] == pytest.approx(30.0)
    assert s["savings"] == pytest.approx(1 - 19.25 / 30)
    assert s["preemptions"] == 1
    assert s["work_lost_hours"] == pytest.approx(0.25)
    assert s["deadline_met"] is True
    assert len(s["segments"]) == 4 and s["segments"][0]["capacity"] == "spot"


def test_late_finish_is_not_met() -> None:
    """Finishing after the deadline reports deadline_met False; unfinished reports None."""
    led = Ledger(HOUR, 2 * HOUR, 3.0)
    assert led.deadline_met is None
    led.finished_s = 2.5 * HOUR
    assert led.deadline_met is False


def test_segment_ending_before_it_starts_is_rejected() -> None:
    """A segment with end before start is a bug and is refused."""
    with pytest.raises(ValueError, match="ends"):
        Ledger(HOUR, 2 * HOUR, 3.0).add(Segment(Capacity.SPOT, Phase.RUNNING, 10, 5))
