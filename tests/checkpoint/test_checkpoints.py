"""Checkpoints: complete only once the manifest is written, corrupt or torn ones never loaded,
retention, keys confined to the prefix, and a SIGKILL during a save."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from airflow_spot.checkpoint import Checkpoints, LocalStore, open_store
from airflow_spot.checkpoint.training import TrainingSession
from airflow_spot.exceptions import CheckpointError, ConfigError
from airflow_spot.testing import MemoryStore


def _ckpts(tmp_path: Path, keep: int = 3) -> Checkpoints:
    return Checkpoints(LocalStore(tmp_path / "c"), keep=keep)


def test_save_then_latest_valid_returns_it(tmp_path: Path) -> None:
    """A saved checkpoint comes back with its step, total, metrics and exact bytes."""
    c = _ckpts(tmp_path)
    c.save(10, {"w.npy": b"abc"}, now=1.0, total_steps=100, metrics={"loss": 0.5})
    m = c.latest_valid()
    assert (m.step, m.total_steps, m.metrics, m.created) == (10, 100, {"loss": 0.5}, 1.0)
    assert c.load(m) == {"w.npy": b"abc"}
    assert m.files["w.npy"].size == 3


def test_data_without_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    """Files written without their manifest (a save cut short) are invisible."""
    c = _ckpts(tmp_path)
    c.save(10, {"w": b"1"}, now=1)
    c.store.put("ckpt-000000000020/w", b"half")
    assert c.latest_valid().step == 10


def test_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    """A checkpoint whose file no longer matches its sha256 is skipped, the previous one returned."""
    c = _ckpts(tmp_path)
    c.save(10, {"w": b"good"}, now=1)
    c.save(20, {"w": b"good2"}, now=2)
    (tmp_path / "c" / "ckpt-000000000020" / "w").write_bytes(b"bad!!")
    with caplog.at_level(logging.WARNING):
        assert c.latest_valid().step == 10
    assert "Skipping checkpoint ckpt-000000000020" in caplog.text


def test_torn_manifest_and_missing_file_are_skipped(tmp_path: Path) -> None:
    """An unreadable manifest or a missing data file never makes a checkpoint valid."""
    c = _ckpts(tmp_path, keep=5)
    c.save(10, {"w": b"a"}, now=1)
    c.save(20, {"w": b"b"}, now=2)
    c.save(30, {"w": b"c"}, now=3)
    (tmp_path / "c" / "ckpt-000000000030" / "MANIFEST.json").write_text('{"step": 30, "fil')
    (tmp_path / "c" / "ckpt-000000000020" / "w").unlink()
    assert c.latest_valid().step == 10


def test_retention_keeps_the_last_k(tmp_path: Path) -> None:
    """Only the newest ``keep`` checkpoints remain, data included."""
    c = _ckpts(tmp_path, keep=2)
    for step in (5, 10, 15, 20):
        c.save(step, {"w": str(step).encode()}, now=step)
    assert c.manifests() == ["ckpt-000000000020", "ckpt-000000000015"]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "ckpt-000000000015",
        "ckpt-000000000020",
    ]


def test_retention_counts_only_valid_checkpoints(tmp_path: Path) -> None:
    """Resuming from an older checkpoint because the newest is corrupt, then saving: the corrupt
    one neither counts toward ``keep`` nor stays (it would shadow progress)."""
    c = _ckpts(tmp_path, keep=2)
    c.save(900, {"w": b"900"}, now=1)
    c.save(1000, {"w": b"1000"}, now=2)
    (tmp_path / "c" / "ckpt-000000001000" / "w").write_bytes(b"bad!")
    c.store.put("ckpt-000000000500/w", b"old")  # a save cut short before its manifest
    resumed = _ckpts(tmp_path, keep=2)  # a new attempt
    assert resumed.latest_valid().step == 900
    resumed.save(910, {"w": b"910"}, now=3)
    assert resumed.manifests() == ["ckpt-000000000910", "ckpt-000000000900"]
    assert resumed.latest_manifest().step == 910
    resumed.save(920, {"w": b"920"}, now=4)
    assert resumed.manifests() == ["ckpt-000000000920", "ckpt-000000000910"]
    assert resumed.load(resumed.latest_valid()) == {"w": b"920"}
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "ckpt-000000000910",
        "ckpt-000000000920",
    ]


def test_retention_never_deletes_the_checkpoint_just_saved(tmp_path: Path) -> None:
    """A valid checkpoint above the one just saved is kept, and so is the new one."""
    c = _ckpts(tmp_path, keep=1)
    c.save(1000, {"w": b"1000"}, now=1)
    c.save(910, {"w": b"910"}, now=2)
    assert c.manifests() == ["ckpt-000000001000", "ckpt-000000000910"]


def test_a_store_error_during_retention_never_fails_the_save(tmp_path: Path) -> None:
    """The new checkpoint is complete before retention runs: a passing read error on a newer
    checkpoint keeps it (unchecked, not counted) and a failing delete is only logged."""

    class Flaky(LocalStore):
        broken = False

        def get(self, key: str) -> bytes:
            if self.broken and key.startswith("ckpt-000000000300/"):
                raise OSError("S3 500: internal error")
            return super().get(key)

        def delete(self, key: str) -> None:
            if self.broken:
                raise OSError("S3 503: slow down")
            super().delete(key)

    store = Flaky(tmp_path / "c")
    c = Checkpoints(store, keep=1)
    for step in (100, 300):
        c.save(step, {"w": str(step).encode()}, now=step)
    store.broken = True
    resumed = Checkpoints(store, keep=1)
    assert resumed.save(210, {"w": b"210"}, now=4).step == 210
    assert resumed.manifests() == ["ckpt-000000000300", "ckpt-000000000210"]
    store.broken = False
    assert resumed.load(resumed.verify("ckpt-000000000210")) == {"w": b"210"}


@pytest.mark.parametrize(
    "name", ["../escape", "/etc/passwd", "a/../../b", "", "a//b", "weird name"]
)
def test_keys_never_escape_the_prefix(tmp_path: Path, name: str) -> None:
    """A file name with '..', an absolute path or odd characters is refused on save."""
    with pytest.raises(CheckpointError, match="unsafe checkpoint key"):
        _ckpts(tmp_path).save(1, {name: b"x"}, now=0)


def test_manifest_naming_a_path_outside_is_rejected(tmp_path: Path) -> None:
    """A manifest that names '../../secret' is never followed."""
    c = _ckpts(tmp_path)
    c.save(1, {"w": b"x"}, now=0)
    doc = json.loads((tmp_path / "c" / "ckpt-000000000001" / "MANIFEST.json").read_text())
    doc["files"] = {"../../secret": doc["files"]["w"]}
    (tmp_path / "c" / "ckpt-000000000001" / "MANIFEST.json").write_text(json.dumps(doc))
    assert c.latest_valid() is None


@pytest.mark.parametrize(("uri", "kind"), [("/tmp/x", LocalStore), ("file:///tmp/x", LocalStore)])
def test_open_store_by_uri(uri: str, kind: type) -> None:
    """Paths and file:// URIs open a local store."""
    assert isinstance(open_store(uri), kind)


