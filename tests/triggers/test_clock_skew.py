"""A trigger keeps to the clock of the worker that built it: a worker (and the local attempts it
spawns) minutes ahead of or behind the triggerer delays no wake-up by more than a poll interval
(issue 34, finding 3).

The two clocks are simulated in one process: the worker's side builds the trigger while
``time.time`` reads ``SKEW`` seconds off, the triggerer's side runs it on the true clock (or the
other way round where a local attempt's supervisor, on the true clock, stands for the worker's
host). The trigger's own timers run on ``time.monotonic``, which no test moves.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from airflow_spot.backends.base import AttemptStatus, Outcome, State, TaskIdentity
from airflow_spot.backends.local import LocalBackend
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.testing import scripted_trace
from airflow_spot.triggers.attempt import AttemptTrigger, attempt_trigger
from airflow_spot.triggers.events import EventKind, SpotEvent

SKEW_S = 600.0  # the skew: 10 minutes either way
POLL_S = 0.1
SKEWS = pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S], ids=["worker_ahead", "worker_behind"])
LATE_S = POLL_S + 0.4  # a poll interval, and room for a loaded 2-core machine


@contextmanager
def clock_off_by(skew: float) -> Iterator[None]:
    """``time.time`` reads ``skew`` seconds off the true clock (another host's clock)."""
    true_time = time.time
    try:
        time.time = lambda: true_time() + skew  # type: ignore[assignment]
        yield
    finally:
        time.time = true_time  # type: ignore[assignment]


def _worker_builds(skew: float, **kwargs) -> AttemptTrigger:
    """The trigger as a worker whose clock is ``skew`` seconds off builds it: its times are
    ``now`` on that clock plus the offsets given (``wake_in``, ``hold_for``)."""
    backend = kwargs.pop("backend", LocalBackend().to_dict())
    handle = kwargs.pop("handle", None)
    wake_in, hold_for = kwargs.pop("wake_in", 60.0), kwargs.pop("hold_for", None)
    with clock_off_by(skew):
        now = time.time()
        return attempt_trigger(
            backend,
            handle,
            market=kwargs.pop("market", None),
            spot_was=kwargs.pop("spot_was", None),
            wake_at=now + wake_in,
            poll_interval=POLL_S,
            hold_until=None if hold_for is None else now + hold_for,
            **kwargs,
        )


def _first_event(trigger: AttemptTrigger, within_s: float) -> tuple[SpotEvent, float]:
    """The trigger's first event and the seconds it took; fails after ``within_s``."""

    async def first():
        async for ev in trigger.run():
            return ev

    t0 = time.monotonic()
    try:
        payload = asyncio.run(asyncio.wait_for(first(), within_s)).payload
    except TimeoutError:
        pytest.fail(f"no event within {within_s} s: the trigger waits on the wrong clock")
    return SpotEvent.from_payload(payload), time.monotonic() - t0


def _ended_attempt(tmp_path: Path) -> AttemptHandle:
    """A local attempt that its supervisor reported preempted (its folder as it leaves it)."""
    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps({"capacity": "spot", "attempt": 1}))
    now = time.time()
    status = AttemptStatus(
        State.ENDED, "spot", 1, now - 30, ended_at=now, outcome=Outcome.PREEMPTED, reason="x"
    )
    (run_dir / "status.json").write_text(json.dumps(status.to_dict()))
    return AttemptHandle(launched_at=now - 30, run_dir=str(run_dir))


@SKEWS
def test_a_preemption_wakes_the_task_once_the_hold_is_over_whatever_the_skew(
    skew: float, tmp_path: Path
) -> None:
    """The attempt ended as the task deferred: the trigger reports it once its 0.5 s hold is
    over (no sooner: Airflow may fail a task that resumes within seconds of deferring; no
    later than a poll interval after: not ten minutes later)."""
    trigger = _worker_builds(skew, handle=_ended_attempt(tmp_path), hold_for=0.5)
    ev, took = _first_event(trigger, within_s=5.0)
    assert ev.kind is EventKind.ATTEMPT_ENDED and ev.status["outcome"] == "preempted"
    assert 0.5 <= took <= 0.5 + LATE_S, took


