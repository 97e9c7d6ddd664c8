"""A resume downloads the files the listing shows while it reads the manifest (issue 38: one
request fewer in a row before the first byte moves), and still resumes only what the
manifest vouches for: files it names that the listing missed are fetched after, files it does
not name never reach the folder, an older manifest's hash is checked, and a manifest that
does not read, or names another step, skips to the checkpoint before with the folder as it
was."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from airflow_spot.checkpoint import Checkpoints, LocalStore
from airflow_spot.checkpoint.hashing import HASH_ENV, SHA256
from airflow_spot.checkpoint.manifest import MANIFEST, RESUME_STAGE

STEP1, STEP2 = "ckpt-000000000001", "ckpt-000000000002"


def _saved(tmp_path: Path, steps: int = 2, files: int = 3) -> dict[int, dict[str, bytes]]:
    """``steps`` checkpoints of ``files`` random files each: their bytes by step and name."""
    c = Checkpoints(LocalStore(tmp_path / "c"), keep=5)
    out = {}
    for step in range(1, steps + 1):
        out[step] = {f"shard{i}.bin": os.urandom((1 << 20) + 7 * i) for i in range(files)}
        c.save(step, out[step], now=step)
    return out


def _read(found) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in found[1].items()}


def test_the_files_download_while_the_manifest_is_read(tmp_path: Path) -> None:
    """The manifest's GET does not answer until a file's download has started: a resume that
    waited for the manifest first would time out here and resume nothing."""
    saved = _saved(tmp_path, steps=1)
    started = threading.Event()

    class Pipelined(LocalStore):
        def get(self, key):
            if key.endswith(MANIFEST):
                assert started.wait(5), "no file download started before the manifest was read"
            return super().get(key)

        def get_file_hashed(self, key, path, algo):
            started.set()
            return super().get_file_hashed(key, path, algo)

    found = Checkpoints(Pipelined(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 1 and _read(found) == saved[1]


def test_a_file_the_listing_missed_is_fetched_and_a_stray_one_left_out(tmp_path: Path) -> None:
    """The listing is taken before the manifest is read: a file it did not show is
    downloaded once the manifest names it, and a file in the checkpoint's folder that the
    manifest does not name is never moved into the resume folder."""
    saved = _saved(tmp_path, steps=1)
    (tmp_path / "c" / STEP1 / "stray.bin").write_bytes(b"not part of the checkpoint")

    class Late(LocalStore):
        def list(self, prefix=""):
            return [k for k in super().list(prefix) if not k.endswith("shard1.bin")]

    found = Checkpoints(Late(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and _read(found) == saved[1]
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == sorted(saved[1])


def test_an_older_manifest_hash_is_checked_from_the_local_copy(tmp_path: Path, monkeypatch) -> None:
    """The files download hashed with today's hash before the manifest says which it uses: a
    sha256 manifest is checked by hashing the local copy again, and a corrupt file under it
    still skips to the checkpoint before."""
    monkeypatch.setenv(HASH_ENV, "sha256")
    saved = _saved(tmp_path)
    monkeypatch.delenv(HASH_ENV)
    c = Checkpoints(LocalStore(tmp_path / "c"))
    assert c.read_manifest(STEP2).files["shard0.bin"].algo == SHA256
    found = c.load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 2 and _read(found) == saved[2]
    corrupt = bytearray(saved[2]["shard2.bin"])
    corrupt[100] ^= 1
    (tmp_path / "c" / STEP2 / "shard2.bin").write_bytes(bytes(corrupt))
    found = Checkpoints(LocalStore(tmp_path / "c")).load_latest_to(tmp_path / "in2")
    assert found is not None and found[0].step == 1 and _read(found) == saved[1]


def test_a_bad_manifest_skips_to_the_one_before_and_leaves_the_folder(tmp_path: Path) -> None:
    """An unreadable manifest, or one that names another step than its folder's, is not
    resumed: the files already downloading for it are waited for and thrown away, the
    checkpoint before is resumed, and no staging folder is left behind."""
    saved = _saved(tmp_path, steps=3)
    manifest = tmp_path / "c" / "ckpt-000000000003" / MANIFEST
    manifest.write_bytes(manifest.read_bytes()[:30])
    moved = json.loads((tmp_path / "c" / STEP2 / MANIFEST).read_text())
    moved["step"] = 9
    (tmp_path / "c" / STEP2 / MANIFEST).write_text(json.dumps(moved))
    found = Checkpoints(LocalStore(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 1 and _read(found) == saved[1]
    assert not list((tmp_path / "in").glob(RESUME_STAGE + "*"))
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == sorted(saved[1])


def test_a_checkpoint_whose_manifest_names_a_missing_file_is_skipped(tmp_path: Path) -> None:
    """A file the manifest names and the store does not hold (deleted after the save) makes
    the checkpoint torn: the one before is resumed in its place."""
    saved = _saved(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "shard0.bin").write_bytes(b"what the folder had")
    (tmp_path / "c" / STEP2 / "shard1.bin").unlink()
    found = Checkpoints(LocalStore(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 1 and _read(found) == saved[1]
