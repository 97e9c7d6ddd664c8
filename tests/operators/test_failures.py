"""How a try that fails ends: a passing error leaves the attempt running for the next try, a
last try or a final error stops it, and a task cleared after failing for good starts afresh."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.backend import read_status
from airflow_spot.exceptions import ConfigError
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.operators.turn import Turn
from airflow_spot.policy.model import SpotView
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command
from airflow_spot.triggers.events import EventKind, SpotEvent

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"]


def tick() -> dict:
    """A watcher's tick, as the trigger fires it now."""
    return SpotEvent(EventKind.TICK, time.time()).to_payload()


def _op(tmp_path: Path, deadline: timedelta, **changes) -> SpotTrainingOperator:
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])
    args = dict(
        task_id="train",
        command=SLEEPER,
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=20),
        total_steps=400,
        deadline=deadline,
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=LocalBackend(
            trace=str(trace), polarity="available", time_scale=1.0, work_dir=str(tmp_path / "runs")
        ),
        decision_interval=timedelta(seconds=5),
        poll_interval=0.1,
        deferrable=True,
        min_deferral=timedelta(0),  # defer even for these short waits: the subject here
    )
    return SpotTrainingOperator(**{**args, **changes})


def test_a_passing_error_keeps_the_attempt_for_the_next_try_the_last_try_stops_it(
    tmp_path: Path, monkeypatch
) -> None:
    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, timedelta(hours=1))
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store, try_number=1, max_tries=1))
    handle = AttemptHandle.from_dict(store.get(STATE_KEY)["attempts"][0]["handle"])

    def hiccup(self, now, event):
        raise RuntimeError("the checkpoint store timed out")

    monkeypatch.setattr(Turn, "advance", hiccup)
    with pytest.raises(RuntimeError):  # try 1 of 2: Airflow will retry
        op.resume(make_context(store, try_number=1, max_tries=1), tick())
    assert not read_status(handle).terminal  # still training, for try 2 to re-attach
    assert not store.get(STATE_KEY).get("failed")
    sent = []
    monkeypatch.setattr(
        "airflow_spot.operators.metrics.emit", lambda summary, *a, **k: sent.append(summary)
    )
    with pytest.raises(RuntimeError):  # try 2 of 2: nothing comes after it
        op.resume(make_context(store, try_number=2, max_tries=1), tick())
    assert read_status(handle).terminal  # stopped: nothing runs unwatched
    state = store.get(STATE_KEY)
    assert state["failed"]["error"] == "RuntimeError"
    # the UI and the metrics say the deadline is missed, with what was spent
    assert state["snapshot"]["deadline_met"] is False and state["snapshot"]["cost"] >= 0
    assert [s["deadline_met"] for s in sent] == [False]


def test_a_task_cleared_after_failing_for_good_starts_afresh(tmp_path: Path) -> None:
    """The deadline passed and the task failed; the user gives a later deadline and clears
    it: the new try is a new job (the newest checkpoint still counts), not the failed one."""
    store = FileTaskStateStore(tmp_path / "state.json")
    now = time.time()
    store.set(
        STATE_KEY,
        {
            "started_at": now - 3600,
            "deadline_at": now - 60,
            "time_scale": 1.0,
            "total_steps": 400,
            "market": None,
            "failed": {"error": "InfeasibleDeadline", "message": "deadline: cannot be met"},
        },
    )
    op = _op(tmp_path, timedelta(hours=10))
    try:
        with pytest.raises(TaskDeferred):  # launched and waiting, not failed again
            op.execute(make_context(store, try_number=2))
        st = store.get(STATE_KEY)
        assert not st.get("failed") and st["deadline_at"] > now + 9 * 3600
        assert len(st["attempts"]) == 1
        assert store.get(STATE_KEY + ".previous")["failed"]["error"] == "InfeasibleDeadline"
    finally:
        op._backend().cancel(AttemptHandle.from_dict(store.get(STATE_KEY)["attempts"][0]["handle"]))