def test_malformed_uri_names_the_field() -> None:
    """A malformed URI raises ConfigError naming checkpoint_uri."""
    with pytest.raises(ConfigError, match="checkpoint_uri: 'file://host/x'"):
        open_store("file://host/x")


SLOW_SAVE = """
import sys, time
from airflow_spot.checkpoint import Checkpoints, LocalStore
class Slow(LocalStore):
    def put(self, key, data):
        super().put(key, data)
        if key.endswith("/w2"):
            print("mid-save", flush=True)
            time.sleep(30)
c = Checkpoints(Slow(sys.argv[1]))
c.save(10, {"w1": b"a", "w2": b"b"}, now=1)
c.save(20, {"w1": b"c", "w2": b"d"}, now=2)
"""


def test_sigkill_during_a_save_resumes_from_the_previous_checkpoint(tmp_path: Path) -> None:
    """A process SIGKILLed in the middle of writing checkpoint 20 leaves checkpoint 10 as the one to resume from."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, str(tmp_path / "c")], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "mid-save"  # first save (10) sleeps after w2 too
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    c = _ckpts(tmp_path)
    assert c.latest_valid() is None or c.latest_valid().step < 20
    # run again: 10 completes, 20 is cut in the middle
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLOW_SAVE.replace('key.endswith("/w2")', 'key == "ckpt-000000000020/w2"'),
            str(tmp_path / "c"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "mid-save"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    session = TrainingSession(str(tmp_path / "c"), total_steps=100)
    step, files = session.resume()
    assert step == 10 and files == {"w1": b"a", "w2": b"b"}


def test_training_session_saves_on_sigterm_and_exits(tmp_path: Path) -> None:
    """SIGTERM in the middle of a loop: the next step_done saves at once and exits 143."""
    code = textwrap.dedent(f"""
        import time
        from airflow_spot.checkpoint.training import TrainingSession
        s = TrainingSession({str(tmp_path / "c")!r}, total_steps=10_000, save_every=1000,
                            progress_file={str(tmp_path / "p.json")!r})
        s.install_signal_handler()
        for step in range(10_000):
            time.sleep(0.01)
            s.step_done(step + 1, lambda: {{"w": str(step).encode()}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    until = time.time() + 20
    while not (tmp_path / "p.json").exists() and time.time() < until:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    m = Checkpoints(LocalStore(tmp_path / "c")).latest_valid()
    assert m is not None and 0 < m.step < 1000  # saved off-schedule, on the signal
    assert json.loads((tmp_path / "p.json").read_text())["checkpoint_step"] == m.step


def test_notice_file_triggers_a_save(tmp_path: Path) -> None:
    """The backend's notice file makes the next step save and exit."""
    notice = tmp_path / "NOTICE"
    s = TrainingSession(
        str(tmp_path / "c"), total_steps=100, save_every=50, notice_file=str(notice)
    )
    assert s.step_done(3, lambda: {"w": b"3"}) is None
    notice.write_text("{}")
    with pytest.raises(SystemExit) as e:
        s.step_done(4, lambda: {"w": b"4"})
    assert e.value.code == 143
    assert s.checkpoints.latest_valid().step == 4


def test_reading_while_a_writer_saves_and_retention_deletes(tmp_path: Path) -> None:
    """The controller reads checkpoints while training writes them and deletes old ones: reads
    never fail, and always return a complete checkpoint or none."""
    import threading

    writer = Checkpoints(LocalStore(tmp_path / "c"), keep=1)
    reader = Checkpoints(LocalStore(tmp_path / "c"), keep=1)
    stop = threading.Event()

    def write() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            writer.save(step, {"w": str(step).encode() * 100}, now=float(step))

    t = threading.Thread(target=write)
    t.start()
    try:
        for _ in range(300):
            m = reader.latest_manifest()
            v = reader.latest_valid()
            assert m is None or m.step >= 1
            if v is not None:
                try:
                    files = reader.load(v)
                except CheckpointError:
                    continue  # retention removed it after it was found: a clear error, never torn data
                assert files["w"] == str(v.step).encode() * 100
    finally:
        stop.set()
        t.join()


def test_a_local_claim_is_atomic(tmp_path: Path) -> None:
    """Of many processes claiming one location at once, exactly one records itself."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(4) as pool:
        got = pool.starmap(_claim, [(str(tmp_path / "c"), i) for i in range(8)])
    winners = [i for i, prev in enumerate(got) if prev is None]
    assert len(winners) == 1
    assert all(prev == {"map_index": winners[0]} for prev in got if prev is not None)


def _claim(root: str, i: int) -> dict | None:
    return Checkpoints(LocalStore(root)).claim({"map_index": i})


def test_files_given_as_paths_are_streamed_and_come_back_as_paths(tmp_path: Path) -> None:
    """A checkpoint file may be a local path (a model too big to hold twice in memory): it is
    hashed and copied in chunks, and ``resume_to`` downloads the newest whole checkpoint into
    a folder, skipping a corrupt newer one."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pt").write_bytes(os.urandom(3 << 20))  # 3 chunks
    s = TrainingSession(str(tmp_path / "c"), total_steps=100, save_every=10)
    s.step_done(10, lambda: {"model.pt": out / "model.pt", "meta.json": b"{}"})
    first = (out / "model.pt").read_bytes()
    (out / "model.pt").write_bytes(b"newer")
    s.step_done(20, lambda: {"model.pt": out / "model.pt", "meta.json": b"{}"})
    assert s.checkpoints.load(s.checkpoints.latest_valid())["model.pt"] == b"newer"
    (out / "extra.bin").write_bytes(b"e")
    s.step_done(30, lambda: {"extra.bin": out / "extra.bin", "model.pt": out / "model.pt"})
    (tmp_path / "c" / "ckpt-000000000030" / "model.pt").write_bytes(b"NEWER")  # same size
    (tmp_path / "c" / "ckpt-000000000020" / "meta.json").unlink()  # torn
    step, files = TrainingSession(str(tmp_path / "c"), total_steps=100).resume_to(tmp_path / "in")
    assert step == 10 and set(files) == {"model.pt", "meta.json"}
    assert files["model.pt"] == tmp_path / "in" / "model.pt"
    assert files["model.pt"].read_bytes() == first
    # nothing is left of the two newer ones that did not load (extra.bin came first in 30)
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == ["meta.json", "model.pt"]
    assert TrainingSession(str(tmp_path / "empty"), total_steps=5).resume_to(tmp_path / "x") == (
        0,
        None,
    )


def test_a_watcher_reads_a_big_file_only_when_its_tag_changed(tmp_path: Path, monkeypatch) -> None:
    """The operator and the sensor (``hash_up_to``) check a file bigger than that by the size
    and tag the save recorded (a stat, a HEAD on S3), so a multi-GB model is not downloaded at
    every look. A file written again (same size, other bytes: a second writer, a copy) has
    another tag and is hashed; a small one is always hashed."""
    c = _ckpts(tmp_path)
    c.save(10, {"big": b"x" * 1000, "small": b"s"}, now=1)
    store = LocalStore(tmp_path / "c")
    hashed: list[str] = []
    digest = store.digest
    monkeypatch.setattr(store, "digest", lambda key, *a: hashed.append(key) or digest(key, *a))
    watcher = Checkpoints(store, hash_up_to=100)
    assert watcher.latest_valid().step == 10
    assert hashed == ["ckpt-000000000010/small"]  # the big one was not read
    path = tmp_path / "c" / "ckpt-000000000010" / "big"
    path.write_bytes(b"y" * 1000)  # same size, other bytes
    assert Checkpoints(store, hash_up_to=100).latest_valid() is None
    path.write_bytes(b"x" * 1000)  # the same bytes again: another tag, hashed, valid
    hashed.clear()
    assert Checkpoints(store, hash_up_to=100).latest_valid().step == 10
    assert "ckpt-000000000010/big" in hashed
    path.write_bytes(b"x" * 999)  # torn
    assert Checkpoints(store, hash_up_to=100).latest_valid() is None


class _Rewriting(LocalStore):
    """A local store (one pass: hashed as copied) whose copy meets a file rewritten."""

    def put_file_hashed(self, key, path, algo):
        Path(path).write_bytes(b"b" * 100)
        return super().put_file_hashed(key, path, algo)


class _RewritingMemory(MemoryStore):
    """A store without one-pass copies: hashed first, then copied; rewritten in between."""

    def put_file(self, key, path):
        Path(path).write_bytes(b"b" * 100)
        super().put_file(key, path)


@pytest.mark.parametrize("store", [_Rewriting, _RewritingMemory])
def test_a_file_changed_while_it_is_saved_or_a_name_both_file_and_folder_is_refused(
    tmp_path: Path, store: type
) -> None:
    """A model file rewritten while it is copied (one pass) or between the hash and the copy
    (two) would leave a manifest that does not match the file the user meant; the save is
    refused naming the file. A name that is also a folder of another file is refused before
    anything is written."""
    model = tmp_path / "model.pt"
    model.write_bytes(b"a" * 100)
    c = Checkpoints(store(tmp_path / "c") if store is _Rewriting else store())
    with pytest.raises(CheckpointError, match="model.pt: .* changed while it was being saved"):
        c.save(1, {"model.pt": model, "other.pt": b"o"}, now=0)
    assert c.manifests() == []
    with pytest.raises(CheckpointError, match="a: is both a file and a folder"):
        _ckpts(tmp_path).save(2, {"a": b"1", "a/b": b"2"}, now=0)


def test_retention_sweeps_what_a_killed_save_left_and_keeps_user_dot_files(tmp_path: Path) -> None:
    """A save SIGKILLed mid-copy leaves a temporary file that no listing shows: retention
    deletes it with the checkpoints older than those it keeps. A file of the checkpoint whose
    name starts with a dot (torch's ``.metadata``) is an ordinary file: listed, deleted."""
    c = _ckpts(tmp_path, keep=1)
    c.save(10, {"shards/.metadata": b"m", "shards/0.pt": b"0"}, now=0)
    leftover = tmp_path / "c" / "ckpt-000000000020" / ".airflow-spot-tmp.model.pt.1.abcd1234"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half")
    old_style = tmp_path / "c" / "ckpt-000000000020" / ".w.tmp-77"  # before unique names
    old_style.write_bytes(b"half")
    assert c.load(c.latest_valid()) == {"shards/.metadata": b"m", "shards/0.pt": b"0"}
    assert c.store.list() == [
        "ckpt-000000000010/MANIFEST.json",
        "ckpt-000000000010/shards/.metadata",
        "ckpt-000000000010/shards/0.pt",
    ]
    c.save(30, {"w": b"3"}, now=1)
    c.save(40, {"w": b"4"}, now=2)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["ckpt-000000000040"]


def test_resume_to_leaves_the_folder_as_it_was_when_nothing_loads(tmp_path: Path) -> None:
    """A torn newest checkpoint and no older one: ``resume_to`` returns (0, None) and the
    user's own files in the folder are untouched (they could be the only copy)."""
    c = _ckpts(tmp_path)
    c.save(10, {"model.pt": b"ckpt", "opt.pt": b"o"}, now=0)
    (tmp_path / "c" / "ckpt-000000000010" / "opt.pt").unlink()
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "model.pt").write_bytes(b"my own")
    assert TrainingSession(str(tmp_path / "c"), total_steps=20).resume_to(mine) == (0, None)
    assert sorted(p.name for p in mine.iterdir()) == ["model.pt"]
    assert (mine / "model.pt").read_bytes() == b"my own"


