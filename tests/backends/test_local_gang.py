"""A gang on the local backend: N real rank processes of a real data-parallel training loop
(:mod:`airflow_spot.examples.train_ddp`: JAX's multi-process CPU runtime, gloo all-gathers
over TCP) under one supervisor, against a replayed count trace. One verdict for the gang:
a preempted rank (rank 0 with the rendezvous, or a worker) makes the attempt ``preempted``
with every rank stopped; a rank's crash on healthy capacity is an ``app_failure``; a gang
resumed from its last whole checkpoint ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import jax  # noqa: F401 - the gang extra, pinned in requirements.lock: these never skip
import pytest

from airflow_spot.backends.base import Outcome, TaskIdentity
from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import _running
from airflow_spot.backends.local.gang import draw_victims
from airflow_spot.checkpoint.manifest import Manifest

IDENT = TaskIdentity("dag", "gang", "run")
TICK_S = 1.0  # wall seconds per trace tick (gap 3600 s at time_scale 3600)
TRAIN = [sys.executable, "-m", "airflow_spot.examples.train_ddp", "--save-every", "20"]
# rank 1 raises in its 30th step: a real crash of one rank while the capacity is healthy
CRASH_RANK_1 = (
    "import os, sys\n"
    "from airflow_spot.examples import train_ddp\n"
    "real = train_ddp.local_gradient\n"
    "def crash(w, x, y, seed, step, rank, n):\n"
    "    if rank == 1 and step == 30:\n"
    "        raise RuntimeError('rank 1 crashed')\n"
    "    return real(w, x, y, seed, step, rank, n)\n"
    "train_ddp.local_gradient = crash\n"
    "sys.exit(train_ddp.main(sys.argv[1:]))\n"
)


def _trace(tmp_path: Path, counts: list[int]) -> Path:
    p = tmp_path / f"counts-{len(list(tmp_path.glob('counts-*')))}.json"
    p.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": counts}))
    return p


def _backend(tmp_path: Path, counts: list[int], nodes: int, **kw) -> LocalBackend:
    return LocalBackend(
        trace=str(_trace(tmp_path, counts)),
        polarity="available",
        time_scale=3600.0 / TICK_S,
        work_dir=str(tmp_path / "runs"),
        nodes=nodes,
        **{"notice_s": 0.2, "grace_s": 1.0, **kw},
    )


def _launch(b: LocalBackend, tmp_path: Path, attempt: int, command: list[str]):
    return b.launch(
        IDENT,
        attempt,
        "spot",
        command,
        checkpoint_uri=str(tmp_path / "ckpt"),
        changeover_wall_s=0.0,
        market=b.market_spec(time.time()),
    )


def _wait(b: LocalBackend, handle, timeout: float = 60.0):
    until = time.time() + timeout
    while time.time() < until:
        st = b.status(handle)
        if st.terminal:
            return st
        time.sleep(0.05)
    b.cancel(handle)
    raise AssertionError(f"the gang did not end: {b.status(handle)}")


def _nothing_left(st) -> None:
    """Every rank ended and no rank process is still running."""
    ranks = st.evidence["ranks"]
    assert all(r["state"] == "ended" for r in ranks), ranks
    time.sleep(0.1)
    assert not [r["pid"] for r in ranks if _running(r["pid"])]


def _newest(tmp_path: Path) -> tuple[Manifest, bytes]:
    """The newest checkpoint's manifest and weights."""
    newest = sorted((tmp_path / "ckpt").glob("ckpt-*/MANIFEST.json"))[-1]
    return Manifest.from_json(newest.read_bytes()), (newest.parent / "weights.npy").read_bytes()


def _seed_losing(rank: int, tick: int = 3) -> int:
    """A gang_seed whose draw at ``tick`` (attempt 1, one node of two lost) takes ``rank``."""
    return next(s for s in range(100) if draw_victims(2, 1, s, 1, tick) == [rank])


def test_draw_of_victims_is_seeded_and_sized() -> None:
    assert draw_victims(4, 2, 7, 1, 10) == draw_victims(4, 2, 7, 1, 10)
    assert len(draw_victims(4, 2, 7, 1, 10)) == 2 and draw_victims(4, 9, 0, 1, 1) == [0, 1, 2, 3]
    assert {tuple(draw_victims(4, 1, s, 1, 1)) for s in range(40)} == {(0,), (1,), (2,), (3,)}