def test_a_running_attempt_ahead_of_its_checkpoint_is_not_declared_late(tmp_path: Path) -> None:
    """300 of 400 one-second steps done on a running spot instance, the last checkpoint at
    step 0, 120 s left: the deadline is still met if spot holds, so the controller lets the
    policy keep spot instead of declaring the deadline infeasible and killing the run."""
    from airflow_spot.jobstate import AttemptRecord, JobState
    from airflow_spot.policy import Capacity

    now = time.time()
    t0 = now - 310
    st = JobState(started_at=t0, deadline_at=now + 120, total_steps=400)
    st.attempts.append(
        AttemptRecord(
            1,
            "spot",
            {"run_dir": str(tmp_path / "none")},
            launched_at=t0,
            granted_at=t0,
            started_at=t0 + 0.5,
            first_step=1,
            first_step_at=t0 + 1.5,
            step_end=300,
            last_step_at=t0 + 300.5,
        )
    )
    st.current = 0
    ctl = _op(tmp_path, timedelta(hours=1)).turn(
        st, make_context(FileTaskStateStore(tmp_path / "s"))
    )
    decision, _, obs = ctl.decide(now, SpotView.now(True, st.spot_age_s(now), st.spot_source))
    assert decision.capacity is Capacity.SPOT
    assert obs.done_s == 0.0  # the policy still counts only checkpointed spot work


def test_exit_0_after_the_notice_with_work_left_is_a_preemption(tmp_path: Path) -> None:
    """A training script that saves and exits 0 on SIGTERM while spot is reclaimed spends the
    preemption budget, not the failure budget."""
    from airflow_spot.backends.base import AttemptStatus, Outcome, State
    from airflow_spot.jobstate import AttemptRecord, JobState

    now = time.time()
    st = JobState(started_at=now - 100, deadline_at=now + 3600, total_steps=400)
    rec = AttemptRecord(1, "spot", {"run_dir": str(tmp_path / "none")}, launched_at=now - 100)
    st.attempts.append(rec)
    st.current = 0
    ctl = _op(tmp_path, timedelta(hours=1)).turn(
        st, make_context(FileTaskStateStore(tmp_path / "s"))
    )
    status = AttemptStatus(
        State.ENDED,
        "spot",
        1,
        now - 100,
        ended_at=now,
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
        evidence={"notice_at": now - 5},
    )
    ctl.attempt.close(rec, status, now)
    assert rec.outcome == "preempted" and (st.preemptions, st.failures) == (1, 0)


def test_a_fresh_start_stops_what_the_failed_job_left_running(tmp_path: Path) -> None:
    """The failed job's attempt 4 is somehow still running (stopping it failed): the new job
    stops it before starting, so two attempts never write to one checkpoint store."""
    from airflow_spot.jobstate import AttemptRecord, JobState

    op = _op(tmp_path, timedelta(hours=10))
    backend = op._backend()
    ident = TaskIdentity("dag", "train", "run")
    handle = backend.launch(
        ident,
        4,
        "on_demand",
        SLEEPER,
        checkpoint_uri=str(tmp_path / "ckpt"),
        changeover_wall_s=0.1,
        market=backend.market_spec(time.time()),
    )
    now = time.time()
    old = JobState(started_at=now - 3600, deadline_at=now - 60, total_steps=400)
    old.attempts.append(AttemptRecord(4, "on_demand", handle, launched_at=now - 1))
    old.current = 0
    old.failed = {"error": "InfeasibleDeadline", "message": "deadline: cannot be met"}
    store = FileTaskStateStore(tmp_path / "state.json")
    store.set(STATE_KEY, old.to_dict())
    try:
        with pytest.raises(TaskDeferred):
            op.execute(make_context(store, try_number=2))
        assert read_status(handle).terminal
    finally:
        backend.cancel(handle)
        for a in store.get(STATE_KEY)["attempts"]:
            backend.cancel(AttemptHandle.from_dict(a["handle"]))


def test_a_failed_trigger_fails_the_try_like_any_error(tmp_path: Path) -> None:
    """A trigger that crashed wakes the task with ``__fail__``: with tries left the attempt
    keeps running for the next try; on the last try it is stopped and the job marked failed
    (Airflow's default raised and left it running unwatched)."""
    from airflow.sdk.exceptions import TaskDeferralError

    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, timedelta(hours=1))
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store, try_number=1, max_tries=1))
    handle = AttemptHandle.from_dict(store.get(STATE_KEY)["attempts"][0]["handle"])
    crashed = {"error": "Trigger failure", "traceback": ["boom"]}
    with pytest.raises(TaskDeferralError):
        op.resume_execution("__fail__", crashed, make_context(store, try_number=1, max_tries=1))
    assert not read_status(handle).terminal and not store.get(STATE_KEY).get("failed")
    with pytest.raises(TaskDeferralError):
        op.resume_execution("__fail__", crashed, make_context(store, try_number=2, max_tries=1))
    assert read_status(handle).terminal
    assert store.get(STATE_KEY)["failed"]["error"] == "TaskDeferralError"


