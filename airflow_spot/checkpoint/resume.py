"""Reading a checkpoint's files back into a local folder, each hashed as it is written there.

A resume on a new node starts from nothing: it lists the location, reads the newest
manifest, then downloads the files the manifest names. Against a plain download of known keys
that is two requests in a row before the first byte moves. :func:`load_listed_to` takes one
out: the listing already names the newest checkpoint's files, so they are downloaded while
its manifest is read, each hashed with the algorithm this version saves with, and checked
against the manifest when it comes (re-hashed from the local copy if the manifest names
another hash; fetched afterwards if the manifest names a file the listing did not show). A
file is only moved into place once every file of its checkpoint matches its manifest: what
does not load leaves the folder as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from airflow_spot.checkpoint.base import FILES_AT_ONCE, Store, each_at_once, file_digest, safe_key
from airflow_spot.checkpoint.manifest import RESUME_STAGE, Manifest
from airflow_spot.exceptions import CheckpointError, ConfigError


def fetch_hashed(store: Store, key: str, path: Path, algo: str) -> tuple[str, int]:
    """Download ``key`` to ``path``: its (digest in ``algo``, size), hashed on the way where
    the store can (else read back once)."""
    if hasattr(store, "get_file_hashed"):
        return store.get_file_hashed(key, path, algo)
    store.get_file(key, path)
    return file_digest(path, algo)


def _check(m: Manifest, fname: str, path: Path, got: tuple[str, int], algo: str) -> None:
    entry = m.files[fname]
    if entry.algo != algo and got[1] == entry.size:  # an older manifest's hash: read it again
        got = file_digest(path, entry.algo)
    if got != (entry.digest, entry.size):
        raise CheckpointError(f"{m.name}/{fname}: size or {entry.algo} differs from the manifest")


def staged_into(
    directory: str | os.PathLike[str], fetch: Callable[[Path], Manifest]
) -> tuple[Manifest, dict[str, Path]]:
    """Run ``fetch`` into a staging folder inside ``directory``; once it returns (every file
    checked), move the manifest's files into place: (the manifest, their paths by name)."""
    root = Path(directory)
    for stale in root.glob(RESUME_STAGE + "*"):  # left by a resume killed mid-download
        shutil.rmtree(stale, ignore_errors=True)
    try:
        root.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=RESUME_STAGE, dir=root))
    except OSError as e:  # not "this checkpoint is bad": no older one would load either
        raise ConfigError(
            "resume_to",
            f"cannot write into {root} ({e}); give a folder the training process can write",
        ) from e
    try:
        m = fetch(stage)
        out = {}
        for fname in m.files:
            out[fname] = root / fname
            out[fname].parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / fname, out[fname])
        return m, out
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def load_to(store: Store, m: Manifest, directory: str | os.PathLike[str]) -> dict[str, Path]:
    """The files of ``m`` downloaded into ``directory`` and checked (see :func:`staged_into`)."""

    def fetch(stage: Path) -> Manifest:
        def one(fname: str) -> None:
            path = stage / safe_key(fname)
            algo = m.files[fname].algo
            _check(m, fname, path, fetch_hashed(store, f"{m.name}/{fname}", path, algo), algo)

        each_at_once(m.files, one)
        return m

    return staged_into(directory, fetch)[1]


def load_listed_to(
    store: Store,
    name: str,
    listed: Iterable[str],
    read_manifest: Callable[[str], Manifest],
    algo: str,
    directory: str | os.PathLike[str],
) -> tuple[Manifest, dict[str, Path]]:
    """Checkpoint ``name`` into ``directory``: the files the listing showed under it
    (``listed``, the manifest left out) downloaded in ``algo`` while ``read_manifest(name)``
    runs, then each checked against it. Raises CheckpointError if any file of the manifest
    is missing or differs (the folder left as it was)."""
    files = sorted(f for f in listed if _safe(f))

    def fetch(stage: Path) -> Manifest:
        with ThreadPoolExecutor(FILES_AT_ONCE, "checkpoint-file") as pool:
            early: dict[str, Future] = {
                f: pool.submit(fetch_hashed, store, f"{name}/{f}", stage / f, algo) for f in files
            }
            try:
                m = read_manifest(name)
                if m.name != name:
                    raise CheckpointError(f"{name}: its manifest is for step {m.step}")
                for fname in m.files:  # in the manifest's order: its first bad file is the error
                    path = stage / safe_key(fname)
                    if fname in early:
                        got = early[fname].result()
                    else:  # not in the listing (written after it): fetched now
                        got = fetch_hashed(store, f"{name}/{fname}", path, algo)
                    _check(m, fname, path, got, algo)
            except BaseException:
                for f in early.values():  # the pool waits for the running ones on its way out
                    f.cancel()
                raise
        return m

    return staged_into(directory, fetch)


def _safe(fname: str) -> bool:
    try:
        safe_key(fname)
    except CheckpointError:
        return False  # never the manifest's (it could not name it): not downloaded
    return True