@pytest.mark.parametrize("value", ["model.pt", 3, None])
def test_a_checkpoint_file_that_is_neither_bytes_nor_a_path_is_refused(
    tmp_path: Path, value
) -> None:
    """A str is not taken for a path (it could be meant as text): the error says what is."""
    with pytest.raises(CheckpointError, match="bytes or a pathlib.Path"):
        _ckpts(tmp_path).save(1, {"w": value}, now=0)
    with pytest.raises(CheckpointError, match="missing does not exist"):
        _ckpts(tmp_path).save(1, {"w": tmp_path / "missing"}, now=0)
    with pytest.raises(CheckpointError, match="is not a file"):
        _ckpts(tmp_path).save(1, {"w": tmp_path}, now=0)
    assert _ckpts(tmp_path).manifests() == []


def test_the_example_resumed_through_files_after_sigterm_ends_identical(tmp_path: Path) -> None:
    """The example trainer checkpointing through local files, stopped by SIGTERM and run
    again, ends with the same final checkpoint as an uninterrupted in-memory run."""
    from airflow_spot.testing import train_command

    base = train_command(300, save_every=50, seed=4)
    files_run = base + ["--checkpoint-uri", str(tmp_path / "f"), "--via-files", str(tmp_path / "w")]
    proc = subprocess.Popen(files_run + ["--step-seconds", "0.01"], stderr=subprocess.PIPE)
    until = time.time() + 30
    while not list((tmp_path / "f").glob("ckpt-*/MANIFEST.json")) and time.time() < until:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    stopped = Checkpoints(LocalStore(tmp_path / "f")).latest_valid()
    assert 0 < stopped.step < 300
    subprocess.run(files_run, check=True, capture_output=True)
    subprocess.run(
        base + ["--checkpoint-uri", str(tmp_path / "m")], check=True, capture_output=True
    )
    a, b = (Checkpoints(LocalStore(tmp_path / d)) for d in ("f", "m"))
    assert a.latest_valid().step == b.latest_valid().step == 300
    assert a.load(a.latest_valid()) == b.load(b.latest_valid())


