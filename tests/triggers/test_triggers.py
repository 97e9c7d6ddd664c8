"""Every trigger round-trips through serialisation; every event kind is handled."""

from __future__ import annotations

import asyncio
import importlib
import time
from pathlib import Path

import pytest

from airflow_spot.exceptions import ConfigError
from airflow_spot.testing import scripted_trace
from airflow_spot.triggers.attempt import AttemptTrigger
from airflow_spot.triggers.base import SpotPollingTrigger
from airflow_spot.triggers.events import EventKind, SpotEvent
from airflow_spot.triggers.local import KubernetesAttemptTrigger, LocalAttemptTrigger
from airflow_spot.triggers.sensors import CheckpointTrigger, SpotPriceTrigger  # noqa: E402
from airflow_spot.triggers.watch import Watch

ALL_TRIGGERS = [
    AttemptTrigger,
    LocalAttemptTrigger,
    KubernetesAttemptTrigger,
    SpotPriceTrigger,
    CheckpointTrigger,
]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_trigger_is_listed_here() -> None:
    """Every SpotPollingTrigger subclass of the package is covered by the round-trip test."""
    ours = {c for c in _subclasses(SpotPollingTrigger) if c.__module__.startswith("airflow_spot.")}
    assert ours == set(ALL_TRIGGERS)


def _kwargs(cls, tmp_path: Path) -> dict:
    if cls is SpotPriceTrigger:
        return {
            "instance_type": "p3.2xlarge",
            "zones": ["us-east-1a"],
            "threshold": 1.1,
            "aws_conn_id": "aws_default",
            "region_name": "us-east-1",
            "poll_interval": 60.0,
        }
    if cls is CheckpointTrigger:
        return {
            "checkpoint_uri": "s3://b/p",
            "min_step": 10,
            "newer_than": None,
            "aws_conn_id": None,
            "poll_interval": 5.0,
        }
    if cls is SpotPriceTrigger:
        return {
            "instance_type": "p3.2xlarge",
            "zones": ["us-east-1a"],
            "threshold": 1.1,
            "aws_conn_id": "aws_default",
            "region_name": "us-east-1",
            "poll_interval": 60.0,
        }
    if cls is CheckpointTrigger:
        return {
            "checkpoint_uri": "s3://b/p",
            "min_step": 10,
            "newer_than": None,
            "aws_conn_id": None,
            "poll_interval": 5.0,
        }
    if cls is KubernetesAttemptTrigger:
        from airflow_spot.backends.kubernetes.backend import KubernetesBackend

        handle = {
            "kind": "kubernetes",
            "namespace": "ml",
            "pod": "p-a1",
            "capacity": "spot",
            "attempt": 1,
            "launched_at": 1.0,
            "node": "n1",
            "was_spot": True,
            "was_running": True,
        }
        return {
            "handle": handle,
            "backend": KubernetesBackend(image="img", namespace="ml", preset="gke").to_dict(),
            "wake_at": 123.0,
            "poll_interval": 0.5,
        }
    market = {
        "trace": str(scripted_trace(tmp_path / "m.json", [(True, 10)])),
        "polarity": "available",
        "nodes": None,
        "time_scale": 3600.0,
        "epoch": 1.0,
        "offset": 0,
        "spot_price": None,
    }
    kwargs = {
        "handle": None,
        "market": market,
        "spot_was": True,
        "wake_at": 123.0,
        "poll_interval": 0.5,
    }
    if cls is AttemptTrigger:
        from airflow_spot.backends.local.backend import LocalBackend

        kwargs["backend"] = LocalBackend(time_scale=3600.0).to_dict()
    return kwargs


@pytest.mark.parametrize("cls", ALL_TRIGGERS)
def test_trigger_round_trips_through_serialisation(cls, tmp_path: Path) -> None:
    """serialize() gives an importable classpath and kwargs that rebuild an equal trigger."""
    trigger = cls(**_kwargs(cls, tmp_path))
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)


def _run_first(trigger) -> SpotEvent:
    async def first():
        async for ev in trigger.run():
            return ev

    return SpotEvent.from_payload(asyncio.run(first()).payload)


