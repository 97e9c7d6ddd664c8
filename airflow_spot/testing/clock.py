"""A process's wall clock put off by libfaketime, for tests and chaos runs of real
deployments whose hosts disagree on the time (a worker ten minutes ahead of the scheduler).

:func:`libfaketime` finds the library (``$AIRFLOW_SPOT_LIBFAKETIME``, else Debian's
``faketime`` package, the thread-safe variant first); :func:`skew_env` is the environment
that puts a process, and what it starts, ``offset`` off (``"+10m"``, ``"-10m"``), its
monotonic clock left alone: no host's monotonic clock is compared with another's.

Debian 12's libfaketime 0.9.10 cannot leave the monotonic clock alone for Python 3.11: its
``time.sleep`` (``clock_nanosleep`` on ``CLOCK_MONOTONIC`` with ``TIMER_ABSTIME``) fails with
EINVAL under ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (wolfcw/libfaketime#426), and with the
monotonic clock faked too, threading's waits hang by the offset. So the environment puts a
``sitecustomize`` first on ``PYTHONPATH`` (:data:`SLEEP_SHIM`) whose ``time.sleep`` waits in
``select``, which libfaketime leaves alone: a tool's bug worked around, not the deployment's.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

LIBFAKETIME_ENV = "AIRFLOW_SPOT_LIBFAKETIME"
SKEW_KEYS = ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC", "PYTHONPATH")

SLEEP_SHIM = '''"""Written by airflow_spot.testing.clock: time.sleep without clock_nanosleep(TIMER_ABSTIME),
which libfaketime 0.9.10 breaks (wolfcw/libfaketime#426); select() sleeps as long."""
import select
import time


def sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = sleep
'''


def libfaketime() -> Path | None:
    """``$AIRFLOW_SPOT_LIBFAKETIME``, else Debian's (``apt-get install -y faketime``; the
    thread-safe variant first); None where there is none."""
    if os.environ.get(LIBFAKETIME_ENV):
        found = [os.environ[LIBFAKETIME_ENV]]
    else:
        found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
        found += sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return next((Path(p) for p in found if Path(p).is_file()), None)


def sleep_shim(folder: Path) -> Path:
    """``folder``, holding the ``sitecustomize`` of :data:`SLEEP_SHIM`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SLEEP_SHIM)
    return folder


def skew_env(lib: Path, offset: str, shim: Path) -> dict[str, str]:
    """What puts a process, and what it starts, ``offset`` off (libfaketime's ``FAKETIME``:
    ``"+10m"``); ``shim`` (:func:`sleep_shim`) goes first on its ``PYTHONPATH``."""
    return {
        "LD_PRELOAD": str(lib),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": str(shim),
    }