def test_progress_is_dated_at_the_step_end_not_after_the_save(tmp_path: Path, monkeypatch) -> None:
    """The operator measures seconds per step from the progress reports' dates. A report
    dated after a slow save on a preemption notice made a PyTorch job's rate look 2.5x slower
    (1519 s a step) and failed it as infeasible; the date is now the step's end."""
    now = [1000.0]
    notice = tmp_path / "NOTICE"
    s = TrainingSession(
        str(tmp_path / "c"),
        total_steps=100,
        save_every=50,
        notice_file=str(notice),
        progress_file=str(tmp_path / "p.json"),
        clock=lambda: now[0],
    )
    save = s.checkpoints.save

    def slow_save(*args, **kwargs):
        now[0] += 300.0  # a big model takes 5 min to upload
        return save(*args, **kwargs)

    monkeypatch.setattr(s.checkpoints, "save", slow_save)
    s.step_done(1, lambda: {"w": b"1"})
    now[0] += 10.0
    notice.write_text("{}")
    with pytest.raises(SystemExit):
        s.step_done(2, lambda: {"w": b"2"})
    doc = json.loads((tmp_path / "p.json").read_text())
    assert (doc["step"], doc["checkpoint_step"], doc["time"]) == (2, 2, 1010.0)
    # on Kubernetes progress is read from the manifests: dated the same way
    assert s.checkpoints.latest_manifest().created == 1010.0


