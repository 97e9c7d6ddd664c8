"""The local backend with real processes and signals: waiting for spot, preemption with notice,
application failure, cancel of the whole process group."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import pytest

from airflow_spot.backends.base import Outcome, TaskIdentity
from airflow_spot.backends.local import LocalBackend, ReplayMarket
from airflow_spot.backends.local.market import Pool
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.testing import scripted_trace


def _wait(backend: LocalBackend, handle: dict, timeout: float = 30.0):
    until = time.time() + timeout
    while time.time() < until:
        st = backend.status(handle)
        if st.terminal:
            return st
        time.sleep(0.05)
    raise AssertionError(f"attempt did not end: {backend.status(handle)}")


def _backend(tmp_path: Path, pattern, scale: float = 600.0) -> tuple[LocalBackend, object]:
    trace = scripted_trace(tmp_path / "m.json", pattern)
    b = LocalBackend(
        trace=str(trace),
        polarity="available",
        time_scale=scale,
        work_dir=str(tmp_path / "runs"),
        notice_s=0.2,
        grace_s=1.0,
    )
    return b, b.market_spec(time.time())


IDENT = TaskIdentity("dag", "train", "run")
SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"]


def _launch(b: LocalBackend, market, tmp_path: Path, capacity: str, code: str) -> dict:
    """Attempt 1 of ``python -c code`` on ``capacity`` (changeover 0.1 s on spot, none on demand)."""
    return b.launch(
        IDENT,
        1,
        capacity,
        [sys.executable, "-c", code],
        checkpoint_uri=str(tmp_path / "c"),
        changeover_wall_s=0.1 if capacity == "spot" else 0.0,
        market=market,
    )


def test_spot_launch_waits_for_capacity_then_runs(tmp_path: Path) -> None:
    """A spot launch while spot is down waits (state waiting), then starts when spot returns."""
    b, market = _backend(tmp_path, [(False, 6), (True, 100)])  # down for 6 s at 600x
    h = _launch(b, market, tmp_path, "spot", "print('ok')")
    # seen waiting while spot is down (polled: a loaded machine may take a moment to start it)
    seen, until = set(), time.monotonic() + 4.0
    while "waiting" not in seen and time.monotonic() < until:
        seen.add(b.status(h).state.value)
        time.sleep(0.05)
    assert "waiting" in seen and "running" not in seen, seen
    st = _wait(b, h)
    assert st.outcome is Outcome.SUCCEEDED
    assert st.granted_at - st.launched_at > 1.0


def test_preemption_sends_notice_then_sigterm(tmp_path: Path) -> None:
    """When spot goes away the notice file appears, the process gets SIGTERM, the verdict is preempted."""
    b, market = _backend(tmp_path, [(True, 2), (False, 100)])
    code = (
        "import signal, sys, time, os\n"
        "signal.signal(signal.SIGTERM, lambda *a: (open(os.path.join(os.path.dirname(os.environ['AIRFLOW_SPOT_NOTICE_FILE']), 'term'), 'w').write(str(os.path.exists(os.environ['AIRFLOW_SPOT_NOTICE_FILE']))), sys.exit(143)))\n"
        "while True: time.sleep(0.01)"
    )
    h = _launch(b, market, tmp_path, "spot", code)
    st = _wait(b, h)
    assert st.outcome is Outcome.PREEMPTED
    assert st.exit_code == 143
    assert (Path(str(h.run_dir)) / "NOTICE").exists()


def test_sigterm_ignored_gets_sigkill_after_grace(tmp_path: Path) -> None:
    """A process that ignores SIGTERM is SIGKILLed after the grace period; still a preemption."""
    b, market = _backend(tmp_path, [(True, 2), (False, 100)])
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.01)"
    h = _launch(b, market, tmp_path, "spot", code)
    st = _wait(b, h)
    assert st.outcome is Outcome.PREEMPTED and st.exit_code == -9


def test_nonzero_exit_on_healthy_capacity_is_an_application_failure(tmp_path: Path) -> None:
    """Exit 2 on on-demand is an application failure, never a preemption."""
    b, market = _backend(tmp_path, [(False, 100)])
    h = _launch(b, market, tmp_path, "on_demand", "raise SystemExit(2)")
    st = _wait(b, h)
    assert st.outcome is Outcome.APP_FAILURE and st.exit_code == 2


def test_cancel_kills_the_whole_process_group(tmp_path: Path) -> None:
    """Cancel stops the supervisor, the command and the command's own children."""
    b, market = _backend(tmp_path, [(True, 1000)])
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.1)'])\n"
        "import os\n"
        "open(os.path.join(os.path.dirname(os.environ['AIRFLOW_SPOT_NOTICE_FILE']), 'child.pid'), 'w').write(str(p.pid))\n"
        "while True: time.sleep(0.1)"
    )
    h = _launch(b, market, tmp_path, "on_demand", code)
    h_dir = Path(str(h.run_dir))
    spec = json.loads((h_dir / "spec.json").read_text())
    assert spec["env"]["AIRFLOW_SPOT_CAPACITY"] == "on_demand"
    until = time.time() + 10
    while (
        time.time() < until
        and not (h_dir / "child.pid").exists()
        and not (h_dir / "status.json").exists()
    ):
        time.sleep(0.05)
    time.sleep(1.0)
    raw = json.loads((h_dir / "status.json").read_text())
    st = b.cancel(h)
    assert st.outcome is Outcome.CANCELLED
    assert _alive_in_group(raw["pgid"]) == []
    assert not _alive(raw["supervisor_pid"])


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"  # a zombie has exited; only its exit status is left


