"""The checkpoint location as the job sees it between attempts: still there, and writable.

* **Vanished checkpoints.** The newest checkpoint step the job has seen (the trainer's reports,
  the location's newest manifest) never goes back by itself. When the location shows less,
  its checkpoints were deleted (the folder removed, a bucket emptied): the log and the UI's
  decision log say so (``saved checkpoints at X vanished: step 95 to 0``), and the task's claim
  on the location is written back, so that another job is still refused it.
* **An unwritable location.** An attempt that stopped because the location took no writes
  (``checkpoint_unwritable``: full, read-only, permission denied) is not the training code's
  failure. Before the next launch the operator writes a small probe there (and, where the
  free space is known, checks that the newest checkpoint would fit): while that fails it does
  not launch, and looks again at the next decision. Once waiting longer would miss the
  deadline it fails the task with a ConfigError naming ``checkpoint_uri``, the error and the
  free space. Attempts that keep failing so although the probe passes (the training process
  sees another disk, or another quota) fail it after :data:`MAX_UNWRITABLE_IN_A_ROW`.

    attempt 3 (checkpoint_unwritable: ENOSPC) -> probe fails -> wait -> probe fails -> wait
      -> probe passes -> attempt 4 from the newest checkpoint
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_spot.backends.base import Outcome
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.checkpoint.writable import LocationUnwritable, probe
from airflow_spot.exceptions import ConfigError
from airflow_spot.jobstate import AttemptRecord, JobState
from airflow_spot.operators.location import restore_claim
from airflow_spot.policy import JobSpec

log = logging.getLogger(__name__)
MAX_UNWRITABLE_IN_A_ROW = 3  # attempts that could not write although the probe could


def saw_checkpoint(
    st: JobState, ckpts: Checkpoints, ident: Any, uri: str, latest: Manifest | None, now: float
) -> None:
    """The location's newest checkpoint is ``latest``: if that is older than one the job has
    seen, the checkpoints vanished; warn (log and UI) and restore the task's claim."""
    step = latest.step if latest else 0
    if step < st.checkpoint_seen:
        restored = restore_claim(ckpts, ident)
        text = (
            f"saved checkpoints at {uri} vanished: step {st.checkpoint_seen} to {step} (the "
            f"location was deleted or emptied); training goes on from step {step}"
            + ("; the task's claim on the location was written back" if restored else "")
        )
        log.warning("%s.", text[0].upper() + text[1:])
        st.record_event(now, text, step)
    st.checkpoint_seen = step


def saw_progress(st: JobState, checkpoint_step: Any) -> None:
    """A progress report names the trainer's newest saved checkpoint."""
    if isinstance(checkpoint_step, int):
        st.checkpoint_seen = max(st.checkpoint_seen, checkpoint_step)


def unwritable_run(st: JobState) -> list[AttemptRecord]:
    """The attempts that could not write the location, newest first, back to the last one
    that ended otherwise (empty: the last attempt did not end so)."""
    run = []
    for a in reversed(st.attempts):
        if a.outcome != Outcome.CHECKPOINT_UNWRITABLE.value:
            break
        run.append(a)
    return run


def hold_back(
    st: JobState, ckpts: Checkpoints, uri: str, job: JobSpec, latest: Manifest | None, now: float
) -> bool:
    """Before a launch: True (do not launch now) while the location the last attempt could
    not write still takes no writes; raises ConfigError once waiting would miss the deadline,
    or when attempts keep failing to write where the probe can."""
    run = unwritable_run(st)
    if not run:
        return False
    need = sum(f.size for f in latest.files.values()) if latest else 0
    problem = probe(ckpts.store, need)
    if problem is None:
        if len(run) >= MAX_UNWRITABLE_IN_A_ROW:
            raise ConfigError(
                "checkpoint_uri",
                f"{len(run)} attempts in a row could not write their checkpoint to {uri} "
                f"(last: {run[0].reason}), although the operator can write there: the "
                "training process sees the location otherwise (another mount, user or quota); "
                "make it writable for the training process and clear the task",
            )
        text = f"checkpoint location {uri} takes writes again: launching"
        log.info("%s.", text[0].upper() + text[1:])
        st.record_event(now, text, latest.step if latest else 0)
        return False
    since = run[-1].ended_at or now
    _give_up_if_late(st, job, latest, now, problem, since, run[0])
    text = f"not launching: {problem}; looking again at the next decision"
    log.warning("%s (unwritable since %s).", text[0].upper() + text[1:], _clock(since))
    if not any(d.get("reason") == text for d in st.decisions if d.get("at", 0.0) >= since):
        st.record_event(now, text, latest.step if latest else 0)
    return True


def _give_up_if_late(
    st: JobState,
    job: JobSpec,
    latest: Manifest | None,
    now: float,
    problem: LocationUnwritable,
    since: float,
    last: AttemptRecord,
) -> None:
    """Waiting another two decisions would leave too little time for the work left and a
    changeover (a turn later the deadline check would fail the task without naming the
    location): fail now, naming ``checkpoint_uri``, the error and the free space."""
    total = st.total_steps or (latest.total_steps if latest else None)
    if not total:
        return
    done = latest.step if latest else 0
    needed = job.work_s * (total - done) / total + job.changeover_s
    if needed + 2 * job.tick_s <= st.deadline_s - st.market_s(now):
        return
    raise ConfigError(
        "checkpoint_uri",
        f"{problem}, since {_clock(since)} ({now - since:.0f} s): attempt {last.attempt} "
        f"stopped there (exit {last.exit_code}) and the location still takes no writes, so "
        "waiting longer would miss the deadline; free space there (or make it writable) and "
        "clear the task",
    )


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
