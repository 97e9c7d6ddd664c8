"""A gang's checkpoints: the manifest records the world size (old manifests read as one
process), only rank 0 writes, and every rank stops at the step the gang agreed on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.checkpoint.training import CONFIG_EXIT, PREEMPTED_EXIT, TrainingSession


def _session(tmp_path: Path, rank: int, world_size: int) -> TrainingSession:
    return TrainingSession(
        str(tmp_path / "ckpt"),
        total_steps=10,
        save_every=5,
        progress_file=str(tmp_path / f"progress-{rank}.json"),
        rank=rank,
        world_size=world_size,
    )


def test_a_manifest_written_before_gangs_reads_as_one_process() -> None:
    old = {"step": 5, "total_steps": 10, "created": 1.0, "files": {}, "metrics": {}}
    assert Manifest.from_json(json.dumps(old).encode()).world_size == 1
    new = Manifest(5, 10, 1.0, {}, world_size=4)
    assert Manifest.from_json(new.to_json()).world_size == 4


def test_only_rank_0_writes_and_its_manifest_records_the_world_size(tmp_path: Path) -> None:
    worker, leader = _session(tmp_path, 1, 2), _session(tmp_path, 0, 2)
    assert worker.step_done(5, lambda: {"w": b"one"}) is None
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
    assert not (tmp_path / "progress-1.json").exists()  # a gang reports through rank 0
    saved = leader.step_done(5, lambda: {"w": b"one"})
    assert saved is not None and saved.world_size == 2
    m, files = leader.checkpoints.load_latest()
    assert (m.step, m.world_size, files) == (5, 2, {"w": b"one"})
    assert json.loads((tmp_path / "progress-0.json").read_text())["step"] == 5


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_stops_on_the_agreed_stop(tmp_path: Path, rank: int) -> None:
    """``stopping=True`` (the gang's all-reduced notice) stops each rank at that step, off the
    save schedule; rank 0 saves first, a worker saves nothing."""
    s = _session(tmp_path, rank, 2)
    with pytest.raises(SystemExit) as stop:
        s.step_done(3, lambda: {"w": b"three"}, stopping=True)
    assert stop.value.code == PREEMPTED_EXIT
    assert (s.checkpoints.load_latest() is not None) == (rank == 0)
    assert s.step_done(4, lambda: {"w": b"four"}, stopping=False) is None  # no notice: trains on


def test_the_gang_environment_names_rank_and_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    s = TrainingSession.from_env(total_steps=10, checkpoint_uri=str(tmp_path / "c"))
    assert (s.rank, s.world_size) == (2, 4)
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(SystemExit) as bad:
        TrainingSession.from_env(total_steps=10, checkpoint_uri=str(tmp_path / "c"))
    assert bad.value.code == CONFIG_EXIT
    with pytest.raises(ValueError, match="rank 4 of world size 4"):
        TrainingSession(str(tmp_path / "c"), total_steps=10, rank=4, world_size=4)
