"""A gang: N rank processes of one distributed training job under one attempt's supervisor.

    python -m airflow_spot.backends.local.gang RUN_DIR

A spec with ``nodes`` N > 1 gets :class:`GangSupervisor` (the supervisor's detaching stage
starts this module instead of :mod:`.supervisor`). Each rank runs the same command,
in a process group of its own, told ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` (127.0.0.1)
and ``MASTER_PORT`` (a free port; rank 0 hosts the rendezvous there) and a notice file of its
own (``NOTICE.rank<k>``). The replayed market gives how many nodes could be had; the gang is
up while that count reaches N (the polarized rule).

When the count drops below N, ``N - count`` ranks lose their nodes. The trace has counts, not
identities, so which ranks is drawn (seeded by ``gang_seed``, the attempt and the tick:
:func:`draw_victims`). A victim gets its notice, SIGTERM after ``notice_s`` and SIGKILL
``grace_s`` later (its node is gone). The survivors are stopped with it: SIGTERM once a
victim has ended or its node is gone, SIGKILL ``grace_s`` later.

The attempt's verdict is the gang's: the first failure's cause. A preemption first makes it
``preempted``, whatever the survivors' exits that follow (collective timeouts, connection
resets, SIGKILL); a rank that exits non-zero on healthy capacity first makes it
``app_failure`` (``checkpoint_unwritable`` for exit 73) and every other rank is stopped. The
gang succeeds when every rank exits 0. ``status.json`` carries ``world_size``,
``master_port`` and ``ranks`` (one entry a rank: pid, pgid, exit code, outcome); the verdict's
evidence repeats ``ranks`` with ``victims`` and the failing ``rank``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_spot.backends.base import Outcome, State
from airflow_spot.backends.local.supervisor import POLL_S, PRIVATE_UMASK, Supervisor
from airflow_spot.checkpoint.training import ENV, STORAGE_EXIT
from airflow_spot.exceptions import ConfigError

MASTER_ADDR = "127.0.0.1"


def check_gang(nodes: Any, gang_seed: Any) -> None:
    """``LocalBackend(nodes=..., gang_seed=...)``: whole numbers, nodes >= 1."""
    for name, v, least in (("nodes", nodes, 1), ("gang_seed", gang_seed, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ConfigError(f"backend.{name}", f"must be a whole number >= {least}, got {v!r}")


def kill_groups(raw: dict[str, Any]) -> None:
    """SIGKILL the process group a status document names (``pgid``) and each of a gang's
    ranks' (``ranks``): a cancel's last word."""
    pgids = [raw.get("pgid")] + [r.get("pgid") for r in raw.get("ranks") or ()]
    for pgid in pgids:
        if pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(int(pgid), signal.SIGKILL)


def draw_victims(world_size: int, lost: int, seed: int, attempt: int, tick: int) -> list[int]:
    """Which ``lost`` ranks of ``world_size`` lose their nodes at ``tick`` (sorted): a count
    trace says how many, not which, so it is drawn, the same for the same arguments."""
    lost = max(0, min(lost, world_size))
    return sorted(random.Random(f"{seed}:{attempt}:{tick}").sample(range(world_size), lost))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((MASTER_ADDR, 0))
        return int(s.getsockname()[1])


@dataclass
class Rank:
    """One rank process and what happened to it."""

    rank: int
    proc: subprocess.Popen
    node_taken_at: float | None = None  # its node was reclaimed (a victim)
    notice_at: float | None = None
    term_at: float | None = None
    kill_at: float | None = None  # when SIGKILL is due
    exit_code: int | None = None
    ended_at: float | None = None
    outcome: str | None = None
    waited: tuple[float, int] | None = None  # (when, exit code), set by its waiter thread

    def wait(self) -> None:
        rc = self.proc.wait()
        self.waited = (time.time(), rc)

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "state": "running" if self.alive else "ended",
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "node_taken_at": self.node_taken_at,
            "notice_at": self.notice_at,
            "ended_at": self.ended_at,
        }


class GangSupervisor(Supervisor):
    """Supervises N ranks as one attempt (see the module's docstring)."""

    def __init__(self, run_dir: Path, child_umask: int = -1) -> None:
        super().__init__(run_dir, child_umask)
        self.world_size = int(self.spec["nodes"])
        self.seed = int(self.spec.get("gang_seed") or 0)
        self.ranks: list[Rank] = []
        self.cause: tuple[Outcome, str, dict[str, Any]] | None = None  # the first failure's
        self.stop_at: float | None = None  # when stopping the survivors began
        self.doc["world_size"] = self.world_size

    # -- capacity -------------------------------------------------------------------------
    def count_now(self) -> int:
        """Nodes that could be had now (all N on on-demand)."""
        if self.market is None:
            return self.world_size
        if self.market.counts is None:  # a 0/1 trace: all or none
            return self.world_size if self.market.available_at(time.time()) else 0
        return self.market.count_at(time.time())

    def spot_up(self) -> bool:
        return self.count_now() >= self.world_size

    # -- ranks ----------------------------------------------------------------------------
    def _start_child(self) -> bool:
        port = free_port()
        for k in range(self.world_size):
            proc = self._spawn(
                {
                    "RANK": str(k),
                    "WORLD_SIZE": str(self.world_size),
                    "LOCAL_RANK": "0",  # one rank a node
                    "MASTER_ADDR": MASTER_ADDR,
                    "MASTER_PORT": str(port),
                    ENV["notice_file"]: str(self._notice_file(k)),
                }
            )
            if proc is None:  # the command cannot run: the verdict is given; stop the others
                self._kill_group(signal.SIGKILL)
                for r in self.ranks:
                    r.proc.wait()
                return False
            rank = Rank(k, proc)
            # a waiter a rank: each exit is timed when it happens, not at the next poll
            threading.Thread(target=rank.wait, daemon=True, name=f"rank-{k}").start()
            self.ranks.append(rank)
        self.child = self.ranks[0].proc  # the parent's cancel and error paths look at it
        self.publish(
            state=State.RUNNING.value,
            started_at=time.time(),
            child_pid=self.child.pid,
            pgid=self.child.pid,
            master_port=port,
            ranks=[r.to_dict() for r in self.ranks],
        )
        return True

    def _notice_file(self, rank: int) -> Path:
        return self.notice_path.with_name(f"{self.notice_path.name}.rank{rank}")

    def _kill_group(self, sig: int) -> None:
        for r in self.ranks:
            if r.alive:
                r.signal(sig)

    def _stop_child(self, grace_s: float) -> None:
        self._kill_group(signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and self._reap(time.time()):
            time.sleep(POLL_S)
        self._kill_group(signal.SIGKILL)
        for r in self.ranks:
            r.proc.wait()
            r.waited = r.waited or (time.time(), r.proc.returncode)
        self._reap(time.time())

    def _reap(self, now: float) -> bool:
        """Record the ranks that exited, in the order they exited; whether any still runs.
        The order matters: a crashed rank's peers fail in their collective a moment later,
        often within one poll, and the first exit is the failure's cause."""
        exits = sorted((r.waited, r.rank) for r in self.ranks if r.alive and r.waited)
        for (when, rc), k in exits:
            r = self.ranks[k]
            r.ended_at, r.exit_code = when, rc
            r.signal(signal.SIGKILL)  # leftovers of its group
            # a rank that ends on our own cancel's SIGTERM was stopped, not failed
            if r.exit_code != 0 and self.cause is None and not self.cancel_requested:
                self.cause = self._failed(r)
                self.stop_at = now
        return any(r.alive for r in self.ranks)

    def _failed(self, r: Rank) -> tuple[Outcome, str, dict[str, Any]]:
        """The verdict when rank ``r`` is the gang's first failure (healthy capacity)."""
        r.outcome = "failed"
        if r.exit_code == STORAGE_EXIT:
            return Outcome.CHECKPOINT_UNWRITABLE, self._unwritable_reason(), {"rank": r.rank}
        how = "was killed" if r.exit_code in (-signal.SIGKILL, 137) else "exited"
        why = f"rank {r.rank} of {self.world_size} {how} (exit {r.exit_code}) on healthy capacity"
        return Outcome.APP_FAILURE, f"{why}; every other rank stopped", {"rank": r.rank}

    # -- life -----------------------------------------------------------------------------
    def _watch(self) -> None:
        last_beat = 0.0
        while True:
            now = time.time()
            if not self._reap(now):
                self._gang_verdict()
                return
            if self._cancelled():
                return
            if self.cause is None:
                self._look_for_trouble(now)
            self._stop_due(now)
            if now - last_beat > 0.5:
                self.publish(ranks=[r.to_dict() for r in self.ranks])
                last_beat = now
            time.sleep(POLL_S)

    def _look_for_trouble(self, now: float) -> None:
        """A lease run out stops every rank as a reclaim would; a count below N takes the
        nodes of ``N - count`` drawn ranks."""
        if self.lease_over():
            self.lease_expired_at = now
            self._say("lease expired: no operator or trigger renewed it; stopping the gang")
            self.cause = (Outcome.INFRA_DISRUPTION, "lease expired; the gang checkpointed", {})
            self._take(self.ranks, now, "lease expired", "stopped")
            self.publish(state=State.PREEMPTING.value, notice_at=now, lease_expired_at=now)
            return
        count = self.count_now()
        if count >= self.world_size:
            return
        tick = self.market.tick_at(now) if self.market else None
        lost = draw_victims(
            self.world_size,
            self.world_size - count,
            self.seed,
            int(self.spec["attempt"]),
            tick or 0,
        )
        victims = [self.ranks[k] for k in lost]
        reason = (
            f"spot capacity reclaimed: {count} of {self.world_size} nodes left (ranks {lost} "
            "preempted); every rank stopped"
        )
        self._say(reason)
        self.cause = (Outcome.PREEMPTED, reason, {"victims": lost, "market_tick": tick})
        self._take(victims, now, "spot capacity reclaimed")
        self.publish(state=State.PREEMPTING.value, notice_at=now, market_tick=tick)

    def _take(self, victims: list[Rank], now: float, why: str, outcome: str = "preempted") -> None:
        """The victims' nodes go: notice now, SIGTERM after notice_s, SIGKILL grace_s later."""
        notice_s = float(self.spec.get("notice_s", 0.0))
        grace_s = float(self.spec.get("grace_s", 2.0))
        for r in victims:
            r.node_taken_at = r.notice_at = now
            r.outcome = outcome
            r.kill_at = now + notice_s + grace_s
            with contextlib.suppress(OSError):
                self._notice_file(r.rank).write_text(json.dumps({"reason": why, "at": now}))
        if victims:
            self.notice_path.write_text(json.dumps({"reason": why, "at": now}))

    def _stop_due(self, now: float) -> None:
        """Send the signals that are due: the victims' on their schedule; the survivors'
        SIGTERM once the gang is broken (a victim ended or its node is gone, or a rank failed),
        SIGKILL ``grace_s`` later."""
        if self.cause is None:
            return
        notice_s = float(self.spec.get("notice_s", 0.0))
        grace_s = float(self.spec.get("grace_s", 2.0))
        victims = [r for r in self.ranks if r.node_taken_at is not None]
        broken = not victims or any(
            not r.alive or (r.kill_at is not None and now >= r.kill_at) for r in victims
        )
        for r in self.ranks:
            if not r.alive:
                continue
            if r.node_taken_at is not None:
                if r.term_at is None and now >= r.node_taken_at + notice_s:
                    r.term_at = now
                    r.signal(signal.SIGTERM)
                if r.kill_at is not None and now >= r.kill_at:
                    r.signal(signal.SIGKILL)
            elif broken:
                if r.term_at is None:
                    r.term_at, r.kill_at = now, now + grace_s
                    r.signal(signal.SIGTERM)
                elif r.kill_at is not None and now >= r.kill_at:
                    r.signal(signal.SIGKILL)

    def _gang_verdict(self) -> None:
        codes = [r.exit_code for r in self.ranks]
        if all(c == 0 for c in codes):  # finished, a notice or not
            self.finish(Outcome.SUCCEEDED, f"all {self.world_size} ranks exited 0", exit_code=0)
            return
        assert self.cause is not None  # a non-zero exit sets it
        outcome, reason, evidence = self.cause
        first = next((r for r in self.ranks if r.outcome == "failed"), None)
        code = first.exit_code if first is not None else next(c for c in codes if c != 0)
        self.finish(outcome, reason, exit_code=code, **evidence)

    def finish(
        self, outcome: Outcome, reason: str, exit_code: int | None = None, **evidence: Any
    ) -> None:
        for r in self.ranks:  # the others: finished, or stopped with the gang
            if r.outcome is None:
                r.outcome = "succeeded" if r.exit_code == 0 else "stopped"
        ranks = [r.to_dict() for r in self.ranks]
        self.doc["ranks"] = ranks
        super().finish(outcome, reason, exit_code, ranks=ranks, **evidence)


def main(argv: list[str]) -> int:
    """As :func:`.supervisor.main`'s second stage: the attempt's files this user's only."""
    user_umask = os.umask(PRIVATE_UMASK)
    return GangSupervisor(Path(argv[1]), user_umask).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
