"""What a replay has seen of spot's runs (:class:`SpotRuns`), and the observation it makes."""

from __future__ import annotations

from airflow_spot.policy import Capacity, Observation
from airflow_spot.policy.model import SpotView, observe


class SpotRuns:
    """What a replay has seen of spot's runs: the current one's state and start, and the
    length of the last spot run and outage seen whole (never the run the job starts in).

    Seen through gaps (``observe="cluster"``), a run's start is when it was first seen and a
    run's length what was seen of it: from its first sighting to its last."""

    __slots__ = ("up", "since", "last", "seen_at", "source")

    def __init__(self) -> None:
        self.up: bool | None = None
        self.since = 0.0
        self.last: dict[bool, float | None] = {True: None, False: None}  # never replaced
        self.seen_at = 0.0
        self.source = ""

    def see(self, now: float, up: bool, watched: bool = True) -> None:
        """Spot is ``up`` (or not) at ``now``; ``watched``: it was seen at the previous look
        too (a change then happened since; else only the part seen counts). The replay's
        loop does the same inline."""
        if up != self.up:
            if self.up is not None and self.since > 0:
                self.last[self.up] = (now if watched else self.seen_at) - self.since
            self.up, self.since = up, now
        self.seen_at = now

    def see_changes(self, times: list[float]) -> None:
        """Spot's state changed at each of ``times`` (in order), looks skipped over them:
        as :meth:`see` at each (every change watched), of which only the last two leave the
        length of a run in :attr:`last` (the earlier runs' lengths are written over)."""
        if len(times) > 2:  # straight to the run the last two changes end
            if len(times) % 2:
                self.up = not self.up
            self.since = times[-3]
        for now in times[-2:]:
            self.see(now, not self.up)

    def observation(
        self,
        now: float,
        done: float,
        cur: Capacity,
        up: bool,
        rro: float,
        preemptions: int,
        down: float,
        overlap: bool = False,
    ) -> Observation:
        """The observation while spot's state is seen now (``up``)."""
        return observe(
            now,
            done,
            cur,
            SpotView.now(up, now - self.since, self.source),
            changeover_left_s=rro,
            preemptions=preemptions,
            spot_down_s=down,
            last_up_s=self.last[True],
            last_down_s=self.last[False],
            overlap=overlap,
        )
