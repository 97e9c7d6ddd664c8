"""How checkpoint files are hashed: BLAKE3 for new manifests where the ``blake3`` package is
installed (5 GB/s on one core here, against sha256's 1 GB/s), sha256 (hashlib) otherwise.

Each manifest entry names its algorithm (``{"blake3": ..., "size": ...}`` or, as every
manifest before BLAKE3, ``{"sha256": ..., "size": ...}``), so old manifests read and verify
as they always did. ``$AIRFLOW_SPOT_CHECKPOINT_HASH=sha256`` makes new manifests sha256 too:
for readers whose version or environment has no BLAKE3 (an older airflow-spot, or no
``blake3`` package). A reader that meets a BLAKE3 manifest without the package says so and
how to fix it (a ConfigError), instead of taking the checkpoint for corrupt.

No Airflow import; ``blake3`` is imported on first use.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Protocol

from airflow_spot.exceptions import ConfigError

HASH_ENV = "AIRFLOW_SPOT_CHECKPOINT_HASH"
SHA256 = "sha256"
BLAKE3 = "blake3"
ALGORITHMS = (BLAKE3, SHA256)  # what a manifest entry may name, preferred first
CHUNK = 1 << 20  # bytes read at a time: fits the CPU cache, so hash and write read it there


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def hexdigest(self) -> str: ...


def _blake3_module() -> Any | None:
    try:
        import blake3
    except ImportError:
        return None
    return blake3


def available(algo: str) -> bool:
    """Whether this environment can compute ``algo``."""
    return algo == SHA256 or (algo == BLAKE3 and _blake3_module() is not None)


def new_hasher(algo: str) -> Hasher:
    """A fresh hash object for ``algo``; BLAKE3 without its package is a ConfigError saying
    what to install (the checkpoint is not corrupt: this environment cannot check it)."""
    if algo == SHA256:
        return hashlib.sha256()
    if algo == BLAKE3:
        module = _blake3_module()
        if module is not None:
            return module.blake3()  # type: ignore[no-any-return]
        raise ConfigError(
            "blake3",
            "this checkpoint's manifest hashes its files with BLAKE3 and the blake3 package "
            "is not installed here: pip install 'blake3>=1.0' (airflow-spot[blake3]) where "
            f"it is read, or save with {HASH_ENV}=sha256 where it is written",
        )
    raise ConfigError(HASH_ENV, f"unknown hash {algo!r}; use one of {', '.join(ALGORITHMS)}")


def save_algorithm() -> str:
    """The hash for new manifests: ``$AIRFLOW_SPOT_CHECKPOINT_HASH`` if set, else BLAKE3
    where its package is installed, else sha256."""
    chosen = os.environ.get(HASH_ENV, "").strip().lower()
    if not chosen:
        return BLAKE3 if available(BLAKE3) else SHA256
    if chosen not in ALGORITHMS:
        raise ConfigError(
            HASH_ENV, f"{chosen!r} is not a checkpoint hash; use blake3 or sha256 (or unset it)"
        )
    if not available(chosen):
        new_hasher(chosen)  # raises, saying what to install
    return chosen


def digest_bytes(data: bytes, algo: str) -> str:
    h = new_hasher(algo)
    h.update(data)
    return h.hexdigest()


def file_digest(path: str | os.PathLike[str], algo: str = SHA256) -> tuple[str, int]:
    """The digest (hex) and size of a local file, read in chunks into one buffer."""
    h, n = new_hasher(algo), 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while got := fh.readinto(buf):
            h.update(view[:got])
            n += got
    return h.hexdigest(), n
