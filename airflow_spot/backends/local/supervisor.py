"""The detached supervisor of one local attempt.

    python -m airflow_spot.backends.local.supervisor RUN_DIR

Reads ``RUN_DIR/spec.json`` (a gang of N ranks, ``nodes`` > 1, goes to :mod:`.gang`), and writes ``RUN_DIR/status.json`` (atomically) as the attempt
moves ``waiting (spot down) -> launching (changeover) -> running -> ended``. It runs in a
session of its own, so it outlives the Airflow worker that started it, and starts the
training command in a process group of its own. The command's environment is the
supervisor's own (the worker's, with the backend's ``extra_env``, which the backend hands over
in the process environment only: it may hold secrets and is never written to disk), then the
spec's ``env`` (ours). Every file the supervisor writes is this user's only (umask 077).

On spot, when the replayed market takes capacity away: the notice file appears, then after
``notice_s`` the process group gets SIGTERM, then after ``grace_s`` SIGKILL. The outcome is
``preempted`` unless the command exits 0 first. A non-zero exit on healthy capacity is an
``app_failure``, except exit 73 (``STORAGE_EXIT``: the checkpoint location took no writes),
which is ``checkpoint_unwritable`` with the reason the training process wrote beside its
progress file. SIGTERM to the supervisor itself cancels: the whole group is killed and the
outcome is ``cancelled``. Nothing is left running.

The lease (``lease_file``, renewed by the operator and its trigger while they watch): once it
runs out, nobody watches the attempt (a failed try, a deleted run, a dead triggerer), so it
stops by itself: waiting or starting, at once; training, with the notice, SIGTERM and SIGKILL
of a reclaim, so that the command checkpoints first. The outcome is ``infra_disruption``
(``lease expired ...``), said in the attempt's log too; the next try resumes from that
checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_spot.backends.base import AttemptStatus, Outcome, State
from airflow_spot.backends.local.files import write_json
from airflow_spot.backends.local.market import MarketSpec, ReplayMarket
from airflow_spot.checkpoint.training import ENV, STORAGE_EXIT
from airflow_spot.checkpoint.writable import REASON_FILE, describe

# errors that say the command itself cannot run (not the host): the application's failure
COMMAND_ERRNOS = {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR}
POLL_S = 0.02
OOM_EXIT = 137
LEASE_READ_S = 0.2  # the lease file is read at most this often
PRIVATE_UMASK = 0o077  # the attempt's files: this user's only


class Supervisor:
    def __init__(self, run_dir: Path, child_umask: int = -1) -> None:
        self.run_dir = run_dir
        self.child_umask = child_umask  # -1: the supervisor's own
        self.spec = json.loads((run_dir / "spec.json").read_text())
        self.capacity = self.spec["capacity"]
        self.market = (
            ReplayMarket.load(MarketSpec.from_dict(self.spec["market"]))
            if self.capacity == "spot"
            else None
        )
        self.status_path = run_dir / "status.json"
        self.notice_path = Path(self.spec["notice_file"])
        self.child: subprocess.Popen | None = None
        self.cancel_requested = False
        self.lease_path = Path(self.spec["lease_file"]) if self.spec.get("lease_file") else None
        self._lease_until: float | None = None
        self._lease_read = 0.0
        self.lease_expired_at: float | None = None
        self.doc: dict[str, Any] = AttemptStatus(
            State.WAITING if self.capacity == "spot" else State.LAUNCHING,
            self.capacity,
            int(self.spec["attempt"]),
            launched_at=time.time(),
        ).to_dict()
        self.doc["supervisor_pid"] = os.getpid()

    # -- status ---------------------------------------------------------------------------
    def publish(self, **changes: Any) -> None:
        self.doc.update(changes)
        self.doc["heartbeat"] = time.time()
        write_json(self.status_path, self.doc)

    def finish(
        self, outcome: Outcome, reason: str, exit_code: int | None = None, **evidence: Any
    ) -> None:
        self.publish(
            state=State.ENDED.value,
            outcome=outcome.value,
            reason=reason,
            exit_code=exit_code,
            ended_at=time.time(),
            evidence=evidence,
        )

    def spot_up(self) -> bool:
        return self.market is None or self.market.available_at(time.time())

    def lease_over(self) -> bool:
        """Whether the lease ran out (read from its file at most every LEASE_READ_S; a file
        that cannot be read keeps the last lease read)."""
        if self.lease_path is None:
            return False
        now = time.time()
        if now - self._lease_read >= LEASE_READ_S:
            self._lease_read = now
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                self._lease_until = float(json.loads(self.lease_path.read_text())["until"])
        return self._lease_until is not None and now > self._lease_until

    def _say(self, text: str) -> None:
        """A line in the attempt's log (where the user reads what happened to it)."""
        with contextlib.suppress(OSError), open(self.run_dir / "attempt.log", "ab") as log:
            log.write(f"airflow-spot: {text}\n".encode())

    def _lease_gone(self, when: str) -> bool:
        """Before training: a lease run out ends the attempt (nothing to checkpoint yet)."""
        if not self.lease_over():
            return False
        why = (
            f"lease expired {when}: no operator or trigger renewed it since "
            f"{_clock(self._lease_until)}; stopped by itself (nothing trained yet)"
        )
        self._say(why)
        self.finish(Outcome.INFRA_DISRUPTION, why, lease_until=self._lease_until)
        return True

    # -- life -----------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_cancel)
        self.publish()
        try:
            if not self._wait_for_spot() or not self._changeover() or not self._hold():
                return 0
            if self._start_child():
                self._watch()
        except Exception as e:  # noqa: BLE001 - the supervisor must always leave a verdict
            self._kill_group(signal.SIGKILL)
            self.finish(Outcome.INFRA_DISRUPTION, f"supervisor error: {e!r}")
        return 0

    def _on_cancel(self, signum, frame) -> None:  # noqa: ARG002
        self.cancel_requested = True

    def _cancelled(self) -> bool:
        if not self.cancel_requested:
            return False
        self._stop_child(grace_s=float(self.spec.get("grace_s", 2.0)))
        self.finish(Outcome.CANCELLED, "cancelled by the controller")
        return True

    def _wait_for_spot(self) -> bool:
        while not self.spot_up():
            if self._cancelled() or self._lease_gone("while waiting for spot"):
                return False
            time.sleep(POLL_S)
        return True

    def _changeover(self) -> bool:
        start = time.time()
        self.publish(state=State.LAUNCHING.value, granted_at=start)
        end = start + float(self.spec.get("changeover_wall_s", 0.0))
        return self._before_training(lambda: time.time() >= end, "during start-up")

    def _hold(self) -> bool:
        """A make-before-break return: ready (capacity granted, changeover paid), wait until
        the attempt it replaces has checkpointed and stopped (the controller writes the hold
        file), then train from that checkpoint. Reclaimed meanwhile: preempted, before any
        work, and the attempt it was to replace never stopped."""
        hold = self.spec.get("hold_file")
        if not hold:
            return True
        self.publish(ready_at=time.time())
        return self._before_training(Path(hold).exists, "while ready to take over")

    def _before_training(self, over: Callable[[], bool], when: str) -> bool:
        """Wait until ``over()`` while spot holds: False when cancelled or reclaimed (a
        preemption before any work)."""
        while not over():
            if self._cancelled() or self._lease_gone(when):
                return False
            if not self.spot_up():
                tick = self.market.tick_at(time.time()) if self.market else None
                self.finish(
                    Outcome.PREEMPTED,
                    f"spot capacity reclaimed {when}",
                    market_tick=tick,
                    during="launch",
                )
                return False
            time.sleep(POLL_S)
        return True

    def _start_child(self) -> bool:
        """Start the training command; a command that cannot start is the application's
        failure (exit 127/126 as a shell gives), never the capacity's."""
        self.child = self._spawn({})
        if self.child is None:
            return False
        self.publish(
            state=State.RUNNING.value,
            started_at=time.time(),
            child_pid=self.child.pid,
            pgid=self.child.pid,
        )
        return True

    def _spawn(self, more_env: dict[str, str]) -> subprocess.Popen | None:
        """Start the command in a process group of its own, with the spec's ``env`` and then
        ``more_env`` (a gang rank's); None when it cannot start (the verdict is given)."""
        env = {**os.environ, **self.spec.get("env", {}), **more_env}
        log = open(self.run_dir / "attempt.log", "ab")  # noqa: SIM115 - lives as long as the child
        cwd = self.spec.get("cwd") or None
        try:
            return subprocess.Popen(
                self.spec["command"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=cwd,
                umask=self.child_umask,
            )
        except OSError as e:
            if e.errno not in COMMAND_ERRNOS:
                raise  # the host's trouble (fork: EAGAIN, ENOMEM): an infrastructure disruption
            prog = self.spec["command"][0]
            if cwd is not None and e.filename == cwd:
                why, code = f"working directory {cwd!r} cannot be used ({e.strerror})", 126
            elif e.errno == errno.ENOENT:
                why, code = f"command not found: {prog!r} (not on PATH or no such file)", 127
            else:
                why, code = f"command {prog!r} cannot be run ({e.strerror})", 126
            log.write(f"airflow-spot: {why}\n".encode())
            log.close()
            self.finish(Outcome.APP_FAILURE, why, exit_code=code)
            return None

    def _watch(self) -> None:
        assert self.child is not None
        notice_at = term_at = None
        last_beat = 0.0
        while True:
            rc = self.child.poll()
            if rc is not None:
                self._kill_group(signal.SIGKILL)  # leftovers of the group
                self._verdict(rc, notice_at)
                return
            now = time.time()
            if self._cancelled():
                return
            if notice_at is None and self.lease_over():
                notice_at = self.lease_expired_at = now
                self._say(
                    f"lease expired: no operator or trigger renewed it since "
                    f"{_clock(self._lease_until)}; checkpointing and stopping"
                )
                self.notice_path.write_text(json.dumps({"reason": "lease expired", "at": now}))
                self.publish(state=State.PREEMPTING.value, notice_at=now, lease_expired_at=now)
            if notice_at is None and not self.spot_up():
                notice_at = now
                self.notice_path.write_text(
                    json.dumps({"reason": "spot capacity reclaimed", "at": now})
                )
                self.publish(
                    state=State.PREEMPTING.value,
                    notice_at=now,
                    market_tick=self.market.tick_at(now) if self.market else None,
                )
            if (
                notice_at is not None
                and term_at is None
                and now >= notice_at + float(self.spec.get("notice_s", 0.0))
            ):
                term_at = now
                self._kill_group(signal.SIGTERM)
            if term_at is not None and now >= term_at + float(self.spec.get("grace_s", 2.0)):
                self._kill_group(signal.SIGKILL)
            if now - last_beat > 0.5:
                self.publish()
                last_beat = now
            time.sleep(POLL_S)

    def _verdict(self, rc: int, notice_at: float | None) -> None:
        if rc == 0 and notice_at is not None:  # the controller tells a finish from a reclaim
            self.finish(
                Outcome.SUCCEEDED,
                "the training command exited 0 after the reclaim notice",
                exit_code=0,
                notice_at=notice_at,
            )
        elif rc == 0:
            self.finish(Outcome.SUCCEEDED, "the training command exited 0", exit_code=0)
        elif self.lease_expired_at is not None:
            self.finish(
                Outcome.INFRA_DISRUPTION,
                f"lease expired: no operator or trigger renewed it since "
                f"{_clock(self._lease_until)}; checkpointed and stopped by itself",
                exit_code=rc,
                lease_until=self._lease_until,
                notice_at=notice_at,
            )
        elif notice_at is not None:
            self.finish(
                Outcome.PREEMPTED,
                "spot capacity reclaimed (notice, SIGTERM, SIGKILL after grace)",
                exit_code=rc,
                market_tick=self.doc.get("market_tick"),
                notice_at=notice_at,
            )
        elif rc == STORAGE_EXIT:
            self.finish(Outcome.CHECKPOINT_UNWRITABLE, self._unwritable_reason(), exit_code=rc)
        elif rc in (-signal.SIGKILL, OOM_EXIT):
            self.finish(
                Outcome.APP_FAILURE,
                f"the training command was killed (exit {rc}) on healthy capacity",
                exit_code=rc,
            )
        else:
            self.finish(
                Outcome.APP_FAILURE,
                f"the training command exited {rc} on healthy capacity",
                exit_code=rc,
            )

    def _unwritable_reason(self) -> str:
        """Why the training process exited STORAGE_EXIT, as it wrote beside its progress file
        (the location, the error, the free space); its log holds it otherwise."""
        progress = self.spec.get("env", {}).get(ENV["progress_file"])
        path = Path(progress).with_name(REASON_FILE) if progress else self.run_dir / REASON_FILE
        try:
            doc = json.loads(path.read_text())
            said = describe(str(doc["location"]), str(doc["error"]), doc.get("free_bytes"))
        except (OSError, ValueError, KeyError, TypeError):
            said = "the checkpoint location cannot be written (the attempt's log says why)"
        return f"{said}; the training process stopped (exit {STORAGE_EXIT})"

    def _stop_child(self, grace_s: float) -> None:
        if self.child is None or self.child.poll() is not None:
            self._kill_group(signal.SIGKILL)
            return
        self._kill_group(signal.SIGTERM)
        deadline = time.time() + grace_s
        while self.child.poll() is None and time.time() < deadline:
            time.sleep(POLL_S)
        self._kill_group(signal.SIGKILL)
        self.child.wait()

    def _kill_group(self, sig: int) -> None:
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else "?"


def supervisor_module(run_dir: Path) -> str:
    """The module that supervises the attempt in ``run_dir``: a gang's (``nodes`` > 1) is
    :mod:`.gang`."""
    nodes = json.loads((run_dir / "spec.json").read_text()).get("nodes") or 1
    return f"airflow_spot.backends.local.{'gang' if int(nodes) > 1 else 'supervisor'}"


def main(argv: list[str]) -> int:
    # what the supervisor writes in the attempt's folder is this user's only (0600); the
    # training command gets the umask it was started with (its checkpoints are the user's)
    user_umask = os.umask(PRIVATE_UMASK)
    if len(argv) == 3 and argv[1] == "--detach":
        # first stage: start the real supervisor in a new session and return at once (its
        # environment, which holds the backend's extra_env, is handed on: never written down)
        subprocess.Popen(
            [sys.executable, "-m", supervisor_module(Path(argv[2])), argv[2]],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=open(Path(argv[2]) / "supervisor.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            close_fds=True,
            umask=user_umask,
        )
        return 0
    return Supervisor(Path(argv[1]), user_umask).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
