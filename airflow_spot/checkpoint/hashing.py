"""How checkpoint files are hashed: XXH3-128 for new manifests where the ``xxhash`` package
is installed (24 GB/s on one core here), else BLAKE3 where ``blake3`` is (4-5 GB/s), else
sha256 (hashlib, 1 GB/s).

The manifest's digest is there to catch a torn, truncated or corrupted file (a write cut
short, a flipped byte, an object written again), never to authenticate: whoever can rewrite
a file can rewrite the manifest beside it. For that a 128-bit non-cryptographic hash of
XXH3's quality (it passes SMHasher; an accidental change goes unseen with odds of 2^-128) is
as good as a cryptographic one, at a fifth of BLAKE3's CPU: what a resume from S3 spends
beyond the download itself on a node whose cores are busy (issue 38).

Each manifest entry names its algorithm (``{"xxh3_128": ..., "size": ...}``, ``{"blake3":
...}`` or, as every manifest before BLAKE3, ``{"sha256": ...}``), so old manifests read and
verify as they always did. ``$AIRFLOW_SPOT_CHECKPOINT_HASH=blake3`` (or ``sha256``) makes new
manifests so: for readers whose version or environment lacks the newer hash (an older
airflow-spot, or no ``xxhash`` package). A reader that meets a manifest whose hash it cannot
compute says so and how to fix it (a ConfigError), instead of taking the checkpoint for
corrupt.

No Airflow import; ``xxhash`` and ``blake3`` are imported on first use.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from typing import Any, Protocol

from airflow_spot.exceptions import ConfigError

HASH_ENV = "AIRFLOW_SPOT_CHECKPOINT_HASH"
SHA256 = "sha256"
BLAKE3 = "blake3"
XXH3 = "xxh3_128"
ALGORITHMS = (XXH3, BLAKE3, SHA256)  # what a manifest entry may name, preferred first
# the package each hash needs, and the extra that installs it
PACKAGES = {XXH3: ("xxhash", "xxhash>=3.0"), BLAKE3: ("blake3", "blake3>=1.0")}
CHUNK = 1 << 20  # bytes read at a time: fits the CPU cache, so hash and write read it there


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def hexdigest(self) -> str: ...


def _imported(package: str) -> Any | None:
    try:
        return importlib.import_module(package)
    except ImportError:
        return None


def _blake3_module() -> Any | None:
    return _imported("blake3")


def _xxhash_module() -> Any | None:
    return _imported("xxhash")


def _module(algo: str) -> Any | None:
    return _xxhash_module() if algo == XXH3 else _blake3_module()


def available(algo: str) -> bool:
    """Whether this environment can compute ``algo``."""
    return algo == SHA256 or (algo in PACKAGES and _module(algo) is not None)


def new_hasher(algo: str) -> Hasher:
    """A fresh hash object for ``algo``; XXH3 or BLAKE3 without its package is a ConfigError
    saying what to install (the checkpoint is not corrupt: this environment cannot check it)."""
    if algo == SHA256:
        return hashlib.sha256()
    if algo in PACKAGES:
        module = _module(algo)
        if module is not None:
            h = module.xxh3_128() if algo == XXH3 else module.blake3()
            return h  # type: ignore[no-any-return]
        package, spec = PACKAGES[algo]
        older = " or ".join(ALGORITHMS[ALGORITHMS.index(algo) + 1 :])
        raise ConfigError(
            package,
            f"this checkpoint's manifest hashes its files with {algo} and the {package} package "
            f"is not installed here: pip install '{spec}' (airflow-spot[{package}]) where it is "
            f"read, or save with {HASH_ENV}={older} where it is written",
        )
    raise ConfigError(HASH_ENV, f"unknown hash {algo!r}; use one of {', '.join(ALGORITHMS)}")


def save_algorithm() -> str:
    """The hash for new manifests: ``$AIRFLOW_SPOT_CHECKPOINT_HASH`` if set, else the first of
    XXH3-128, BLAKE3 and sha256 whose package is installed."""
    chosen = os.environ.get(HASH_ENV, "").strip().lower()
    if not chosen:
        return next(a for a in ALGORITHMS if available(a))
    if chosen not in ALGORITHMS:
        raise ConfigError(
            HASH_ENV,
            f"{chosen!r} is not a checkpoint hash; use one of {', '.join(ALGORITHMS)} "
            "(or unset it)",
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