def test_a_gang_of_three_trains_and_succeeds(tmp_path: Path) -> None:
    """Three ranks, each told its rank, the world size and the rendezvous; rank 0 alone writes
    checkpoints, whose manifests record the world size."""
    b = _backend(tmp_path, [3] * 100, nodes=3)
    h = _launch(b, tmp_path, 1, [*TRAIN, "--steps", "60"])
    st = _wait(b, h)
    assert st.outcome is Outcome.SUCCEEDED, (st.reason, b.log_tail(h, 30))
    assert [r["outcome"] for r in st.evidence["ranks"]] == ["succeeded"] * 3
    m, _ = _newest(tmp_path)
    assert (m.step, m.world_size) == (60, 3)
    log = (Path(str(h.run_dir)) / "attempt.log").read_text()
    assert all(f"Rank {k} of 3 joined the gang" in log for k in range(3))
    _nothing_left(st)


@pytest.mark.parametrize("victim", [0, 1], ids=["rank0-with-the-rendezvous", "worker"])
def test_one_rank_preempted_stops_the_whole_gang(tmp_path: Path, victim: int) -> None:
    """The count drops from 2 to 1 at tick 3: the drawn rank's node goes at once (no notice,
    no grace: SIGKILL), and the survivor, left with a dead peer (and, when rank 0 went, no
    rendezvous), is stopped by the supervisor. The verdict is the first cause, ``preempted``,
    never the survivor's exit."""
    b = _backend(
        tmp_path, [2, 2, 2] + [1] * 100, nodes=2, gang_seed=_seed_losing(victim), notice_s=0.0,
        grace_s=0.0,
    )  # fmt: skip
    st = _wait(b, _launch(b, tmp_path, 1, [*TRAIN, "--steps", "100000", "--step-seconds", "0.02"]))
    assert st.outcome is Outcome.PREEMPTED, st.reason
    assert st.evidence["victims"] == [victim] and f"ranks [{victim}] preempted" in st.reason
    ranks = {r["rank"]: r for r in st.evidence["ranks"]}
    assert ranks[victim]["outcome"] == "preempted" and ranks[victim]["exit_code"] == -9
    assert ranks[1 - victim]["outcome"] == "stopped" and ranks[1 - victim]["exit_code"] != 0
    _nothing_left(st)


def test_a_rank_crash_on_healthy_capacity_is_an_app_failure(tmp_path: Path) -> None:
    """Rank 1 raises at step 30 while every node is up: ``app_failure`` naming rank 1, and
    rank 0 (stuck in the all-gather) stopped."""
    b = _backend(tmp_path, [2] * 100, nodes=2)
    code = [sys.executable, "-c", CRASH_RANK_1, "--steps", "200", "--save-every", "20"]
    st = _wait(b, _launch(b, tmp_path, 1, code))
    assert st.outcome is Outcome.APP_FAILURE, st.reason
    assert st.exit_code == 1 and st.evidence["rank"] == 1 and "rank 1 of 2" in st.reason
    assert {r["rank"]: r["outcome"] for r in st.evidence["ranks"]} == {0: "stopped", 1: "failed"}
    _nothing_left(st)


def test_a_resumed_gang_is_bit_identical_to_an_uninterrupted_one(tmp_path: Path) -> None:
    """Attempt 1 is preempted mid-run (the notice reaches rank 0's node, the gang agrees to
    stop, rank 0 saves before its node goes); attempt 2 resumes from that checkpoint and finishes; its weights are
    the uninterrupted gang's, bit for bit."""
    steps = [*TRAIN, "--steps", "300", "--seed", "3"]
    whole = tmp_path / "whole"
    whole.mkdir()
    b = _backend(whole, [2] * 100, nodes=2)
    assert _wait(b, _launch(b, whole, 1, steps)).outcome is Outcome.SUCCEEDED
    _, expected = _newest(whole)

    # rank 0, the one that saves, loses its node: it saves within the notice
    b = _backend(tmp_path, [2] * 6 + [1] * 100, nodes=2, gang_seed=_seed_losing(0, tick=6))
    st = _wait(b, _launch(b, tmp_path, 1, [*steps, "--step-seconds", "0.03"]))
    assert st.outcome is Outcome.PREEMPTED, st.reason
    saved, _ = _newest(tmp_path)
    assert 0 < saved.step < 300 and saved.world_size == 2
    b = _backend(tmp_path, [2] * 100, nodes=2)
    st = _wait(b, _launch(b, tmp_path, 2, steps))
    assert st.outcome is Outcome.SUCCEEDED, st.reason
    m, got = _newest(tmp_path)
    assert m.step == 300
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(expected).hexdigest()