def test_resume_into_a_folder_that_cannot_be_written_stops_the_trainer(tmp_path: Path) -> None:
    """A resume folder under a file (or read-only) is a configuration error: the trainer stops
    with exit 78 (the operator fails the task at once) instead of skipping every checkpoint
    as unloadable and training again from step 0."""
    c = _ckpts(tmp_path)
    c.save(10, {"model.pt": b"m"}, now=0)
    (tmp_path / "file").write_bytes(b"")
    session = TrainingSession(str(tmp_path / "c"), total_steps=20)
    with pytest.raises(SystemExit) as e:
        session.resume_to(tmp_path / "file" / "resume")
    assert e.value.code == 78
    with pytest.raises(ConfigError, match="resume_to: cannot write into"):
        c.load_latest_to(tmp_path / "file" / "resume")


def test_resume_to_clears_the_staging_a_killed_resume_left_and_list_skips_nfs_files(
    tmp_path: Path,
) -> None:
    """A resume killed mid-download leaves its staging folder in the (fixed) resume folder;
    the next resume deletes it rather than keep GBs of stale downloads. NFS's ``.nfsXXXX``
    stand-ins for deleted files still open are not checkpoint files (deleting one fails while
    it is busy)."""
    c = _ckpts(tmp_path)
    c.save(10, {"model.pt": b"m"}, now=0)
    stale = tmp_path / "r" / ".airflow-spot-resume.abcd1234"
    stale.mkdir(parents=True)
    (stale / "model.pt").write_bytes(b"half")
    step, files = TrainingSession(str(tmp_path / "c"), total_steps=20).resume_to(tmp_path / "r")
    assert step == 10 and sorted(p.name for p in (tmp_path / "r").iterdir()) == ["model.pt"]
    (tmp_path / "c" / "ckpt-000000000010" / ".nfs000000001234").write_bytes(b"busy")
    assert c.store.list("ckpt-000000000010/") == [
        "ckpt-000000000010/MANIFEST.json",
        "ckpt-000000000010/model.pt",
    ]