@SKEWS
def test_the_decision_interval_ticks_on_time_whatever_the_skew(skew: float) -> None:
    """Nothing happens: the TICK comes one ``wake_at - now`` (1 s) after the deferral, as the
    worker meant, neither at once nor ten minutes late."""
    ev, took = _first_event(_worker_builds(skew, wake_in=1.0, hold_for=0.2), within_s=5.0)
    assert ev.kind is EventKind.TICK
    assert 1.0 <= took <= 1.0 + LATE_S, took


@SKEWS
def test_a_replayed_market_is_read_on_the_worker_clock(skew: float, tmp_path: Path) -> None:
    """The worker replays the market from its own clock (its epoch) and saw spot down; spot
    comes back 0.6 s later on that clock. The trigger wakes it then: a triggerer reading
    the replay on its own clock would see another hour of the trace (at once, or 600 s late)."""
    with clock_off_by(skew):
        epoch = time.time()
    market = {
        "trace": str(scripted_trace(tmp_path / "m.json", [(False, 1), (True, 10)])),
        "polarity": "available",
        "time_scale": 1000.0,  # a 600 s tick of the trace is 0.6 s
        "epoch": epoch,
        "offset": 0,
    }
    trigger = _worker_builds(skew, market=market, spot_was=False, wake_in=60.0)
    ev, took = _first_event(trigger, within_s=5.0)
    assert ev.kind is EventKind.MARKET_CHANGED and ev.spot_available is True
    assert 0.6 <= took <= 0.6 + LATE_S, took


def test_a_triggerer_restart_delays_a_tick_by_at_most_one_tick() -> None:
    """The triggerer restarts 0.5 s into a 1 s wait: the trigger rebuilt from its stored kwargs
    counts the wait again from its restart (it cannot tell how long it ran before without
    comparing clocks), so the TICK comes no later than one wait after the restart."""
    trigger = _worker_builds(SKEW_S, wake_in=1.0)

    async def run_for(seconds: float) -> None:
        async def first():
            async for ev in trigger.run():
                return ev

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(first(), seconds)

    asyncio.run(run_for(0.5))
    path, kwargs = trigger.serialize()
    assert path == "airflow_spot.triggers.attempt.AttemptTrigger"
    ev, took = _first_event(AttemptTrigger(**json.loads(json.dumps(kwargs))), within_s=5.0)
    assert ev.kind is EventKind.TICK and 1.0 <= took <= 1.0 + LATE_S, took


@SKEWS
def test_the_lease_is_renewed_on_the_clock_of_the_attempt_host(skew: float, tmp_path: Path) -> None:
    """A local attempt's supervisor (here on the true clock, as on the worker that spawned
    it) reads its lease on its own clock; the trigger, its triggerer's clock ``skew`` off,
    renews it on the worker's clock. A lease renewed on the triggerer's clock would expire at
    once (triggerer behind) or only ten minutes late (triggerer ahead)."""
    backend = LocalBackend(work_dir=str(tmp_path / "runs"), notice_s=0.2, grace_s=1.0)
    lease_s = 1.5
    handle = backend.launch(
        TaskIdentity("dag", "train", "run"),
        1,
        "on_demand",
        [sys.executable, "-c", "import time; time.sleep(3.0)"],
        checkpoint_uri=str(tmp_path / "c"),
        changeover_wall_s=0.0,
        market=backend.market_spec(time.time()),
        lease_until=time.time() + lease_s,
    )
    handle.lease_s, handle.lease_until = lease_s, time.time() + lease_s  # as the operator does
    try:
        # its supervisor reported: before that, LocalBackend.status judges the attempt's age
        # on the reader's clock (a triggerer far ahead reads "never started" and wakes the
        # task, which reads it again on its own clock)
        until = time.monotonic() + 15
        while not (Path(str(handle.run_dir)) / "status.json").exists():
            assert time.monotonic() < until, "the supervisor never reported"
            time.sleep(0.02)
        trigger = _worker_builds(0.0, backend=backend.to_dict(), handle=handle, wake_in=30.0)
        with clock_off_by(-skew):  # the triggerer's clock (the worker is ``skew`` ahead of it)
            ev, _ = _first_event(trigger, within_s=20.0)
        assert ev.kind is EventKind.ATTEMPT_ENDED
        assert ev.status["outcome"] == Outcome.SUCCEEDED.value, ev.status["reason"]
        until = json.loads((Path(str(handle.run_dir)) / "LEASE").read_text())["until"]
        assert until <= time.time() + lease_s, "the lease was moved onto the triggerer's clock"
    finally:
        backend.cancel(handle)
