"""Checkpoint milestones as Asset events (an Asset watcher's trigger): one event per whole
checkpoint that passes a milestone, never for a torn one, never twice for one step (across a
restarted triggerer too), and the milestones start again for a new job at the location."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.exceptions import ConfigError
from airflow_spot.triggers.milestones import (
    CheckpointMilestoneTrigger,
    milestone_asset,
)


class AssetState:
    """Airflow's asset state store as a watcher gets it (``aget``/``aset``), in memory."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


def _save(root: Path, step: int, total: int = 100) -> None:
    Checkpoints(LocalStore(root), keep=10).save(
        step, {"w.bin": f"weights at {step}".encode()}, now=float(step), total_steps=total
    )


def _events(trigger: CheckpointMilestoneTrigger, n: int) -> list[dict[str, Any]]:
    """The first ``n`` events, or those that came within a few polls."""

    async def collect() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        run = trigger.run()
        try:
            while len(got) < n:
                event = await asyncio.wait_for(run.__anext__(), timeout=0.5)
                got.append(event.payload)
        except TimeoutError:
            pass
        finally:
            await run.aclose()
        return got

    return asyncio.run(collect())


def _trigger(root: Path, state: AssetState | None, **kw: Any) -> CheckpointMilestoneTrigger:
    t = CheckpointMilestoneTrigger(checkpoint_uri=str(root), poll_interval=0.02, **kw)
    t.asset_state_store = state  # as the triggerer injects it for a watcher
    return t


def test_every_n_steps_one_event_per_milestone_with_its_checkpoint(tmp_path: Path) -> None:
    """Checkpoints every 25 steps, milestones every 50: events at 50 and 100, each naming
    its checkpoint (step, manifest hash, URI, fraction)."""
    state = AssetState()
    for step in (25, 50):
        _save(tmp_path, step)
    (first,) = _events(_trigger(tmp_path, state, every_steps=50), 1)
    manifest = tmp_path / "ckpt-000000000050" / "MANIFEST.json"
    assert first["checkpoint_step"] == 50 and first["fraction"] == 0.5
    assert first["manifest_hash"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert first["uri"] == f"{tmp_path}/ckpt-000000000050"
    for step in (75, 100):
        _save(tmp_path, step)
    assert [
        e["checkpoint_step"] for e in _events(_trigger(tmp_path, state, every_steps=50), 3)
    ] == [100]


def test_a_torn_checkpoint_never_makes_an_event(tmp_path: Path) -> None:
    """The newest checkpoint's file is not what its manifest says: no event for it (the
    previous whole one passed no new milestone)."""
    state = AssetState()
    _save(tmp_path, 50)
    assert [
        e["checkpoint_step"] for e in _events(_trigger(tmp_path, state, every_steps=50), 2)
    ] == [50]
    _save(tmp_path, 100)
    (tmp_path / "ckpt-000000000100" / "w.bin").write_bytes(b"torn")
    assert _events(_trigger(tmp_path, state, every_steps=50), 1) == []


def test_never_twice_for_one_step_across_a_restart(tmp_path: Path) -> None:
    """A restarted watcher reads the last event's step from the Asset's state store."""
    state = AssetState()
    _save(tmp_path, 25, total=100)
    assert [
        e["checkpoint_step"] for e in _events(_trigger(tmp_path, state, fractions=[0.25, 0.5]), 2)
    ] == [25]
    assert _events(_trigger(tmp_path, state, fractions=[0.25, 0.5]), 1) == []  # restarted
    assert state.values["airflow_spot_milestone"][str(tmp_path)]["step"] == 25


def test_a_new_job_at_the_location_starts_its_milestones_again(tmp_path: Path) -> None:
    """The checkpoints start again below the last event's step: a new job, announced anew."""
    state = AssetState()
    _save(tmp_path, 100)
    assert len(_events(_trigger(tmp_path, state, every_steps=50), 1)) == 1
    for d in tmp_path.iterdir():
        if d.name.startswith("ckpt-"):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
    _save(tmp_path, 50)
    assert [
        e["checkpoint_step"] for e in _events(_trigger(tmp_path, state, every_steps=50), 1)
    ] == [50]


def test_without_a_state_store_nothing_before_the_start_is_sent(tmp_path: Path) -> None:
    """A watcher without the Asset's state store counts from the newest checkpoint it finds."""
    _save(tmp_path, 100)
    t = _trigger(tmp_path, None, every_steps=50)
    assert _events(t, 1) == []


def test_the_watcher_round_trips_and_its_arguments_are_checked(tmp_path: Path) -> None:
    """serialize() rebuilds the same trigger; the Asset helper attaches it as a watcher."""
    t = _trigger(tmp_path, None, fractions=[0.5, 0.25])
    classpath, kwargs = t.serialize()
    assert classpath == "airflow_spot.triggers.milestones.CheckpointMilestoneTrigger"
    assert CheckpointMilestoneTrigger(**kwargs).serialize() == (classpath, kwargs)
    asset = milestone_asset("ckpts", checkpoint_uri=str(tmp_path), every_steps=10)
    assert asset.watchers[0].trigger.every_steps == 10
    for bad, field in [
        ({"every_steps": 0}, "every_steps"),
        ({}, "every_steps"),
        ({"fractions": [1.5]}, "fractions"),
        ({"every_steps": 5, "checkpoint_uri": "/x/{{ run_id }}"}, "checkpoint_uri"),
    ]:
        with pytest.raises(ConfigError) as e:
            CheckpointMilestoneTrigger(**{"checkpoint_uri": str(tmp_path), **bad})
        assert e.value.field == field