def test_a_trigger_timeout_past_the_deadline_is_a_missed_deadline(tmp_path: Path) -> None:
    """The deferral outlived the deadline (the triggerer was down): the job failed for good,
    whatever tries are left, and nothing keeps running."""
    from airflow_spot.exceptions import InfeasibleDeadline

    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, timedelta(hours=1))
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store, try_number=1, max_tries=3))
    raw = store.get(STATE_KEY)
    raw["started_at"], raw["deadline_at"] = time.time() - 8000, time.time() - 4000
    store.set(STATE_KEY, raw)
    with pytest.raises(InfeasibleDeadline, match="deadline: cannot be met any more"):
        op.resume_execution(
            "__fail__", {"error": "Trigger timeout"}, make_context(store, try_number=1, max_tries=3)
        )
    assert read_status(AttemptHandle.from_dict(raw["attempts"][0]["handle"])).terminal
    assert store.get(STATE_KEY)["failed"]["error"] == "InfeasibleDeadline"


def test_a_trigger_timeout_after_the_work_finished_ends_the_job_late(tmp_path: Path) -> None:
    """The training finished while the triggerer was down and the deadline passed: the job
    ends with its summary (deadline missed), not as an infeasible failure."""
    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, timedelta(hours=1))
    op.command = train_command(20, save_every=5)
    op.total_steps = 20
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store, try_number=1, max_tries=3))
    raw = store.get(STATE_KEY)
    handle = AttemptHandle.from_dict(raw["attempts"][0]["handle"])
    until = time.time() + 60
    while not read_status(handle).terminal and time.time() < until:
        time.sleep(0.1)
    raw["deadline_at"] = time.time() - 60
    store.set(STATE_KEY, raw)
    summary = op.resume_execution(
        "__fail__", {"error": "Trigger timeout"}, make_context(store, try_number=1, max_tries=3)
    )
    assert summary["final_checkpoint"]["step"] == 20 and summary["deadline_met"] is False
    assert store.get(STATE_KEY)["finished"] and not store.get(STATE_KEY).get("failed")


