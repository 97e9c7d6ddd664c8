"""Who trains into a checkpoint location: a new job claims it (one conditional write per task
and run, and a record of the last task instance that trained there), so that two jobs never
train into and resume from each other's checkpoints, and complete work is never "trained" again."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import Any

from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.exceptions import ConfigError

log = logging.getLogger(__name__)


def claim_location(
    ckpts: Checkpoints, ti: Any, uri: str, total_steps: int | None, log: Any
) -> None:
    """A new job whose checkpoint_uri already holds work from before it (a URI not
    templated per run): complete work is an error (nothing would be trained, and the run
    would report 100 % savings); partial work is resumed, with a warning. Another map
    index of this task in this run training into the same location is an error (each
    would resume from the other's checkpoints)."""
    me = {k: getattr(ti, k, None) for k in ("dag_id", "task_id", "run_id", "map_index")}
    mapped = isinstance(me["map_index"], int) and me["map_index"] >= 0
    fix = (
        "template it per map index, e.g. '.../{{ run_id }}/{{ ti.map_index }}'"
        if mapped
        else "template it per run (e.g. '.../{{ ds }}' or '.../{{ run_id }}')"
    )
    # one record per task and run, claimed in one conditional write: of two map indexes
    # starting together exactly one gets it, whatever earlier runs left here
    claim = claim_key(me)
    first = ckpts.claim(me, claim)
    if first is not None and first.get("map_index") != me["map_index"]:
        raise ConfigError(
            "checkpoint_uri",
            f"{uri} is already used by map index {first.get('map_index')} "
            f"of this task in this run; mapped instances each need their own location: "
            f"{fix}",
        )
    _check_owner(ckpts, ti, me, uri, total_steps, fix, claim if first is None else None, log)


def claim_key(me: dict[str, Any]) -> str:
    """The name of the claim of one task in one run (``job-owner-<hash>.json``)."""
    run = hashlib.sha1(f"{me['dag_id']}/{me['task_id']}/{me['run_id']}".encode())
    return f"job-owner-{run.hexdigest()[:16]}.json"


def restore_claim(ckpts: Checkpoints, ident: Any) -> bool:
    """Write back this task instance's claim and owner record where they are gone (the
    location was deleted while the job ran): without them another job would not be refused
    this location. True if anything was written back."""
    me = {k: getattr(ident, k, None) for k in ("dag_id", "task_id", "run_id", "map_index")}
    restored = ckpts.claim(me, claim_key(me)) is None
    if ckpts.owner() is None:
        ckpts.set_owner(me)
        restored = True
    return restored


def _check_owner(
    ckpts: Checkpoints,
    ti: Any,
    me: dict[str, Any],
    uri: str,
    total_steps: int | None,
    fix: str,
    new_claim: str | None,
    log: Any,
) -> None:
    """The last task instance that trained here: refused while Airflow says it is live, else
    its partial work is taken over (this one is recorded as the owner)."""
    # the last task instance that trained here (recorded in one conditional write: of two
    # jobs starting together, the second sees the first)
    prev = ckpts.claim(me)
    theirs = {k: (prev or {}).get(k) for k in me}
    other = prev is not None and theirs != me
    if other and (theirs["dag_id"], theirs["task_id"]) != (me["dag_id"], me["task_id"]):
        fix = "give each task its own location, e.g. '.../{{ ti.task_id }}/{{ run_id }}'"
    who = _ti_name(theirs)
    live = _ti_state(ti, theirs) if other else None
    if live in LIVE_TI_STATES:
        if new_claim is not None:  # this run's claim, just made: take it back
            ckpts.store.delete(new_claim)
        raise ConfigError(
            "checkpoint_uri",
            f"{uri} is in use by {who}, which is {live}: two jobs would "
            f"train into and resume from each other's checkpoints; {fix}, or start this one "
            "after that task instance ends (nothing was changed)",
        )
    _check_earlier_work(ckpts, uri, total_steps, f" by {who}" if other else "", fix, log)
    if other:
        ckpts.set_owner(me)


def _check_earlier_work(
    ckpts: Checkpoints,
    uri: str,
    total_steps: int | None,
    by: str,
    fix: str,
    log: Any,
) -> None:
    """Complete work already there is an error; partial work is resumed, with a warning."""
    m = ckpts.latest_manifest()
    if m is not None and (total_steps or m.total_steps or 0) <= m.step:
        m = ckpts.latest_valid()  # complete work counts only if its files are whole
    if m is not None:
        total = total_steps or m.total_steps
        saved = datetime.fromtimestamp(m.created, UTC).isoformat(timespec="seconds")
        if total and m.step >= total:
            raise ConfigError(
                "checkpoint_uri",
                f"{uri} already holds a complete checkpoint (step {m.step} "
                f"of {total}, saved {saved}{by}) from before this task instance started, so "
                f"there is nothing to train; {fix} or delete those checkpoints to train "
                "again (nothing was deleted)",
            )
        log.warning(
            "checkpoint_uri %s already holds step %d of %s (saved %s%s) from before this "
            "task instance started: resuming from it. To start afresh, %s.",
            uri,
            m.step,
            total,
            saved,
            by,
            fix,
        )


# task instance states in which a job may still train (or will again, on retry)
LIVE_TI_STATES = frozenset(
    {
        "running",
        "deferred",
        "queued",
        "scheduled",
        "up_for_retry",
        "up_for_reschedule",
        "restarting",
    }
)


def _ti_name(ti: dict[str, Any]) -> str:
    index = ti.get("map_index")
    mapped = f" [map index {index}]" if isinstance(index, int) and index >= 0 else ""
    return f"task {ti.get('dag_id')}.{ti.get('task_id')}{mapped} of run {ti.get('run_id')}"


def _ti_state(ti: Any, other: dict[str, Any]) -> str | None:
    """The state of another task instance, asked of Airflow (None when it cannot say: an old
    Airflow, a deleted run or DAG, no API server)."""
    get = getattr(ti, "get_task_states", None)
    if get is None or not other.get("dag_id") or not other.get("run_id"):
        return None
    index = other.get("map_index")
    try:
        states = get(dag_id=other["dag_id"], task_ids=[other["task_id"]], run_ids=[other["run_id"]])
    except Exception as e:  # noqa: BLE001 - unknown is not an error: the check is best effort
        log.debug("could not read the state of %s: %s", _ti_name(other), e)
        return None
    name = (
        other["task_id"]
        if not isinstance(index, int) or index < 0
        else f"{other['task_id']}_{index}"
    )
    state = (states or {}).get(other["run_id"], {}).get(name)
    return str(getattr(state, "value", state)) if state is not None else None


def claim_store(store: Any, ti: Any, uri: Any, op: Any) -> None:
    """A new job claims the checkpoint location of ``store`` (see :func:`claim_location`),
    once its rendered URI is known to lie inside an allowed local root (before anything is
    written there, and before the training process, whose retention deletes, is started)."""
    from airflow_spot.operators.roots import check_local_root

    check_local_root(str(uri))
    claim_location(Checkpoints.watching(store), ti, str(uri), op.total_steps, op.log)