def _alive_in_group(pgid: int) -> list[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if (st := _stat(p)) is not None and st[0] != "Z" and int(st[2]) == pgid]


def test_market_replay_and_next_change(tmp_path: Path) -> None:
    """The replayed market answers availability by wall time and finds the next change."""
    b, _ = _backend(tmp_path, [(True, 3), (False, 2), (True, 5)], scale=600.0)
    m = ReplayMarket.load(b.market_spec(1000.0))
    assert m.available_at(1000.0) and m.available_at(1002.9)
    assert not m.available_at(1003.0) and not m.available_at(1004.9)
    assert m.available_at(1005.0)
    assert m.next_change(1000.5) == pytest.approx(1003.0)
    assert m.available_at(1000.0 + 10 * 1.0)  # wraps around


def test_a_leftover_attempt_is_stopped_and_set_aside(tmp_path: Path) -> None:
    """A worker that died after starting attempt 1 but before recording it leaves it running;
    the next try's launch of attempt 1 stops it and moves its folder aside, so at most one
    attempt runs and the task is not stuck on a taken folder."""
    b, market = _backend(tmp_path, [(True, 100)])
    kw = {"checkpoint_uri": str(tmp_path / "c"), "changeover_wall_s": 0.1, "market": market}
    orphan = b.launch(IDENT, 1, "on_demand", SLEEPER, **kw)
    until = time.time() + 15
    while b.status(orphan).state.value != "running" and time.time() < until:
        time.sleep(0.05)
    h = b.launch(IDENT, 1, "on_demand", SLEEPER, **kw)
    try:
        aside = [p for p in Path(str(orphan.run_dir)).parent.iterdir() if ".leftover-" in p.name]
        assert len(aside) == 1
        assert b.status(AttemptHandle(run_dir=str(aside[0]))).terminal  # stopped, not left running
        assert h.run_dir == orphan.run_dir and not b.status(h).terminal
    finally:
        b.cancel(h)


def test_exit_0_on_the_notice_says_the_notice_came(tmp_path: Path) -> None:
    """A script that saves and exits 0 on SIGTERM: the verdict is 'exited 0' with the notice's
    time as evidence, so the controller can count it as the preemption it was."""
    b, market = _backend(tmp_path, [(True, 2), (False, 100)])
    code = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: time.sleep(0.01)"
    h = _launch(b, market, tmp_path, "spot", code)
    st = _wait(b, h)
    assert st.outcome is Outcome.SUCCEEDED and st.exit_code == 0
    assert st.evidence["notice_at"] > st.launched_at


@pytest.mark.parametrize(
    ("command", "code", "reason"),
    [
        (
            ["airflow-spot-no-such-command"],
            127,
            "command not found: 'airflow-spot-no-such-command'",
        ),
        ([__file__], 126, "cannot be run (Permission denied)"),  # a file without exec bit
    ],
)
def test_a_command_that_cannot_start_is_an_application_failure(
    tmp_path: Path, command: list[str], code: int, reason: str
) -> None:
    """A command that cannot start fails the application (not the capacity: relaunching on
    other capacity cannot help) with the shell's exit code, and says why in the log."""
    b, market = _backend(tmp_path, [(True, 100)])
    h = b.launch(
        IDENT,
        1,
        "on_demand",
        command,
        checkpoint_uri=str(tmp_path / "c"),
        changeover_wall_s=0.0,
        market=market,
    )
    st = _wait(b, h)
    assert st.outcome is Outcome.APP_FAILURE and st.exit_code == code
    assert reason in st.reason
    assert reason in b.log_tail(h)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"time_scale": True}, "backend.time_scale"),
        ({"time_scale": float("nan")}, "backend.time_scale"),
        ({"grace_s": "2"}, "backend.grace_s"),
        ({"notice_s": -1}, "backend.notice_s"),
        ({"pool_cooldown_h": float("inf")}, "backend.pool_cooldown_h"),
        ({"offset": -3}, "backend.offset"),
        ({"polarity": "availabel"}, "backend.polarity"),
        ({"trace": ""}, "backend.trace"),
        ({"pools": [{"name": "a"}]}, "backend.pools"),
        ({"pools": (Pool("a", "x.json", polarity="up"),)}, "backend.pools[a].polarity"),
        ({"pools": (Pool("a", "x.json", spot_price=-2.0),)}, "backend.pools"),
        (
            {"pools": (Pool("a", "x.json", price_from={"zone": "z"}),)},
            "backend.pools[a].price_from",
        ),
    ],
)
def test_bad_backend_settings_name_the_field(kwargs: dict, field: str) -> None:
    from airflow_spot.exceptions import ConfigError

    with pytest.raises(ConfigError) as e:
        LocalBackend(**kwargs)
    assert e.value.field == field