def test_execution_timeout_bounds_a_deferred_try(tmp_path: Path) -> None:
    """Airflow does not apply execution_timeout while a task is deferred: the deferral's own
    timeout is capped by what is left of it, and a try past it fails with AirflowTaskTimeout
    (on the last try: attempt stopped, job failed)."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, timedelta(hours=1))
    op.execution_timeout = timedelta(seconds=30)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context(store, try_number=1, max_tries=0))
    assert 25 < deferred.value.timeout.total_seconds() <= 30
    raw = store.get(STATE_KEY)
    raw["try_started_at"] -= 30  # the deferral ran its course
    store.set(STATE_KEY, raw)
    with pytest.raises(AirflowTaskTimeout, match="reached while deferred"):
        op.resume_execution(
            "__fail__", {"error": "Trigger timeout"}, make_context(store, try_number=1, max_tries=0)
        )
    state = store.get(STATE_KEY)
    assert state["failed"]["error"] == "AirflowTaskTimeout"
    assert read_status(AttemptHandle.from_dict(state["attempts"][0]["handle"])).terminal


@pytest.mark.parametrize("max_tries", [0, 1])
def test_execution_timeout_in_the_worker_goes_through_the_failure_handler(
    tmp_path: Path, max_tries: int
) -> None:
    """In a non-deferrable task Airflow's timeout is a BaseException raised while the worker
    waits: with tries left the record stays resumable; on the last try the job is failed (a
    later clear then starts afresh instead of resuming the stale job)."""
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout

    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(tmp_path, timedelta(hours=1))
    op.deferrable = False
    op.execution_timeout = timedelta(seconds=2)
    with pytest.raises(AirflowTaskTimeout), timeout(2):
        op.execute(make_context(store, try_number=1, max_tries=max_tries))
    state = store.get(STATE_KEY)
    assert bool(state.get("failed")) is (max_tries == 0)
    op.on_kill()  # as the task runner does after the timeout
    assert read_status(AttemptHandle.from_dict(state["attempts"][0]["handle"])).terminal


def test_the_policy_keeps_a_guard_for_a_slower_latest_attempt_and_noise(tmp_path: Path) -> None:
    """Spot ran at 1 s per step, the latest (on-demand) attempt runs at 1.5 s: the policy's
    deadline is moved earlier by the extra 0.5 s for every step left, 2 % of the work left and
    two looks, so it does not plan on the faster mean and finish late; never by more than the
    whole job's slack. A look is a poll and the most the recent turns began after their events."""
    from airflow_spot.jobstate import AttemptRecord, JobState

    def run(attempt: int, capacity: str, steps: int, secs: float) -> AttemptRecord:
        return AttemptRecord(
            attempt,
            capacity,
            {},
            launched_at=0.0,
            first_step=0,
            first_step_at=1.0,
            step_end=steps,
            last_step_at=1.0 + secs,
        )

    op = _op(tmp_path, timedelta(hours=1))
    state = JobState(started_at=0.0, deadline_at=3600.0)
    state.attempts = [run(1, "spot", 100, 100.0), run(2, "on_demand", 20, 30.0)]
    ctl = op.turn(state, make_context(FileTaskStateStore(tmp_path / "s.json")))
    sps = 130.0 / 120.0
    guard = ctl._guard(100, sps, 400 * sps, 30.0)
    assert guard == pytest.approx(100 * (1.5 - sps) + 0.02 * 100 * sps + 2 * 0.1)
    assert ctl._guard(100, sps, 3550.0, 30.0) == pytest.approx(20.0)  # capped by the slack
    state.attempts.append(run(3, "spot", 50, 25.0))  # the latest is faster: noise and looks only
    assert ctl._guard(100, 1.0, 400.0, 30.0) == pytest.approx(0.02 * 100 + 0.2)
    # turns that began late after their events (a busy scheduler): the look keeps the latest
    # of the last 20, so a stall long past is forgotten
    ctl._woke(100.0, SpotEvent(EventKind.TICK, 88.0))
    ctl._woke(101.0, SpotEvent(EventKind.TICK, 105.0))  # another clock ahead: not early, 0
    assert state.looks_late == [12.0, 0.0]
    assert ctl._guard(100, 1.0, 400.0, 30.0) == pytest.approx(0.02 * 100 + 2 * (0.1 + 12.0))
    for t in range(19):
        ctl._woke(200.0 + t, SpotEvent(EventKind.TICK, 199.0 + t))
    assert len(state.looks_late) == 20 and max(state.looks_late) == 1.0
    assert ctl._guard(100, 1.0, 400.0, 30.0) == pytest.approx(0.02 * 100 + 2 * (0.1 + 1.0))
    ctl._woke(300.0, None)  # a turn no event woke (a new try) keeps nothing
    assert len(state.looks_late) == 20


def test_short_waits_stay_in_the_worker_longer_ones_defer_with_a_hold(tmp_path: Path) -> None:
    """Waits under min_deferral (30 s by default) are spent in the worker, so a 5 s decision
    interval never defers; with a shorter min_deferral the task defers, and its trigger holds
    any event for min(10 s, min_deferral / 3)."""

    def op(ckpt: str = "ckpt", **kw) -> SpotTrainingOperator:
        quick = dict(command=train_command(40, step_seconds=0.02), total_steps=40)
        return _op(
            tmp_path,
            timedelta(seconds=120),
            checkpoint_uri=str(tmp_path / ckpt),
            expected_compute=timedelta(seconds=2),
            poll_interval=0.05,
            **{**quick, "min_deferral": timedelta(seconds=30), **kw},
        )

    store = FileTaskStateStore(tmp_path / "state.json")
    out = op().execute(make_context(store))  # no TaskDeferred: finished in the worker
    assert out["deadline_met"] is True and out["attempts"][-1]["outcome"] == "succeeded"
    other = FileTaskStateStore(tmp_path / "state2.json")
    t0 = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op("ckpt2", min_deferral=timedelta(seconds=3)).execute(make_context(other))
    hold = deferred.value.trigger.hold_until - t0
    assert 0.9 <= hold <= 1.0 + (time.time() - t0)
    with pytest.raises(ConfigError, match="min_deferral"):
        op(min_deferral=-timedelta(seconds=1))