def test_market_change_wakes_the_operator(tmp_path: Path) -> None:
    """While idle, spot coming back yields a MARKET_CHANGED event."""
    market = {
        "trace": str(scripted_trace(tmp_path / "m.json", [(False, 3), (True, 10)])),
        "polarity": "available",
        "time_scale": 3600.0,
        "epoch": time.time(),
        "offset": 0,
    }
    ev = _run_first(
        LocalAttemptTrigger(
            handle=None, market=market, spot_was=False, wake_at=time.time() + 60, poll_interval=0.05
        )
    )
    assert ev.kind is EventKind.MARKET_CHANGED and ev.spot_available is True


def _steady_market(tmp_path: Path) -> dict:
    """A market with spot up throughout, replayed in real time."""
    return {
        "trace": str(scripted_trace(tmp_path / "m.json", [(True, 10)])),
        "polarity": "available",
        "time_scale": 1.0,
        "epoch": time.time(),
        "offset": 0,
    }


def test_tick_wakes_the_operator_when_nothing_happens(tmp_path: Path) -> None:
    """With nothing happening, the decision interval yields a TICK."""
    market = _steady_market(tmp_path)
    ev = _run_first(
        LocalAttemptTrigger(
            handle=None, market=market, spot_was=True, wake_at=time.time() + 0.2, poll_interval=0.05
        )
    )
    assert ev.kind is EventKind.TICK


def test_a_held_trigger_reports_no_sooner_than_its_hold(tmp_path: Path) -> None:
    """A deferred task resumes no sooner than hold_until (Airflow may fail a task whose trigger
    fires within seconds of deferring); the hold survives serialisation."""
    market = _steady_market(tmp_path)
    t0 = time.time()
    trigger = LocalAttemptTrigger(
        handle=None,
        market=market,
        spot_was=True,
        wake_at=t0,
        poll_interval=0.05,
        hold_until=t0 + 0.6,
    )
    assert trigger.serialize()[1]["hold_until"] == t0 + 0.6
    ev = _run_first(trigger)
    assert ev.kind is EventKind.TICK and time.time() - t0 >= 0.6


def test_watcher_failure_becomes_an_error_event(tmp_path: Path) -> None:
    """A broken attempt handle yields an ERROR event instead of killing the trigger."""
    trig = LocalAttemptTrigger(
        handle={"run_dir": str(tmp_path / "missing")},
        market=None,
        spot_was=None,
        wake_at=time.time() + 60,
        poll_interval=0.05,
    )
    ev = _run_first(trig)
    assert ev.kind is EventKind.ERROR and "missing" in ev.message


def test_a_passing_poll_failure_is_tried_again(tmp_path: Path) -> None:
    """Two failed polls (a network blip), then the condition: the watch goes on and reports
    it; failures only end the watch when they keep coming."""

    class Flaky(SpotPollingTrigger):
        def __init__(self, fail: int) -> None:
            super().__init__(poll_interval=0.01, fail=fail)
            self.left = fail

        def poll(self):
            if self.left:
                self.left -= 1
                raise ConnectionError("connection reset by peer")
            return SpotEvent(EventKind.CONDITION_MET, time.time())

    assert _run_first(Flaky(2)).kind is EventKind.CONDITION_MET
    ev = _run_first(Flaky(3))
    assert ev.kind is EventKind.ERROR and "connection reset" in ev.message

    class Broken(Flaky):
        def poll(self):
            raise ConfigError("zones", "unknown availability zone(s)")

    t0 = time.time()
    ev = _run_first(Broken(1))  # a config error: no retry, no pause
    assert ev.kind is EventKind.ERROR and "zones" in ev.message and time.time() - t0 < 1


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_event_kind_round_trips(kind: EventKind) -> None:
    """Each event kind survives to_payload / from_payload."""
    ev = SpotEvent(kind, 5.0, True, {"state": "ended"}, "m")
    assert SpotEvent.from_payload(ev.to_payload()) == ev


