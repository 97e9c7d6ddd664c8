"""One-pass checkpoints (issue 38): a save hashes a file as it copies it and a resume as it
downloads it (no second read), several files go at once, new manifests hash with XXH3-128
and old BLAKE3 and sha256 ones read as before; and the integrity guarantees hold on these new
paths: a SIGKILL mid-save, a torn or corrupt checkpoint, a file changed meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from airflow_spot.checkpoint import Checkpoints, LocalStore, checkpoints, hashing, resume
from airflow_spot.checkpoint.hashing import BLAKE3, HASH_ENV, SHA256, XXH3, file_digest
from airflow_spot.checkpoint.training import CONFIG_EXIT, TrainingSession
from airflow_spot.exceptions import ConfigError


def _model(tmp_path: Path, name: str, size: int) -> Path:
    path = tmp_path / "work" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def test_a_save_and_a_resume_read_each_file_once(tmp_path: Path, monkeypatch) -> None:
    """No file is hashed apart from being copied: a save hashes while it copies, a resume
    while it downloads (the digest is of the bytes written); the manifest is XXH3-128."""
    files = {f"shard{i}.bin": _model(tmp_path, f"shard{i}.bin", (3 << 20) + i) for i in range(3)}

    def second_pass(*args, **kwargs):
        raise AssertionError("a file was read a second time to hash it")

    monkeypatch.setattr(checkpoints, "file_digest", second_pass)
    monkeypatch.setattr(resume, "file_digest", second_pass)
    session = TrainingSession(str(tmp_path / "c"), total_steps=10, save_every=5)
    saved = session.step_done(5, lambda: dict(files))
    assert {e.algo for e in saved.files.values()} == {XXH3}
    for name, path in files.items():
        stored = tmp_path / "c" / "ckpt-000000000005" / name
        assert stored.read_bytes() == path.read_bytes()
        assert (saved.files[name].digest, saved.files[name].size) == file_digest(stored, XXH3)
    step, got = TrainingSession(str(tmp_path / "c"), total_steps=10).resume_to(tmp_path / "in")
    assert step == 5 and {n: p.read_bytes() for n, p in got.items()} == {
        n: p.read_bytes() for n, p in files.items()
    }


def test_the_files_of_a_checkpoint_are_written_at_once(tmp_path: Path) -> None:
    """Four files are all being written before any finishes (a barrier that a save writing
    one file after another would never pass), and each is stored whole."""
    barrier = threading.Barrier(4, timeout=5)

    class Together(LocalStore):
        def stat(self, key):  # each file's save ends by asking for its size and tag
            if key.endswith(".pt"):
                barrier.wait()  # BrokenBarrierError if the files went one at a time
            return super().stat(key)

    files = {f"rank{i}.pt": _model(tmp_path, f"rank{i}.pt", 1000 + i) for i in range(4)}
    c = Checkpoints(Together(tmp_path / "c"))
    c.save(1, files, now=0)
    assert c.load(c.verify("ckpt-000000000001")) == {n: p.read_bytes() for n, p in files.items()}


def test_a_file_that_fails_among_others_leaves_no_checkpoint(tmp_path: Path) -> None:
    """One file of several failing mid-save: the error is raised once the others stopped,
    no manifest is written, and the checkpoint before stays the newest valid one."""

    class Failing(LocalStore):
        def put_file_hashed(self, key, path, algo):
            if key.endswith("/bad.pt"):
                raise OSError(5, "Input/output error")
            return super().put_file_hashed(key, path, algo)

    c = Checkpoints(Failing(tmp_path / "c"))
    c.save(1, {"good.pt": b"1", "bad.pt": b"1"}, now=0)
    files = {n: _model(tmp_path, n, 2 << 20) for n in ("a.pt", "bad.pt", "b.pt", "c.pt")}
    with pytest.raises(OSError, match="Input/output error"):
        c.save(2, files, now=1)
    assert c.manifests() == ["ckpt-000000000001"]
    latest = c.latest_valid()
    assert latest is not None and latest.step == 1


KILLED_SAVE = """
import sys, time
from pathlib import Path
from airflow_spot.checkpoint import Checkpoints, LocalStore
class Slow(LocalStore):
    def put_file_hashed(self, key, path, algo):
        got = super().put_file_hashed(key, path, algo)
        if key == "ckpt-000000000002/b.pt":
            print("mid-save", flush=True)
            time.sleep(30)
        return got