def test_a_command_that_never_checkpoints_fails_at_once_naming_the_helper(tmp_path: Path) -> None:
    """A training command that exits 0 without writing any checkpoint would run in full
    max_failures + 1 times (3 x 48 h of GPU for a real job); it fails after the first, naming
    TrainingSession and the environment variable."""
    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(
        tmp_path,
        timedelta(seconds=60),
        command=[sys.executable, "-c", "import time; time.sleep(0.2)"],
        deferrable=False,
        decision_interval=timedelta(seconds=0.5),
    )
    with pytest.raises(
        ConfigError,
        match=r"command: .* never wrote a checkpoint .*TrainingSession .*AIRFLOW_SPOT_CHECKPOINT_URI",
    ):
        op.execute(make_context(store))
    st = store.get(STATE_KEY)
    assert len(st["attempts"]) == 1 and st["failures"] == 1
    assert st["failed"]["error"] == "ConfigError"


SLOW_SAVES = """
import time
from airflow_spot.checkpoint.training import TrainingSession
s = TrainingSession.from_env(total_steps=6, save_every=2)
for step in range(6):
    time.sleep(0.05)
    s.step_done(step + 1, lambda: time.sleep(0.6) or {"w": b"x"})
"""


def test_a_save_longer_than_the_preemption_grace_is_warned_about_once(
    tmp_path: Path, caplog
) -> None:
    """The trainer reports its longest save; one longer than the backend's notice + grace
    would be cut off on every preemption (the steps since the previous save lost), so the
    task log says so, once (a PyTorch run lost 18, 6 and 24 steps without a word)."""
    store = FileTaskStateStore(tmp_path / "state.json")
    op = _op(
        tmp_path,
        timedelta(seconds=120),
        command=[sys.executable, "-c", SLOW_SAVES],
        total_steps=6,
        expected_compute=timedelta(seconds=5),
        deferrable=False,
        decision_interval=timedelta(seconds=0.3),
        backend=LocalBackend(
            trace=str(scripted_trace(tmp_path / "t.json", [(True, 5000)])),
            polarity="available",
            time_scale=1.0,
            work_dir=str(tmp_path / "runs"),
            notice_s=0.1,
            grace_s=0.3,
        ),
    )
    with caplog.at_level("WARNING", logger="airflow_spot.operators.attempt"):
        op.execute(make_context(store))
    st = store.get(STATE_KEY)
    assert st["save_s"] >= 0.6 and st["save_warned"] is True
    warned = [r.getMessage() for r in caplog.records if "A checkpoint save took" in r.getMessage()]
    assert len(warned) == 1 and "longer than the 0.4 s" in warned[0]


def test_the_turn_hands_its_policy_the_plan_cache_folder(tmp_path: Path, monkeypatch) -> None:
    """The plan cache folder is the operator's to read (the setting ``[spot_training]
    plan_cache``, its earlier ``$AIRFLOW_SPOT_PLAN_CACHE`` winning where set, else the XDG
    cache); the policy gets it as an argument (the pure core reads no environment)."""
    from airflow_spot.jobstate import JobState
    from airflow_spot.settings import plan_cache
    from airflow_spot.testing import FileTaskStateStore, make_context

    monkeypatch.setenv("AIRFLOW_SPOT_PLAN_CACHE", str(tmp_path / "plans"))
    monkeypatch.setenv("AIRFLOW__SPOT_TRAINING__PLAN_CACHE", str(tmp_path / "setting"))
    assert plan_cache() == str(tmp_path / "plans")
    monkeypatch.delenv("AIRFLOW_SPOT_PLAN_CACHE")
    assert plan_cache() == str(tmp_path / "setting")
    monkeypatch.delenv("AIRFLOW__SPOT_TRAINING__PLAN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert plan_cache() == str(tmp_path / "xdg" / "airflow-spot" / "plans")
    st = JobState(started_at=time.time(), deadline_at=time.time() + 3600)
    turn = _op(tmp_path, timedelta(hours=1)).turn(
        st, make_context(FileTaskStateStore(tmp_path / "s"))
    )
    assert turn.policy.plan_cache == str(tmp_path / "xdg" / "airflow-spot" / "plans")
