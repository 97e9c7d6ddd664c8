"""The in-memory checkpoint store behaves as the local store does: the Store contract (keys,
missing keys, the exclusive create, tags, files), and Checkpoints' save, find, verify,
retention, claim and resume on it. Each test runs on both stores, through the store's own
interface only (a torn or corrupt checkpoint is made with ``put``/``delete``)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_spot.checkpoint import Checkpoints, LocalStore, Store
from airflow_spot.checkpoint.find import find_checkpoint
from airflow_spot.exceptions import CheckpointError
from airflow_spot.testing import MemoryStore

STORES: dict[str, Callable[[Path], Store]] = {
    "local": lambda tmp_path: LocalStore(tmp_path / "c"),
    "memory": lambda tmp_path: MemoryStore(),
}


@pytest.fixture(params=sorted(STORES))
def store(request, tmp_path: Path) -> Store:
    return STORES[request.param](tmp_path)


# -- the Store contract ------------------------------------------------------------------------


def test_put_get_list_delete(store: Store) -> None:
    """Keys come back with their bytes, listed sorted under a prefix; a delete of a key that
    is not there is no error."""
    store.put("b/x", b"1")
    store.put("a/y", b"22")
    store.put("a/z/w", b"333")
    assert store.get("a/y") == b"22"
    assert store.list() == ["a/y", "a/z/w", "b/x"]
    assert store.list("a/") == ["a/y", "a/z/w"]
    store.delete("a/y")
    store.delete("a/nothing")
    assert store.list("a") == ["a/z/w"]


def test_a_missing_key_is_a_checkpoint_error_naming_it(store: Store, tmp_path: Path) -> None:
    """Reading a key that does not exist, in any way, names it in a CheckpointError."""
    for read in (
        lambda: store.get("ckpt-1/w"),
        lambda: store.stat("ckpt-1/w"),
        lambda: store.digest("ckpt-1/w"),
        lambda: store.get_file("ckpt-1/w", tmp_path / "out"),
    ):
        with pytest.raises(CheckpointError, match=r"/ckpt-1/w does not exist"):
            read()


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "a/../../b", "", "a//b", "a b"])
def test_unsafe_keys_are_refused(store: Store, key: str) -> None:
    """A key with '..', an absolute path, an empty part or odd characters is refused."""
    for op in (
        lambda: store.put(key, b"x"),
        lambda: store.create(key, b"x"),
        lambda: store.get(key),
        lambda: store.delete(key),
    ):
        with pytest.raises(CheckpointError, match="unsafe checkpoint key"):
            op()


def test_create_writes_only_a_key_that_does_not_exist(store: Store) -> None:
    """The first create writes; a second one returns False and leaves the first bytes."""
    assert store.create("job-owner.json", b"first") is True
    assert store.create("job-owner.json", b"second") is False
    assert store.get("job-owner.json") == b"first"


def test_stat_digest_and_files(store: Store, tmp_path: Path) -> None:
    """``stat`` gives the size and a tag that changes when the key is written again;
    ``digest`` the sha256; files go in and come out whole, into folders made on the way."""
    store.put("k", b"abc")
    size, tag = store.stat("k")
    assert size == 3 and store.stat("k") == (3, tag)
    store.put("k", b"abd")
    assert store.stat("k")[1] != tag
    assert store.digest("k") == (hashlib.sha256(b"abd").hexdigest(), 3)
    src = tmp_path / "model.pt"
    src.write_bytes(bytes(range(256)) * 8)
    store.put_file("ckpt-1/model.pt", src)
    store.get_file("ckpt-1/model.pt", tmp_path / "out" / "deep" / "model.pt")
    assert (tmp_path / "out" / "deep" / "model.pt").read_bytes() == src.read_bytes()
    assert sorted(p.name for p in (tmp_path / "out" / "deep").iterdir()) == ["model.pt"]


# -- Checkpoints on the store ------------------------------------------------------------------


def test_save_find_verify_and_load(store: Store) -> None:
    """A saved checkpoint is found (newest valid, and by a step bound), verifies, and loads
    with its exact bytes, step, total and metrics."""
    c = Checkpoints(store, keep=3)
    c.save(10, {"w.npy": b"abc", "opt/state.json": b"{}"}, now=1.0, total_steps=100)
    c.save(20, {"w.npy": b"abd", "opt/state.json": b"{}"}, now=2.0, metrics={"loss": 0.5})
    m = c.latest_valid()
    assert (m.step, m.metrics, m.created) == (20, {"loss": 0.5}, 2.0)
    assert c.load(m) == {"w.npy": b"abd", "opt/state.json": b"{}"}
    assert c.verify("ckpt-000000000010").step == 10
    found = find_checkpoint("mem://x", min_step=20, newer_than=None, store=store)
    assert found is not None and found["name"] == "ckpt-000000000020"
    assert find_checkpoint("mem://x", min_step=30, newer_than=None, store=store) is None


def test_torn_and_corrupt_checkpoints_are_skipped(store: Store, caplog) -> None:
    """Data without a manifest is invisible; a corrupt file, an unreadable manifest and a
    missing file each make a checkpoint invalid: verify refuses it, and the newest valid one
    before it is returned, with a warning."""
    c = Checkpoints(store, keep=5)
    for step in (10, 20, 30, 40):
        c.save(step, {"w": str(step).encode()}, now=step)
    store.put("ckpt-000000000050/w", b"half")  # a save cut short before its manifest
    store.put("ckpt-000000000040/w", b"bad!")
    store.put("ckpt-000000000030/MANIFEST.json", b'{"step": 30, "fil')
    store.delete("ckpt-000000000020/w")
    with pytest.raises(CheckpointError, match="differs from the manifest"):
        c.verify("ckpt-000000000040")
    with caplog.at_level(logging.WARNING):
        assert c.latest_valid().step == 10
    assert "Skipping checkpoint ckpt-000000000040" in caplog.text
    assert c.manifests()[0] == "ckpt-000000000040"


def test_retention_keeps_the_last_valid_ones(store: Store) -> None:
    """Only the newest ``keep`` valid checkpoints remain, data included; a corrupt newer one
    (training resumed from an older one) is deleted at the next save, not counted."""
    c = Checkpoints(store, keep=2)
    for step in (5, 10, 15, 20):
        c.save(step, {"w": str(step).encode()}, now=step)
    assert c.manifests() == ["ckpt-000000000020", "ckpt-000000000015"]
    assert {k.split("/")[0] for k in store.list()} == {"ckpt-000000000015", "ckpt-000000000020"}
    store.put("ckpt-000000000020/w", b"xx")
    resumed = Checkpoints(store, keep=2)
    assert resumed.latest_valid().step == 15
    resumed.save(16, {"w": b"16"}, now=21)
    assert resumed.manifests() == ["ckpt-000000000016", "ckpt-000000000015"]


def test_resume_loads_the_newest_whole_checkpoint_into_a_folder(
    store: Store, tmp_path: Path
) -> None:
    """Resuming downloads the newest checkpoint that loads whole (a corrupt newer one is
    skipped) into a folder, and in memory."""
    c = Checkpoints(store)
    c.save(10, {"model.pt": b"m10", "meta/step.json": b"10"}, now=1)
    c.save(20, {"model.pt": b"m20", "meta/step.json": b"20"}, now=2)
    store.put("ckpt-000000000020/model.pt", b"M20")  # same size, other bytes
    m, files = Checkpoints(store).load_latest_to(tmp_path / "in")
    assert m.step == 10
    assert {n: p.read_bytes() for n, p in files.items()} == {
        "model.pt": b"m10",
        "meta/step.json": b"10",
    }
    assert Checkpoints(store).load_latest()[1] == {"model.pt": b"m10", "meta/step.json": b"10"}


def test_a_watcher_checks_a_big_file_by_its_tag(store: Store) -> None:
    """A watcher (``hash_up_to``) trusts a big file whose size and tag are as saved, and
    hashes it once the tag moved (the file written again)."""
    c = Checkpoints(store)
    c.save(1, {"big": b"a" * 100}, now=0)
    watcher = Checkpoints(store, hash_up_to=10)
    assert watcher.latest_valid().step == 1
    store.put("ckpt-000000000001/big", b"b" * 100)
    assert watcher.latest_valid() is None


def test_a_claim_is_one_exclusive_write(store: Store) -> None:
    """The first claim records its owner; later ones see it and change nothing; the record is
    no checkpoint."""
    c = Checkpoints(store)
    assert c.claim({"run_id": "a", "map_index": 0}) is None
    assert c.claim({"run_id": "a", "map_index": 1}) == {"run_id": "a", "map_index": 0}
    c.set_owner({"run_id": "b", "map_index": -1})
    assert c.owner() == {"run_id": "b", "map_index": -1}
    assert json.loads(store.get("job-owner.json")) == {"map_index": -1, "run_id": "b"}
    assert c.manifests() == []


def test_of_many_threads_claiming_at_once_exactly_one_wins(store: Store) -> None:
    """Threads claiming one location together: one records itself, every other sees it."""
    start = threading.Barrier(8)
    got: dict[int, dict | None] = {}

    def claim(i: int) -> None:
        start.wait()
        got[i] = Checkpoints(store).claim({"map_index": i})

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, prev in got.items() if prev is None]
    assert len(winners) == 1
    assert all(prev == {"map_index": winners[0]} for prev in got.values() if prev is not None)


def test_reads_while_a_writer_saves_and_retention_deletes(store: Store) -> None:
    """Readers look while a writer saves and retention deletes: a read never fails, and finds
    a whole checkpoint or none (one deleted between its listing and its read is skipped)."""
    writer = Checkpoints(store, keep=1)
    writer.save(0, {"w": b"0" * 1000}, now=0)
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            found = Checkpoints(store).load_latest()
            if found is not None and found[1]["w"] != str(found[0].step).encode() * 1000:
                bad.append(found[0].name)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for step in range(1, 30):
            writer.save(step, {"w": str(step).encode() * 1000}, now=step)
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert bad == []
    assert Checkpoints(store).latest_valid().step == 29
