"""``deadline_aware``: our policy. Spend slack on waiting for spot, but never below a reserve.

``spot -> idle (spot down, slack above the reserve) -> on-demand (slack at the reserve) ->
on-demand while spot is still down -> spot (back, with slack to spare)``.

The *slack* is the time the job can still afford not to progress: time left to the
deadline minus work left. Uniform Progress keeps the slack at or above its straight line
``S0 * (R - t) / R`` and falls to on-demand whenever it dips below; the omniscient optimum
shows that this reserve is too cautious early and that short outages are best waited out.
``deadline_aware`` keeps a smaller reserve, ``fraction`` of that line plus a floor of
``floor_changeovers`` changeovers, and adds two rules:

* it never leaves on-demand while spot is still down (that would pay two changeovers for
  nothing), and leaves it for spot only with ``return_margin`` changeovers above the reserve;
* the shared safety net still guarantees the deadline whenever it is feasible.

Parameters were fitted on the aws-p3-2month and gcp-h100-2week traces, never on the
us-west-2a windows the benchmark scores it on (see ``benchmarks/fit_deadline_aware.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_spot.policy.base import Policy, register
from airflow_spot.policy.model import HOUR, Capacity, Decision, JobSpec, Observation


@dataclass(frozen=True)
class Params:
    fraction: float = 0.6
    floor_changeovers: float = 2.0
    return_margin: float = 2.0


@register
class DeadlineAware(Policy):
    """Wait for spot while the slack stays above a reserve; on-demand below it."""

    name = "deadline_aware"

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or Params()

    def reserve(self, job: JobSpec, obs: Observation) -> float:
        p = self.params
        line = job.slack_s * (job.deadline_s - obs.now) / job.deadline_s
        return max(p.fraction * line, p.floor_changeovers * job.changeover_s)

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        slack = job.deadline_s - obs.now - (job.work_s - obs.done_s)
        reserve = self.reserve(job, obs)
        d = job.changeover_s
        if obs.spot_available:
            if obs.capacity is Capacity.ON_DEMAND and slack - d < reserve + self.params.return_margin * d:
                return Decision(Capacity.ON_DEMAND, "da_keep_od", (slack / HOUR, reserve / HOUR))
            return Decision(Capacity.SPOT, "spot_up")
        if obs.capacity is Capacity.ON_DEMAND:
            return Decision(Capacity.ON_DEMAND, "da_od_spot_down", (obs.spot_age_s / HOUR,))
        if slack - d <= reserve:
            return Decision(Capacity.ON_DEMAND, "da_reserve", (obs.spot_age_s / HOUR, slack / HOUR, reserve / HOUR))
        return Decision(Capacity.NONE, "da_wait", (obs.spot_age_s / HOUR, slack / HOUR, reserve / HOUR))
