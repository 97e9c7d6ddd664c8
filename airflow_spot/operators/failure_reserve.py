"""The reserve a live job keeps in its deadline for application failures.

An application failure (the training process exits non-zero, or is OOM-killed, on healthy
capacity) loses the work reported since the newest checkpoint and pays a new changeover.
A job that waited out an outage down to the safety net's margin, as the policy may, would
miss its deadline if its trainer then failed once. So while the failure budget still allows
failures, the policy's job carries a reserve that the shared safety net counts
(:attr:`~airflow_spot.policy.model.JobSpec.failure_reserve_s`)::

    (max_failures - failures) x (changeover + checkpoint interval)

in market seconds. The checkpoint interval is measured, not asked for: the largest of

* the gaps between consecutive checkpoints still kept (their steps, from their names; one
  saved on an attempt's way out, on a reclaim notice or a stop, is off the schedule and left
  out),
* the work the running attempt reported beyond the newest checkpoint (what a failure now
  loses), and what each ended attempt had reported beyond the checkpoint it left,

in steps, at the measured seconds per step. Until two checkpoints are kept (nothing measured
between checkpoints yet: the first interval, or a retention that keeps one), it is at least
one decision interval: the policy looks once an interval, and a trainer that checkpoints
more often than that is shown within two checkpoints. Preemptions need no reserve: the
trainer saves on the notice, and the policy pays their changeovers out of the slack.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from airflow_spot.backends.base import Outcome

if TYPE_CHECKING:
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.jobstate import AttemptRecord, JobState
    from airflow_spot.operators.job import Progress


# how an attempt that saved on its way out ended (a trainer saves on the notice and on SIGTERM)
_WAY_OUT = frozenset(
    o.value for o in (Outcome.PREEMPTED, Outcome.CANCELLED, Outcome.INFRA_DISRUPTION)
)


def failure_reserve_s(
    state: JobState, checkpoints: Checkpoints, max_failures: int, p: Progress, tick_s: float
) -> float:
    """Market seconds to keep for the application failures the budget still allows, at the
    look that measured ``p`` (0 once it allows none: the next failure fails the task)."""
    left = max_failures - state.failures
    if left <= 0:
        return 0.0  # (and no listing of the checkpoints)
    saved = saved_steps(checkpoints.manifests())
    every = checkpoint_interval_s(saved, state.attempts, p.reported, p.sps, tick_s)
    return left * (p.changeover + every)


def checkpoint_interval_s(
    saved: list[int],
    attempts: Iterable[AttemptRecord],
    reported: int,
    sps: float,
    least_s: float,
) -> float:
    """The work one failure may lose, in market seconds (see the module's docstring):
    ``saved`` are the kept checkpoints' steps, oldest first; ``reported`` the newest progress
    of the running attempt (the newest checkpoint's step without one); ``least_s`` the floor
    while no interval between two checkpoints is measured."""
    # (steps at its start, reported, checkpointed at its end; how it ended) of each ended one
    ended = [
        (a.step_start, a.step_end, a.ckpt_step_end, a.outcome)
        for a in attempts
        if a.ended_at is not None and a.step_end is not None and a.ckpt_step_end is not None
    ]
    # a checkpoint saved on an attempt's way out (a reclaim notice, a stop) is off the
    # trainer's schedule: the gaps either side of it are not intervals (after a preemption
    # they would read the interval short, until the next checkpoints pushed it out)
    way_out = {ckpt for start, end, ckpt, how in ended if how in _WAY_OUT and end > start}
    kept = [step for step in saved if step not in way_out]
    gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
    lost = [end - ckpt for _, end, ckpt, _ in ended]
    if gaps:
        return max(0, *gaps, *lost) * sps
    # the running attempt's lead over the newest checkpoint only until an interval is seen:
    # it falls to 0 at every save, and a reserve that rose and fell with it would move the
    # policy off on-demand and back (each move a changeover)
    lost.append(reported - (saved[-1] if saved else 0))
    return max(max(0, *lost) * sps, least_s)


def saved_steps(names: Iterable[str]) -> list[int]:
    """The steps of checkpoints named ``ckpt-<step>`` (``checkpoint_name``), oldest first."""
    steps = []
    for name in names:
        try:
            steps.append(int(name.rpartition("-")[2]))
        except ValueError:
            continue  # not a checkpoint of ours
    return sorted(steps)
