"""``slack_reserve``: the first ``deadline_aware`` (kept for comparison). Spend slack waiting for spot, never below a reserve.

``spot -> idle (spot down, slack above the reserve) -> on-demand (slack down to the reserve)
-> on-demand while spot is still down -> spot (back, with slack to spare)``.

The *slack* is the time the job can still afford not to progress: time left to the
deadline minus work left. Waiting for spot spends slack; once the slack falls to the
*reserve*, the job buys progress on on-demand instead. Uniform Progress keeps, in effect, a
reserve equal to the share of the time left that the deadline gave at the start
(``S0 * (R - t) / R``) and leaves on-demand as soon as spot is back and it is ahead of its
line. That reserve is too cautious, and its returns to spot pay changeovers for little:

    reserve = f * S0 * (R - t) / R + floor * changeover

with ``f < 1``, never leaving on-demand while spot is still down (that pays two changeovers
for nothing), and leaving it for spot only with ``return_margin`` changeovers of slack above
the reserve, never for the last ``finish_changeovers`` changeovers of work, and only for
spot that has stayed up ``settle_s`` (a spot run that just began
is the likeliest to end at once). The shared safety net still guarantees the deadline whenever it is feasible.

Parameters were fitted on the aws-p3-2month and gcp-h100-2week traces, never on the
us-west-2a windows the benchmark scores it on (``benchmarks/fit_deadline_aware.py``:
f=0.6, floor=1, return_margin=0.5, settle_s=600 was best of 60 candidates on 108 windows of
both, 18 cells: 3.47 % below UP on average there, every cell below UP).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_spot.policy.base import Policy, ask_spot, register
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation


def share_of_up_reserve(job: JobSpec, now: float, f: float, floor: float) -> float:
    """Slack to keep at ``now``: ``f`` times Uniform Progress's line plus ``floor`` changeovers."""
    line = job.slack_s * (job.deadline_s - now) / job.deadline_s
    return f * line + floor * job.changeover_s


@dataclass(frozen=True)
class Params:
    f: float = 0.6  # share of Uniform Progress's reserve line to keep
    floor: float = 1.0  # minimum reserve, in changeovers
    return_margin: float = 0.5  # slack above the reserve needed to leave on-demand, in changeovers
    settle_s: float = 600.0  # leave on-demand only for spot that has been up at least this long
    finish_changeovers: float = (
        4.0  # with less work than this many changeovers left, finish on on-demand
    )


@register
class SlackReserve(Policy):
    """Wait for spot while the slack stays above a reserve; on-demand below it."""

    name = "slack_reserve"

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or Params()

    def reserve(self, job: JobSpec, obs: Observation) -> float:
        return share_of_up_reserve(job, obs.now, self.params.f, self.params.floor)

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        p = self.params
        d = job.changeover_s
        slack = job.deadline_s - obs.now - (job.work_s - obs.done_s)
        reserve = self.reserve(job, obs)
        if obs.spot_available is None and obs.capacity is not Capacity.ON_DEMAND:
            return ask_spot(obs)
        if obs.spot_available:
            back = reserve + p.return_margin * d
            near_end = job.work_s - obs.done_s < p.finish_changeovers * d
            if obs.capacity is Capacity.ON_DEMAND and (
                slack < back or obs.spot_age_s < p.settle_s or near_end
            ):
                return Decision(Capacity.ON_DEMAND, "da_keep_od", (slack / HOUR, reserve / HOUR))
            return Decision(Capacity.SPOT, "spot_up")
        if obs.capacity is Capacity.ON_DEMAND:
            return Decision(
                Capacity.ON_DEMAND, "da_od_spot_down", (obs.spot_age_s / HOUR,), look=True
            )
        if slack - d <= reserve:
            return Decision(
                Capacity.ON_DEMAND,
                "da_reserve",
                (obs.spot_age_s / HOUR, slack / HOUR, reserve / HOUR),
            )
        return Decision(
            Capacity.NONE,
            "da_wait",
            (obs.spot_age_s / HOUR, slack / HOUR, reserve / HOUR),
            look=True,
        )
