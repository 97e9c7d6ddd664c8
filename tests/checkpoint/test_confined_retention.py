"""Retention deletes only inside the location it was given: a symbolic link planted there
(``ckpt-000000000001 -> /elsewhere``) is not walked, and no delete goes through it. Retention
lists keys without following links, so what it would delete elsewhere is only what a link
leads to: the leftovers of killed saves it sweeps, and a checkpoint's files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from airflow_spot.checkpoint import Checkpoints, LocalStore
from airflow_spot.exceptions import CheckpointError


def _files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def test_retention_never_deletes_through_a_symlink_out_of_the_location(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "MANIFEST.json").write_text("{}")
    (elsewhere / "model.bin").write_bytes(b"someone's model")
    (elsewhere / ".airflow-spot-tmp.model.bin.7.beef").write_bytes(b"someone's upload")
    (elsewhere / ".model.bin.tmp-7").write_bytes(b"an older temporary name")
    before = _files(elsewhere)
    loc = tmp_path / "loc"
    loc.mkdir()
    (loc / "ckpt-000000000001").symlink_to(elsewhere)  # sorts below every checkpoint saved
    ckpts = Checkpoints(LocalStore(loc), keep=1)
    for step in (5, 10, 15):
        ckpts.save(step, {"w.bin": f"weights {step}".encode()}, now=1000.0 + step)
    assert ckpts.manifests() == ["ckpt-000000000015"]  # retention ran inside the location
    assert _files(elsewhere) == before
    with pytest.raises(CheckpointError, match="leads outside .* not deleted"):
        LocalStore(loc).delete("ckpt-000000000001/model.bin")
    assert _files(elsewhere) == before
    assert (loc / "ckpt-000000000001").is_symlink()
