"""The embedded local backend: attempts as detached supervisor processes on this machine,
spot capacity replayed from a real trace (see :mod:`.market`, :mod:`.supervisor`)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from airflow_spot.backends.base import AttemptStatus, Outcome, State, TaskIdentity, check_pools
from airflow_spot.backends.local.files import private_dirs, write_lease, write_private
from airflow_spot.backends.local.market import MarketSpec, Pool, PoolsSpec
from airflow_spot.checkpoint.training import ENV
from airflow_spot.exceptions import BackendError, ConfigError, finite_number
from airflow_spot.jobstate import AttemptHandle

log = logging.getLogger(__name__)

DEFAULT_TRACE = "cant-be-late/us-west-2a_v100_1/3.json"
STARTUP_GRACE_S = 15.0


POLARITIES = ("available", "unavailable", None)
OBSERVE = ("cluster", "oracle")


@dataclass(frozen=True)
class LocalBackend:
    """Run attempts here, against a spot market replayed from a trace.

    :param trace: trace file for the market, or ``bundled:<name>`` for a sample shipped with the
        package (default: a bundled us-west-2a V100 window).
    :param polarity: what 1 means in a 0/1 JSON trace.
    :param time_scale: trace seconds per wall second (3600 = one trace hour per second). Every
        duration the ledger reports is in market time (wall time x ``time_scale``).
    :param offset: trace tick at which the market starts.
    :param notice_s: wall seconds between the preemption notice and SIGTERM.
    :param grace_s: wall seconds between SIGTERM and SIGKILL.
    :param work_dir: where attempt folders go (default ``$AIRFLOW_HOME/spot_runs``).
    :param pools: several spot pools (zones), each replayed from its own trace; every spot
        launch goes to the cheapest pool with capacity, and a pool that preempted the job is
        kept out for ``pool_cooldown_h`` trace hours. Empty: one market from ``trace``.
    :param observe: how the operator sees the replayed market. ``"cluster"`` (the default): as
        a cluster shows spot, only through the job's own spot attempt, its spot request and
        its probes, with make-before-break returns to spot (what a user gets on Kubernetes).
        ``"oracle"``: spot's true state at every look, break-before-make (the paper's replay).
    :param nodes: ranks of a gang (:mod:`.gang`: RANK, WORLD_SIZE, MASTER_ADDR/PORT each);
        N > 1 reads a count trace, up at count >= N; ``gang_seed`` draws which ranks it takes.
    """

    trace: str | None = None
    polarity: str | None = "unavailable"
    time_scale: float = 3600.0
    offset: int = 0
    notice_s: float = 0.3
    grace_s: float = 3.0
    work_dir: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets
    pools: tuple[Pool, ...] = ()
    pool_cooldown_h: float = 1.0
    observe: str = "cluster"
    nodes: int = 1
    gang_seed: int = 0

    kind = "local"
    runs_on_worker = True
    node_pools = ()  # replayed pools come with the market (market_spec), not as node pools

    @property
    def notice_to_kill_s(self) -> float:
        """Wall seconds between the preemption notice and SIGKILL."""
        return self.notice_s + self.grace_s

    def __post_init__(self) -> None:
        if not finite_number(self.time_scale) or self.time_scale <= 0:
            raise ConfigError(
                "backend.time_scale",
                f"must be > 0 (trace seconds per wall second), got {self.time_scale!r}",
            )
        object.__setattr__(self, "pools", check_pools(self.pools, Pool))
        for name, polarity in (("backend.polarity", self.polarity),) + tuple(
            (f"backend.pools[{p.name}].polarity", p.polarity) for p in self.pools
        ):
            if polarity not in POLARITIES:
                raise ConfigError(
                    name,
                    f"must be 'available' (1 = spot up), 'unavailable' (1 = spot down) or None "
                    f"(instance counts, timestamped CSV), got {polarity!r}",
                )
        if self.trace is not None and (not isinstance(self.trace, str) or not self.trace.strip()):
            raise ConfigError(
                "backend.trace",
                f"must be a trace file path or 'bundled:<name>', got {self.trace!r}",
            )
        for name in ("notice_s", "grace_s", "pool_cooldown_h"):
            v = getattr(self, name)
            if not finite_number(v) or v < 0:
                raise ConfigError(f"backend.{name}", f"must be a number >= 0, got {v!r}")
        _check_extra_env(self.extra_env)
        if self.observe not in OBSERVE:
            raise ConfigError(
                "backend.observe",
                f"must be 'cluster' (spot seen as a cluster shows it) or 'oracle' (the paper's "
                f"replay: spot's true state at every look), got {self.observe!r}",
            )
        if not isinstance(self.offset, int) or isinstance(self.offset, bool) or self.offset < 0:
            raise ConfigError("backend.offset", f"must be a tick index >= 0, got {self.offset!r}")
        from airflow_spot.backends.local.gang import check_gang  # it imports the supervisor

        check_gang(self.nodes, self.gang_seed)

    # -- configuration ----------------------------------------------------------------------
    def trace_path(self) -> str:
        """The market's trace file; ``bundled:<name>`` names a sample shipped with the package."""
        return self._resolve(self.trace or f"bundled:{DEFAULT_TRACE}")

    def market_spec(self, epoch: float) -> MarketSpec | PoolsSpec:
        if self.pools:
            return PoolsSpec(
                tuple(
                    (
                        p.name,
                        MarketSpec(
                            self._resolve(p.trace),
                            p.polarity,
                            None,
                            self.time_scale,
                            epoch,
                            self.offset,
                            p.spot_price,
                        ),
                    )
                    for p in self.pools
                ),
                self.pool_cooldown_h * 3600.0 / self.time_scale,
                tuple(p.price_from for p in self.pools),
            )
        gang = self.nodes if self.nodes > 1 else None  # a gang reads the trace's counts
        return MarketSpec(
            self.trace_path(), self.polarity, gang, self.time_scale, epoch, self.offset
        )

    @staticmethod
    def _resolve(name: str) -> str:
        from airflow_spot.bundled import resolve

        return resolve(name)

    def root(self) -> Path:
        if self.work_dir:
            return Path(self.work_dir)
        return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "spot_runs"

    @property
    def spot_cooldown_s(self) -> float:
        """Wall seconds a replayed pool is kept out after it preempted the job."""
        return self.pool_cooldown_h * 3600.0 / self.time_scale

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LocalBackend:
        """The backend from :meth:`to_dict` (its pools travel with the market, not here)."""
        known = (
            "trace",
            "polarity",
            "time_scale",
            "offset",
            "notice_s",
            "grace_s",
            "work_dir",
            "observe",
            "nodes",
            "gang_seed",
        )
        return cls(**{k: d[k] for k in known if k in d})

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "trace": self.trace,
            "polarity": self.polarity,
            "time_scale": self.time_scale,
            "offset": self.offset,
            "notice_s": self.notice_s,
            "grace_s": self.grace_s,
            "work_dir": self.work_dir,
            "observe": self.observe,
            "nodes": self.nodes,
            "gang_seed": self.gang_seed,
        }

    # -- attempts ---------------------------------------------------------------------------
    def launch(
        self,
        ident: TaskIdentity,
        attempt: int,
        capacity: str,
        command: list[str],
        *,
        checkpoint_uri: str,
        changeover_wall_s: float,
        market: MarketSpec,
        env: dict[str, str] | None = None,
        pool: str = "",  # noqa: ARG002 - the market given is already the chosen pool's
        hold: bool = False,
        lease_until: float | None = None,
    ) -> AttemptHandle:
        """Start attempt ``attempt`` under a detached supervisor; returns its handle.

        ``ident``: the task instance (:class:`TaskIdentity`, or its dict form).
        ``hold``: a make-before-break return: once capacity is granted and the changeover is
        paid, the attempt reports ``ready_at`` and waits for :meth:`release_hold` (the attempt
        it replaces checkpoints and stops first) before the training command starts.
        ``lease_until``: the attempt's lease (``LEASE`` in its folder, see :meth:`renew_lease`):
        past it the supervisor has the command checkpoint and stop, and ends the attempt."""
        run_dir = self._task_dir(ident) / f"attempt-{attempt:03d}"
        if (run_dir / "spec.json").exists():
            # started by a worker that died before recording it (or by a run since cleared):
            # stop it and set its folder aside, as the Kubernetes backend deletes a leftover pod
            status = self.cancel(AttemptHandle(run_dir=str(run_dir)))
            if not status.terminal:  # its supervisor still writes there: do not reuse the name
                raise BackendError(f"{run_dir} holds an attempt that could not be stopped yet")
            aside = run_dir.with_name(f"{run_dir.name}.leftover-{time.time_ns()}")
            log.warning(
                "%s already held an attempt (%s) that no task state records; stopped it and "
                "moved it to %s. At most one attempt runs at a time.",
                run_dir,
                status.outcome.value if status.outcome else "no verdict",
                aside.name,
            )
            run_dir.rename(aside)
        private_dirs(run_dir)
        spec = {
            "attempt": attempt,
            "capacity": capacity,
            "command": command,
            "changeover_wall_s": changeover_wall_s,
            "notice_s": self.notice_s,
            "grace_s": self.grace_s,
            "notice_file": str(run_dir / "NOTICE"),
            "hold_file": str(run_dir / "GO") if hold else None,
            "lease_file": str(run_dir / "LEASE") if lease_until is not None else None,
            "market": market.to_dict(),
            "nodes": self.nodes,
            "gang_seed": self.gang_seed,
            # ours only: extra_env and env may hold secrets, which never go to disk (the
            # supervisor gets them in its environment, below, and hands them on)
            "env": {
                ENV["checkpoint_uri"]: checkpoint_uri,
                ENV["notice_file"]: str(run_dir / "NOTICE"),
                ENV["progress_file"]: str(run_dir / "progress.json"),
                ENV["capacity"]: capacity,
                ENV["attempt"]: str(attempt),
            },
        }
        if lease_until is not None:
            write_lease(run_dir / "LEASE", lease_until)
        write_private(run_dir / "spec.json", json.dumps(spec, indent=1))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_spot.backends.local.supervisor",
                "--detach",
                str(run_dir),
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            env={**os.environ, **self.extra_env, **(env or {})},
        )
        return AttemptHandle(launched_at=time.time(), run_dir=str(run_dir))

    def _task_dir(self, ident: TaskIdentity) -> Path:
        task = ident
        key = "/".join(
            _safe(str(v)) for v in (task.dag_id, task.run_id, task.task_id, task.map_index)
        )
        return self.root() / key

    def find_attempts(self, ident: TaskIdentity) -> list[AttemptHandle]:
        """Every attempt of this task instance that exists (its folder has a spec), set-aside
        leftovers excluded, by attempt number: the next try adopts those no record holds."""
        out = []
        for spec in sorted(self._task_dir(ident).glob("attempt-[0-9][0-9][0-9]/spec.json")):
            try:
                doc = json.loads(spec.read_text())
            except (OSError, ValueError):
                continue
            out.append(
                AttemptHandle(
                    launched_at=spec.stat().st_mtime,
                    attempt=int(doc.get("attempt", 0)),
                    capacity=str(doc.get("capacity", "")),
                    run_dir=str(spec.parent),
                )
            )
        return out

    def renew_lease(self, handle: AttemptHandle, until: float) -> None:
        """Move the attempt's lease to wall time ``until`` (its supervisor reads ``LEASE``)."""
        run_dir = Path(str(handle.run_dir))
        if run_dir.is_dir():
            write_lease(run_dir / "LEASE", until)

    def release_hold(self, handle: AttemptHandle) -> None:
        """Let a held attempt (``launch(hold=True)``) start training: the attempt it replaces
        has checkpointed and stopped."""
        write_private(Path(str(handle.run_dir)) / "GO", str(time.time()))

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        """The attempt's status; a supervisor that died without a verdict reads as ``lost``."""
        return read_status(handle)

    def log_tail(self, handle: AttemptHandle, lines: int = 15, max_bytes: int = 64 * 1024) -> str:
        """The last ``lines`` lines of the attempt's log (reads at most ``max_bytes``)."""
        try:
            with open(Path(str(handle.run_dir)) / "attempt.log", "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - max_bytes))
                text = fh.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def carry_out(self, handle: AttemptHandle, status: AttemptStatus) -> None:
        """Nothing is ever due: the supervisor delivers notices itself."""

    def release(self, handle: AttemptHandle, outcome: str) -> None:
        """Nothing to release: the supervisor is gone once the attempt ended."""

    def progress(self, handle: AttemptHandle) -> dict[str, Any] | None:
        path = Path(str(handle.run_dir)) / "progress.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def cancel(self, handle: AttemptHandle, wait_s: float = 10.0) -> AttemptStatus:
        """Stop the attempt and everything it started; returns its final status."""
        st = read_status(handle)
        if st.terminal:
            return st
        raw = _raw(handle) or {}
        until = time.time() + STARTUP_GRACE_S
        while (
            not raw.get("supervisor_pid") and time.time() < until
        ):  # just launched: wait for it to report
            time.sleep(0.02)
            raw = _raw(handle) or {}
        sup = int(raw.get("supervisor_pid") or 0)
        ours = sup > 0 and _is_supervisor(sup, str(handle.run_dir))
        if ours:
            os.kill(sup, signal.SIGTERM)
        deadline = time.time() + wait_s
        while time.time() < deadline:
            st = read_status(handle)
            if st.terminal:
                break
            time.sleep(0.05)
        until = time.time() + 5.0
        while ours and _running(sup) and time.time() < until:
            time.sleep(0.05)  # let the supervisor exit after its verdict (its cmdline empties
            # before it has exited, so its state is what tells)
        from airflow_spot.backends.local.gang import kill_groups  # as check_gang

        kill_groups(_raw(handle) or {})  # belt and braces: nothing may survive a cancel
        return read_status(handle)


def _check_extra_env(extra: Any) -> None:
    """Names and string values; the error never shows a value (they may be secrets)."""
    if not isinstance(extra, dict):
        wrong = f"got {type(extra).__name__}"
    else:
        bad = [
            f"{k!r}: {type(v).__name__}" if isinstance(k, str) else f"a {type(k).__name__} name"
            for k, v in extra.items()
            if not (isinstance(k, str) and k and "=" not in k and isinstance(v, str))
        ]
        if not bad:
            return
        wrong = f"got {', '.join(bad)} (values not shown)"
    raise ConfigError("backend.extra_env", f'give {{"NAME": "value"}} with string values, {wrong}')


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in part)


