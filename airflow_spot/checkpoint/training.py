"""A helper for training loops: resume, save every N steps, save at once on a preemption.

::

    session = TrainingSession.from_env(total_steps=400, save_every=50)
    start, files = session.resume()            # (0, None) on a fresh start
    state = restore(files) if files else init()
    for step in range(start, total_steps):
        state = train_one_step(state, step)
        session.step_done(step + 1, lambda: serialise(state), metrics={"loss": loss})
    # step_done saves and exits with PREEMPTED_EXIT when SIGTERM or a notice arrived

A model too big to hold twice in memory goes through files: ``state`` may return paths of
local files (``{"model.pt": Path(...)}``), and ``resume_to(folder)`` downloads the newest
whole checkpoint there and returns its files' paths.

The backend tells the training process where to checkpoint and how to hear about a
preemption through environment variables (names in :data:`ENV`). A SIGTERM or the notice
file appearing makes the next ``step_done`` save immediately and exit.

A gang of N processes (data-parallel ranks; ``RANK`` and ``WORLD_SIZE`` in the environment,
as torchrun and the local backend set them) shares one location: only rank 0 writes (the
checkpoint, then its manifest, which records the world size; the progress file); every rank
reads the same checkpoint on resume. The ranks must stop at the same step, so a gang agrees on
its stop first (any rank's :meth:`TrainingSession.notice`, all-reduced) and hands the agreed
answer to ``step_done(..., stopping=...)``: see :mod:`airflow_spot.examples.train_ddp`.

A save that the location refuses (full, read-only, permission denied) stops the process with
:data:`STORAGE_EXIT`, after writing why (:data:`~.writable.REASON_FILE`) beside the progress
file: the operator then waits for the location rather than counting an application failure.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.checkpoint.stores import open_store
from airflow_spot.checkpoint.writable import REASON_FILE, LocationUnwritable
from airflow_spot.exceptions import ConfigError

log = logging.getLogger(__name__)

ENV = {
    "checkpoint_uri": "AIRFLOW_SPOT_CHECKPOINT_URI",
    "notice_file": "AIRFLOW_SPOT_NOTICE_FILE",
    "progress_file": "AIRFLOW_SPOT_PROGRESS_FILE",
    "capacity": "AIRFLOW_SPOT_CAPACITY",
    "attempt": "AIRFLOW_SPOT_ATTEMPT",
    "notice_annotations": "AIRFLOW_SPOT_NOTICE_ANNOTATIONS",  # Kubernetes: downward-API annotations file
    # Kubernetes, a make-before-break return: the annotations file to wait on (HOLD_ANNOTATION)
    "hold": "AIRFLOW_SPOT_HOLD",
}
NOTICE_ANNOTATION = "airflow-spot/preemption-notice"
HOLD_ANNOTATION = "airflow-spot/hold"  # "wait" while held, "go" once released
# the attempt's lease (wall seconds since the epoch), renewed by the operator and its trigger:
# past it nobody watches the pod, which checkpoints and stops by itself (exit PREEMPTED_EXIT)
LEASE_ANNOTATION = "airflow-spot/lease-until"
HOLD_POLL_S = 0.2
PREEMPTED_EXIT = 143  # 128 + SIGTERM: "stopped on request after saving"
CONFIG_EXIT = 78  # sysexits' EX_CONFIG: the operator fails the task at once, without retries
# sysexits' EX_CANTCREAT: the checkpoint location takes no writes (full, read-only, denied); the
# operator records it as checkpoint_unwritable (no failure budget spent) and waits for it
STORAGE_EXIT = 73
T = TypeVar("T")


def _exit_on_config_error(method):
    """A configuration error (no credentials, no such bucket) stops the training process with
    :data:`CONFIG_EXIT`, which the operator reads as "fail now": relaunching cannot fix it."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except ConfigError as e:
            log.error("Configuration error, stopping (exit %d): %s", CONFIG_EXIT, e)
            sys.exit(CONFIG_EXIT)

    return call