c = Checkpoints(Slow(sys.argv[1]))
files = {n: Path(sys.argv[2]) / n for n in ("a.pt", "b.pt", "c.pt", "d.pt")}
c.save(1, files, now=1)
c.save(2, files, now=2)
"""


def test_sigkill_during_a_save_of_several_files_resumes_from_the_one_before(
    tmp_path: Path,
) -> None:
    """A trainer SIGKILLed while the files of checkpoint 2 are being written (some whole,
    some not) resumes from checkpoint 1, whole."""
    for name in ("a.pt", "b.pt", "c.pt", "d.pt"):
        _model(tmp_path, name, 1 << 20)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(tmp_path / "c"), str(tmp_path / "work")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "mid-save"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "c" / "ckpt-000000000002" / "b.pt").exists()  # data, no manifest
    step, files = TrainingSession(str(tmp_path / "c"), total_steps=5).resume_to(tmp_path / "in")
    assert step == 1 and sorted(files) == ["a.pt", "b.pt", "c.pt", "d.pt"]
    assert all(p.read_bytes() == (tmp_path / "work" / n).read_bytes() for n, p in files.items())


@pytest.mark.parametrize("algo", [XXH3, BLAKE3])
def test_corrupt_or_torn_checkpoints_are_never_resumed(
    tmp_path: Path, monkeypatch, algo: str
) -> None:
    """An XXH3-128 (the default) or BLAKE3 checkpoint with one flipped byte (same size) or a
    torn manifest is skipped on resume; the one before loads."""
    monkeypatch.setenv(HASH_ENV, algo)
    model = _model(tmp_path, "model.pt", 3 << 20)
    c = Checkpoints(LocalStore(tmp_path / "c"), keep=5)
    for step in (1, 2, 3):
        c.save(step, {"model.pt": model, "meta.json": b"{}"}, now=step)
    stored = tmp_path / "c" / "ckpt-000000000003" / "model.pt"
    with open(stored, "r+b") as fh:
        fh.seek(2 << 20)
        byte = fh.read(1)
        fh.seek(2 << 20)
        fh.write(bytes([byte[0] ^ 1]))
    manifest = tmp_path / "c" / "ckpt-000000000002" / "MANIFEST.json"
    assert algo in json.loads(manifest.read_text())["files"]["model.pt"]
    manifest.write_bytes(manifest.read_bytes()[:40])
    found = Checkpoints(LocalStore(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 1
    assert found[1]["model.pt"].read_bytes() == model.read_bytes()


def test_older_manifests_read_and_are_written_on_request(tmp_path: Path, monkeypatch) -> None:
    """A checkpoint saved with ``AIRFLOW_SPOT_CHECKPOINT_HASH=sha256`` is written as every
    manifest before BLAKE3 (``{"sha256": ..., "size": ...}``), one with ``=blake3`` as every
    manifest before XXH3-128, and both verify and resume beside XXH3-128 ones; an unknown hash
    name is a ConfigError naming the variable and the choices."""
    model = _model(tmp_path, "model.pt", 1 << 20)
    monkeypatch.setenv(HASH_ENV, "sha256")
    c = Checkpoints(LocalStore(tmp_path / "c"), keep=5)
    c.save(1, {"model.pt": model}, now=1)
    raw = json.loads((tmp_path / "c" / "ckpt-000000000001" / "MANIFEST.json").read_text())
    assert raw["files"]["model.pt"] == {"sha256": file_digest(model)[0], "size": 1 << 20}
    monkeypatch.setenv(HASH_ENV, "blake3")
    c.save(2, {"model.pt": model}, now=2)
    raw = json.loads((tmp_path / "c" / "ckpt-000000000002" / "MANIFEST.json").read_text())
    assert raw["files"]["model.pt"] == {"blake3": file_digest(model, BLAKE3)[0], "size": 1 << 20}
    monkeypatch.delenv(HASH_ENV)
    c.save(3, {"model.pt": model}, now=3)
    assert c.verify("ckpt-000000000001").files["model.pt"].algo == SHA256
    assert c.verify("ckpt-000000000002").files["model.pt"].algo == BLAKE3
    assert c.verify("ckpt-000000000003").files["model.pt"].algo == XXH3
    (tmp_path / "c" / "ckpt-000000000003" / "model.pt").write_bytes(b"x" * (1 << 20))
    found = Checkpoints(LocalStore(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 2
    (tmp_path / "c" / "ckpt-000000000002" / "model.pt").write_bytes(b"x" * (1 << 20))
    found = Checkpoints(LocalStore(tmp_path / "c")).load_latest_to(tmp_path / "in")
    assert found is not None and found[0].step == 1
    monkeypatch.setenv(HASH_ENV, "md5")
    with pytest.raises(
        ConfigError, match=f"{HASH_ENV}: 'md5' is not a checkpoint hash; use one of xxh3_128, "
    ):
        c.save(4, {"model.pt": model}, now=4)


@pytest.mark.parametrize(
    ("algo", "missing", "then"),
    [(BLAKE3, "_blake3_module", XXH3), (XXH3, "_xxhash_module", BLAKE3)],
)
def test_without_its_package_a_trainer_stops_and_a_watcher_goes_by_the_tag(
    tmp_path: Path, monkeypatch, algo: str, missing: str, then: str
) -> None:
    """Where the package of a checkpoint's hash is missing (blake3, or xxhash), new manifests
    take the next hash installed; the checkpoint is not taken for corrupt (an older one would
    be resumed, and the newer deleted): the trainer stops on a configuration error (exit 78)
    saying what to install, and a watcher trusts a file whose size and store tag are those
    the save recorded."""
    model = _model(tmp_path, "model.pt", 1 << 20)
    monkeypatch.setenv(HASH_ENV, algo)
    Checkpoints(LocalStore(tmp_path / "c")).save(1, {"model.pt": model, "s": b"s"}, now=1)
    monkeypatch.delenv(HASH_ENV)
    monkeypatch.setattr(hashing, missing, lambda: None)
    assert hashing.save_algorithm() == then
    latest = Checkpoints.watching(LocalStore(tmp_path / "c")).latest_valid()
    assert latest is not None and latest.step == 1
    session = TrainingSession(str(tmp_path / "c"), total_steps=5)
    with pytest.raises(SystemExit) as stopped:
        session.resume_to(tmp_path / "in")
    assert stopped.value.code == CONFIG_EXIT
    package, spec = hashing.PACKAGES[algo]
    with pytest.raises(ConfigError, match=rf"{package}: .*pip install '{spec}'"):
        Checkpoints(LocalStore(tmp_path / "c")).load_latest()
    (tmp_path / "c" / "ckpt-000000000001" / "s").write_bytes(b"t")  # another tag
    with pytest.raises(ConfigError, match=package):
        Checkpoints.watching(LocalStore(tmp_path / "c")).latest_valid()


@pytest.mark.parametrize("held", [0, 2])
def test_ranges_hash_in_order_whatever_slots_other_files_hold(held: int) -> None:
    """A download's parts are hashed in order however few of the store's part slots the
    other files leave it (down to one part at a time), and every slot is given back."""
    import hashlib
    import random
    import time

    from airflow_spot.checkpoint.s3parts import Parts, Tuning, _in_order

    data = os.urandom(1000)
    parts = Parts(Tuning(part=100, concurrency=2))  # 3 slots
    for _ in range(held):
        parts.slots.acquire()  # held by other files

    def fetch(start: int) -> list[bytes]:
        time.sleep(random.uniform(0, 0.01))  # finish out of order
        return [data[start : start + 50], data[start + 50 : start + 100]]

    h = hashlib.sha256(data[:100])
    _in_order(fetch, range(100, 1000, 100), h, parts)
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    for _ in range(3 - held):
        assert parts.slots.acquire(blocking=False)
