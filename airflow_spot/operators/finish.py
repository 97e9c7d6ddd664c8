"""The end of a job as Airflow sees it: the ``@task.spot_training`` function's return value in
the XCom, and an Asset event for the final model.

Every ``Asset`` among the task's ``outlets`` names the final model. Airflow records a task's
Asset events when the task succeeds; this sets their ``extra`` first (``outlet_events``)::

    {"checkpoint_step": 4000, "manifest_hash": "<sha256 of the checkpoint's MANIFEST.json>",
     "uri": "s3://bucket/run/ckpt-000000004000", "metrics": {...}, "cost": 12.3,
     "savings": 0.61, "deadline_met": true}

Only for a whole checkpoint: the job finishes on the newest checkpoint whose files all match
their manifest (``Checkpoints.latest_valid``). Never twice for one step: a later try of a
task whose job had finished (a worker lost after the job's end, a task cleared after success)
reports the same job again, and asks Airflow for the Asset's recent events first; an Asset
that already has an event for this checkpoint (same step and manifest hash) is left out of
the outlets, so no second event is recorded. Events at checkpoint milestones, while the job
runs, come from an Asset watcher (:mod:`airflow_spot.triggers.milestones`): Airflow records a
task's own events only once it succeeds.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_spot.checkpoint.base import Store
    from airflow_spot.jobstate import JobState

log = logging.getLogger(__name__)
RECENT_EVENTS = 50  # an Asset's newest events looked at for one already recorded
MODEL_EVENT = "model_event"  # the event's extra, kept in the finished job's summary


def job_done(
    context: Context, state: JobState, summary: dict[str, Any] | None, store: Store, op: Any
) -> None:
    """The job just finished in this try: its summary (kept in ``state``) gets the result and
    the model event's extra, and the outlets their extra."""
    added = complete(context, summary or {}, store, op.returns_result, again=False)
    (summary or {}).update(added)
    state.finished = {**(state.finished or {}), **added}


def report_again(context: Context, raw: dict[str, Any], store: Store, op: Any) -> dict[str, Any]:
    """A later try of a task whose job finished reports that job again (its model event
    unless Airflow recorded one already); returns the job's state, completed."""
    done = raw["finished"]
    done.update(complete(context, done, store, op.returns_result, again=True))
    return raw


def complete(
    context: Context, done: dict[str, Any], store: Store, returns: bool, *, again: bool
) -> dict[str, Any]:
    """What the finished job's summary ``done`` lacks, computed now and returned: the
    function's result (``returns``) and the model event's extra; then the outlets' extra set.
    ``again``: a later try reports the job again, and an Asset whose event for this checkpoint
    is recorded already is left out of the task's outlets."""
    final = done.get("final_checkpoint") or {}
    added: dict[str, Any] = {}
    if returns and "result" not in done:
        added.update(_result(store, final))
    assets = _assets(context)
    if not assets or not final.get("name"):
        return added
    extra = done.get(MODEL_EVENT)
    if extra is None:
        digest, _ = store.digest(f"{final['name']}/MANIFEST.json")
        extra = added[MODEL_EVENT] = model_extra(done, digest)
    if again:
        recorded = [a for a in assets if _has_event(a, extra)]
        if recorded:
            log.info(
                "An event for checkpoint step %s is recorded already for %s: not again.",
                extra["checkpoint_step"],
                ", ".join(a.name for a in recorded),
            )
            task = context["task"]
            task.outlets = [o for o in task.outlets if o not in recorded]
    _set_extra(context, extra)
    return added


def model_extra(summary: dict[str, Any], manifest_hash: str) -> dict[str, Any]:
    """The final model's event extra (see the module's docstring)."""
    final = summary["final_checkpoint"]
    return {
        "checkpoint_step": final["step"],
        "manifest_hash": manifest_hash,
        "uri": final["uri"],
        "metrics": final.get("metrics") or {},
        "cost": summary.get("cost"),
        "savings": summary.get("savings"),
        "deadline_met": summary.get("deadline_met"),
    }


def _result(store: Store, final: dict[str, Any]) -> dict[str, Any]:
    """``result`` (and ``result_missing`` when the value never came back)."""
    from airflow_spot.decorators import result

    found, value = result.read(store, final.get("name") or "")
    if found:
        return {"result": value}
    # the last attempt ended (preempted, say) between its final checkpoint and its return
    why = (
        "the function's last attempt ended after its final checkpoint but before it "
        "returned: the job is done, its return value lost"
    )
    log.warning("No return value for checkpoint %s: %s.", final.get("name"), why)
    return {"result": None, "result_missing": why}


def _assets(context: Context) -> list[Any]:
    """The task's Asset outlets (none in a context without the task: a test's)."""
    from airflow.sdk import Asset

    task = context.get("task")
    return [o for o in getattr(task, "outlets", None) or () if isinstance(o, Asset)]


def _set_extra(context: Context, extra: dict[str, Any]) -> None:
    events = context["outlet_events"]
    for asset in _assets(context):
        events[asset].extra.update(extra)


def _has_event(asset: Any, extra: dict[str, Any]) -> bool:
    """Whether Airflow has recorded an event of ``asset`` for this checkpoint."""
    from airflow.sdk.execution_time.context import InletEventsAccessor

    recent = InletEventsAccessor(asset_name=asset.name, asset_uri=asset.uri)
    for event in recent.ascending(False).limit(RECENT_EVENTS):
        got = event.extra or {}
        if (got.get("checkpoint_step"), got.get("manifest_hash")) == (
            extra["checkpoint_step"],
            extra["manifest_hash"],
        ):
            return True
    return False