class TrainingSession:
    """Checkpointing and preemption handling for one training process."""

    def __init__(
        self,
        checkpoint_uri: str,
        *,
        total_steps: int,
        save_every: int = 50,
        keep: int = 3,
        notice_file: str | None = None,
        progress_file: str | None = None,
        annotations_file: str | None = None,
        hold_file: str | None = None,
        clock: Callable[[], float] = time.time,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if total_steps < 1 or save_every < 1:
            raise ValueError("total_steps and save_every must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world size {world_size}: need 0 <= rank < size")
        self.rank = rank
        self.world_size = world_size
        self.checkpoints = Checkpoints(open_store(checkpoint_uri, training=True), keep=keep)
        self.total_steps = total_steps
        self.save_every = save_every
        self.notice_file = Path(notice_file) if notice_file else None
        self.progress_file = Path(progress_file) if progress_file else None
        self.annotations_file = Path(annotations_file) if annotations_file else None
        # held (a make-before-break return): nothing is read or written until released
        self.hold_file = Path(hold_file) if hold_file else None
        self.clock = clock
        self.stop_requested = False
        self.last_saved: int | None = None
        self.save_s: float | None = None  # the longest save so far (state() and the upload)
        self.report_failed = False  # a progress report could not be written (said once)

    @classmethod
    def from_env(
        cls,
        *,
        total_steps: int,
        save_every: int = 50,
        keep: int = 3,
        checkpoint_uri: str | None = None,
    ) -> TrainingSession:
        uri = checkpoint_uri or os.environ.get(ENV["checkpoint_uri"])
        if not uri:
            log.error(
                "no checkpoint location: set %s or pass checkpoint_uri", ENV["checkpoint_uri"]
            )
            sys.exit(CONFIG_EXIT)
        session = cls(
            uri,
            total_steps=total_steps,
            save_every=save_every,
            keep=keep,
            notice_file=os.environ.get(ENV["notice_file"]),
            progress_file=os.environ.get(ENV["progress_file"]),
            annotations_file=os.environ.get(ENV["notice_annotations"]),
            hold_file=os.environ.get(ENV["hold"]),
            rank=_env_int("RANK", 0),
            world_size=_env_int("WORLD_SIZE", 1),
        )
        session.install_signal_handler()
        return session

    def install_signal_handler(self) -> None:
        def on_term(signum, frame):  # noqa: ARG001
            log.warning("SIGTERM: saving a checkpoint at the end of this step, then exiting.")
            self.stop_requested = True

        signal.signal(signal.SIGTERM, on_term)

    def wait_for_release(self) -> None:
        """A held attempt (a make-before-break return: ``AIRFLOW_SPOT_HOLD`` names the pod's
        annotations file) waits, reading and writing nothing, until the file shows
        ``airflow-spot/hold="go"``: the attempt it replaces has checkpointed and stopped. A
        SIGTERM meanwhile exits as a preempted attempt does (:data:`PREEMPTED_EXIT`), saving
        nothing. Called by :meth:`resume`, :meth:`resume_to` and :meth:`step_done`."""
        if self.hold_file is None:
            return
        log.info("Held (make-before-break): waiting for %s to be released.", HOLD_ANNOTATION)
        while _annotation(self.hold_file, HOLD_ANNOTATION) != "go":
            if self.lease_expired():  # held, and nobody watches: nothing to save yet
                sys.exit(PREEMPTED_EXIT)
            if self.stop_requested:
                log.warning("SIGTERM while held: exiting with %d, nothing saved.", PREEMPTED_EXIT)
                sys.exit(PREEMPTED_EXIT)
            time.sleep(HOLD_POLL_S)
        log.info("Released: resuming from the newest checkpoint.")
        self.hold_file = None

    @_exit_on_config_error
    def resume(self) -> tuple[int, dict[str, bytes] | None]:
        """(step to start from, files of the latest valid checkpoint or None), in memory."""
        self.wait_for_release()
        return self._resumed(self.checkpoints.load_latest())

    @_exit_on_config_error
    def resume_to(self, directory: str | os.PathLike[str]) -> tuple[int, dict[str, Path] | None]:
        """(step to start from, local paths of the latest valid checkpoint's files or None):
        the files are downloaded into ``directory`` in chunks, for models too big to hold twice
        in memory (``torch.load(files["model.pt"])``)."""
        self.wait_for_release()
        return self._resumed(self.checkpoints.load_latest_to(directory))

    def _resumed(self, found: tuple[Manifest, T] | None) -> tuple[int, T | None]:
        if found is None:
            return 0, None
        m, files = found
        self.last_saved = m.step
        log.info("Resuming from checkpoint %s (step %d of %s).", m.name, m.step, m.total_steps)
        return m.step, files

    def notice(self) -> bool:
        """A preemption is coming (SIGTERM, the notice file, or the pod's notice annotation),
        or the pod's lease ran out: stop after saving."""
        if self.stop_requested or (self.notice_file is not None and self.notice_file.exists()):
            return True
        if self.annotations_file is None:
            return False
        return _annotation_set(self.annotations_file, NOTICE_ANNOTATION) or self.lease_expired()

    def lease_expired(self) -> bool:
        """The pod's lease annotation (Kubernetes) is in the past: nobody renews it."""
        if self.annotations_file is None:
            return False
        try:
            until = float(_annotation(self.annotations_file, LEASE_ANNOTATION) or "")
        except ValueError:
            return False
        if self.clock() <= until:
            return False
        log.warning(
            "Lease expired at %s: no operator or trigger renewed it; checkpointing and stopping.",
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until)),
        )
        return True

    @_exit_on_config_error
    def step_done(
        self,
        step: int,
        state: Callable[[], Mapping[str, bytes | os.PathLike[str]]],
        *,
        metrics: dict[str, float] | None = None,
        stopping: bool | None = None,
    ) -> Manifest | None:
        """Call after finishing ``step`` steps. Saves when due (``state()`` gives the files by
        name, as bytes or as paths of local files written for the purpose); exits after saving
        on a notice. ``stopping``: a gang's agreed answer to "stop now?" (None: this process's
        own :meth:`notice`). Only rank 0 saves; every rank exits on a stop."""
        self.wait_for_release()  # a script that never resumed (a held one must not train yet)
        # progress is dated at the step's end, before any save: the operator measures the
        # rate from these dates, and a save made on a preemption notice is no training time
        done_at = self.clock()
        if stopping is None:
            stopping = self.notice()
        saved = None
        due = stopping or step % self.save_every == 0 or step >= self.total_steps
        if due and self.rank == 0:
            try:
                saved = self.checkpoints.save(
                    step,
                    state(),
                    now=done_at,
                    total_steps=self.total_steps,
                    metrics=metrics,
                    world_size=self.world_size,
                )
            except LocationUnwritable as e:
                self._stop_unwritable(step, e)
            self.last_saved = step
            self.save_s = max(self.save_s or 0.0, self.clock() - done_at)  # the slowest
        self._report(step, metrics, done_at)
        if stopping and step < self.total_steps:
            log.warning(
                "Preemption notice: checkpoint at step %d saved%s; exiting with %d.",
                step,
                "" if self.rank == 0 else f" by rank 0 (this is rank {self.rank})",
                PREEMPTED_EXIT,
            )
            sys.exit(PREEMPTED_EXIT)
        return saved

    def _stop_unwritable(self, step: int, e: LocationUnwritable) -> None:
        """The location refused the save: say why beside the progress file (for the operator)
        and in the log, and exit with :data:`STORAGE_EXIT`. The checkpoints saved before are
        kept; relaunching at once would only meet the same full or read-only location."""
        log.error(
            "Could not save checkpoint step %d: %s. Stopping (exit %d): the location, not the "
            "training code, failed; the last checkpoint saved (step %s) is kept.",
            step,
            e,
            STORAGE_EXIT,
            self.last_saved,
        )
        if self.progress_file is not None:
            doc = {**e.to_dict(), "step": step, "checkpoint_step": self.last_saved}
            with contextlib.suppress(OSError):  # the same disk may be full: the log says it
                _write_private(self.progress_file.with_name(REASON_FILE), json.dumps(doc))
        sys.exit(STORAGE_EXIT)

    def _report(self, step: int, metrics: dict[str, float] | None, at: float) -> None:
        if self.progress_file is None or self.rank != 0:  # a gang reports once, through rank 0
            return
        doc = {
            "step": step,
            "total_steps": self.total_steps,
            "checkpoint_step": self.last_saved,
            "save_s": self.save_s,
            "time": at,
            "metrics": metrics or {},
        }
        try:
            _write_private(self.progress_file, json.dumps(doc))
        except OSError as e:  # a full disk: training goes on, and the next save says so
            if not self.report_failed:
                log.warning(
                    "Could not report progress to %s (%s); training on.", self.progress_file, e
                )
            self.report_failed = True


def _env_int(name: str, default: int) -> int:
    """A whole number from the environment (``RANK``, ``WORLD_SIZE``); a bad one is a
    configuration error (:data:`CONFIG_EXIT`): relaunching the gang cannot fix it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        log.error("%s=%r is not a whole number; stopping (exit %d)", name, raw, CONFIG_EXIT)
        sys.exit(CONFIG_EXIT)


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` whole (a temporary file renamed into place), this user's only (0600: it
    is in the attempt's private folder)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _annotation_set(path: Path, key: str) -> bool:
    """Whether a downward-API annotations file (``key="value"`` lines) sets ``key`` non-empty."""
    return bool(_annotation(path, key))


def _annotation(path: Path, key: str) -> str | None:
    """The value a downward-API annotations file (``key="value"`` lines) gives ``key`` (None:
    not there, or the file cannot be read yet)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k.strip() == key:
            return v.strip().strip('"')
    return None