def test_the_log_tail_reads_only_the_end(tmp_path: Path) -> None:
    """A big attempt log: the tail comes from its last 64 KB, not the whole file in memory."""
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "attempt.log", "wb") as fh:
        fh.write(b"x" * 50_000_000 + b"\n" + b"".join(b"line %d\n" % i for i in range(100)))
    b = LocalBackend(work_dir=str(tmp_path))
    assert b.log_tail(AttemptHandle(run_dir=str(run))).splitlines() == [
        f"line {i}" for i in range(85, 100)
    ]
    assert b.log_tail(AttemptHandle(run_dir=str(tmp_path / "none"))) == "(no log)"


def test_an_attempt_nobody_renews_checkpoints_and_stops_by_itself(tmp_path: Path) -> None:
    """Its lease runs out with nobody renewing it: the supervisor gives the training the
    notice (it checkpoints), stops it, ends the attempt as an infrastructure disruption
    ("lease expired") and says so in the attempt's log; nothing is left running."""
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store
    from airflow_spot.testing import train_command

    b, market = _backend(tmp_path, [(False, 100)])
    ckpt = tmp_path / "c"
    h = b.launch(
        IDENT,
        1,
        "on_demand",
        train_command(10_000, step_seconds=0.01, save_every=1000),
        checkpoint_uri=str(ckpt),
        changeover_wall_s=0.0,
        market=market,
        lease_until=time.time() + 2.0,
    )
    time.sleep(1.2)
    assert b.status(h).state.value == "running"
    st = _wait(b, h)
    assert st.outcome is Outcome.INFRA_DISRUPTION and "lease expired" in st.reason, st
    assert st.exit_code == 143  # the helper saved on the notice and exited
    latest = Checkpoints(open_store(str(ckpt))).latest_valid()
    assert latest is not None and 0 < latest.step < 10_000  # checkpointed where it stopped
    assert "airflow-spot: lease expired" in (Path(str(h.run_dir)) / "attempt.log").read_text()
    pid = json.loads((Path(str(h.run_dir)) / "status.json").read_text())["child_pid"]
    assert not _alive_in_group(pid)


def test_a_renewed_lease_keeps_the_attempt_training(tmp_path: Path) -> None:
    """Looks that renew the lease (``backends.base.look``) keep it alive past its first term;
    a lease that runs out while spot is awaited ends the wait at once."""
    from airflow_spot.backends.base import look

    b, market = _backend(tmp_path, [(False, 100)])
    until0 = time.time() + 1.5
    h = b.launch(
        IDENT,
        1,
        "on_demand",
        [sys.executable, "-c", "import time; time.sleep(3.5)"],
        checkpoint_uri=str(tmp_path / "c"),
        changeover_wall_s=0.0,
        market=market,
        lease_until=until0,
    )
    h.lease_s, h.lease_until = 1.5, until0  # as the operator sets them when it launches
    until = time.time() + 10
    while not (st := look(b, h)).terminal and time.time() < until:
        time.sleep(0.2)
    assert st.outcome is Outcome.SUCCEEDED, st
    spot = dataclasses.replace(IDENT, task_id="spot")
    h2 = b.launch(
        spot,
        1,
        "spot",
        SLEEPER,
        checkpoint_uri=str(tmp_path / "c2"),
        changeover_wall_s=0.1,
        market=market,
        lease_until=time.time() + 1.0,
    )
    st2 = _wait(b, h2)
    assert st2.outcome is Outcome.INFRA_DISRUPTION and "while waiting for spot" in st2.reason


def test_a_checkpoint_location_that_takes_no_writes_is_not_an_application_failure(
    tmp_path: Path,
) -> None:
    """The example trainer, its location under a regular file (ENOTDIR: not even root writes
    there), exits 73: the verdict is checkpoint_unwritable, with the location and the error
    the trainer wrote beside its progress file."""
    from airflow_spot.testing import train_command

    b, market = _backend(tmp_path, [(True, 100)])
    (tmp_path / "file").write_text("not a folder")
    location = tmp_path / "file" / "ckpt"
    h = b.launch(
        IDENT,
        1,
        "on_demand",
        train_command(20, save_every=5),
        checkpoint_uri=str(location),
        changeover_wall_s=0.0,
        market=market,
    )
    st = _wait(b, h)
    assert (st.outcome.value, st.exit_code) == ("checkpoint_unwritable", 73)
    assert st.reason == (
        f"checkpoint location {location.as_uri()} cannot be written: Not a directory "
        f"(ENOTDIR); {st.reason.split('; ')[1]}; the training process stopped (exit 73)"
    )
    assert "Could not save checkpoint step 5" in b.log_tail(h)