def _raw(handle: AttemptHandle) -> dict[str, Any] | None:
    try:
        return json.loads((Path(str(handle.run_dir)) / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def _is_supervisor(pid: int, run_dir: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    mods = (b"airflow_spot.backends.local.supervisor", b"airflow_spot.backends.local.gang")
    return any(m in cmd for m in mods) and run_dir.encode() in cmd


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie or a dying task has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X", "x")


def read_status(handle: AttemptHandle) -> AttemptStatus:
    raw = _raw(handle)
    spec = json.loads((Path(str(handle.run_dir)) / "spec.json").read_text())
    if raw is None:
        age = time.time() - float(handle.launched_at or 0)
        state = State.LAUNCHING if age < STARTUP_GRACE_S else State.ENDED
        outcome = None if state is State.LAUNCHING else Outcome.INFRA_DISRUPTION
        return AttemptStatus(
            state,
            spec["capacity"],
            spec["attempt"],
            float(handle.launched_at or 0),
            outcome=outcome,
            reason="" if outcome is None else "the supervisor never started",
        )
    st = AttemptStatus.from_dict(raw)
    if not st.terminal and not _is_supervisor(raw.get("supervisor_pid", -1), str(handle.run_dir)):
        # re-read: it may have finished between the two reads
        again = AttemptStatus.from_dict(_raw(handle) or raw)
        if again.terminal:
            return again
        return replace(
            st,
            state=State.ENDED,
            outcome=Outcome.INFRA_DISRUPTION,
            ended_at=st.heartbeat or time.time(),
            reason="the attempt's supervisor is gone without a verdict (machine or process lost); never adopted",
        )
    return st