@pytest.mark.parametrize("payload", [None, {}, {"kind": "teleported", "at": 1}, "tick"])
def test_unknown_events_fail_loudly(payload) -> None:
    """Anything that is not a known event raises."""
    with pytest.raises(ValueError):
        SpotEvent.from_payload(payload)


@pytest.mark.parametrize("kind", list(EventKind))
def test_operator_handles_every_event_kind(kind: EventKind, tmp_path: Path) -> None:
    """resume() accepts every event kind: it records what it saw and decides again (defers)."""
    from datetime import timedelta

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_spot.backends.local import LocalBackend
    from airflow_spot.operators import SpotTrainingOperator
    from airflow_spot.testing import FileTaskStateStore, make_context

    trace = str(scripted_trace(tmp_path / "m.json", [(False, 1000)]))
    op = SpotTrainingOperator(
        task_id="t",
        command=["true"],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(hours=1),
        total_steps=10,
        deadline=timedelta(hours=10),
        policy="greedy",
        backend=LocalBackend(
            trace=trace, polarity="available", time_scale=1.0, work_dir=str(tmp_path / "runs")
        ),
    )
    ctx = make_context(FileTaskStateStore(tmp_path / "state.json"))
    try:
        with pytest.raises(TaskDeferred):
            op.execute(ctx)  # spot is down: a spot request waits for it (a cluster's view)
        with pytest.raises(TaskDeferred) as d:
            op.resume(ctx, event=SpotEvent(kind, time.time(), False, None, "x").to_payload())
        assert d.value.method_name == "resume"
        with pytest.raises(ValueError):
            op.resume(ctx, event={"kind": "bogus", "at": 0})
    finally:  # the waiting request's supervisor must not outlive the test
        from airflow_spot.jobstate import AttemptHandle

        for run_dir in (tmp_path / "runs").glob("**/attempt-*"):
            LocalBackend().cancel(AttemptHandle(launched_at=time.time(), run_dir=str(run_dir)))


def test_a_pool_in_cool_down_does_not_wake_the_operator_until_it_ends(tmp_path: Path) -> None:
    """Pool a is down; pool b has capacity but lost the job's spot instance and is cooling
    down. The controller sees spot down, so must the watcher: no MARKET_CHANGED (it would
    wake the operator again at once, every poll) until b's cool-down ends."""
    now = time.time()

    def spec(name: str, pattern) -> dict:
        return {
            "trace": str(scripted_trace(tmp_path / f"{name}.json", pattern)),
            "polarity": "available",
            "time_scale": 1.0,
            "epoch": now,
            "offset": 0,
        }

    market = {
        "pools": [
            {"name": "a", "spec": spec("a", [(False, 10)]), "price_from": None},
            {"name": "b", "spec": spec("b", [(True, 10)]), "price_from": None},
        ],
        "cooldown_wall_s": 600.0,
    }
    watch = Watch(None, market, False, now + 60, cooling={"b": now + 0.3})
    assert watch.poll_once(now) is None
    ev = watch.poll_once(now + 0.4)
    assert ev is not None and ev.kind is EventKind.MARKET_CHANGED and ev.spot_available is True
    trig = LocalAttemptTrigger(
        handle=None, market=market, spot_was=False, wake_at=now + 60, cooling={"b": now + 1}
    )
    path, kwargs = trig.serialize()
    assert kwargs["cooling"] == {"b": now + 1}


def test_the_first_trigger_to_run_freezes_the_heap_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A triggerer process's first airflow-spot trigger freezes the heap built before it (its
    full collections then stop the loop for far less: benchmarks/triggerer_load.py); later
    triggers do not freeze again."""
    import gc

    from airflow_spot.triggers import base

    frozen: list[int] = []
    monkeypatch.setattr(base, "_heap_frozen", False)
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    market = _steady_market(tmp_path)
    for _ in range(2):
        _run_first(
            LocalAttemptTrigger(
                handle=None, market=market, spot_was=True, wake_at=time.time(), poll_interval=0.05
            )
        )
    assert frozen == [1]
