"""Asset events at checkpoint milestones, while the job still runs.

Airflow records a task's own Asset events when it succeeds, so the final model's event comes
from the task (:mod:`airflow_spot.operators.finish`); intermediate ones come from an Asset
watcher, Airflow's event-driven scheduling: the triggerer runs
:class:`CheckpointMilestoneTrigger` for every Asset that names it, and each event it yields
becomes an event of that Asset, ``extra = {"from_trigger": true, "payload": {...}}``::

    checkpoints = milestone_asset("logreg_checkpoints", checkpoint_uri="s3://b/logreg",
                                  every_steps=1000)          # or fractions=[0.25, 0.5, 0.75]
    with DAG("evaluate_checkpoints", schedule=[checkpoints]): ...

The payload: ``checkpoint_step``, ``manifest_hash`` (sha256 of its MANIFEST.json), ``uri``,
``total_steps``, ``fraction``, ``metrics``. Events are emitted only for a whole checkpoint (the
newest whose files all match their manifest) and never twice for one step: the step of the
last event is kept in the Asset's state store (Airflow's ``asset_state_store``) *before* the
event is yielded, so a restarted triggerer goes on from there (a crash between the two loses
that event rather than sending it twice). A location whose checkpoints start again below the
last event (a new job there) starts its milestones again. One event per look at most: a
watcher that was down past several milestones announces the newest.

Watchers run for Assets that an unpaused DAG is scheduled on; the location is a literal URI
(a watcher has no DAG run to render a template with).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import AsyncIterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_spot.exceptions import ConfigError

if TYPE_CHECKING:
    from airflow.sdk import Asset

    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.manifest import Manifest

STATE_KEY = "airflow_spot_milestone"  # in the Asset's state store: {uri: {"step", "hash"}}


class CheckpointMilestoneTrigger(BaseEventTrigger):
    """An Asset watcher: one event per whole checkpoint that passes a milestone of
    ``checkpoint_uri`` (every ``every_steps`` steps, and/or at ``fractions`` of the job)."""

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        every_steps: int | None = None,
        fractions: list[float] | None = None,
        aws_conn_id: str | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        check_milestones(checkpoint_uri, every_steps, fractions, poll_interval)
        self.checkpoint_uri = checkpoint_uri
        self.every_steps = every_steps
        self.fractions = sorted(float(f) for f in fractions or ())
        self.aws_conn_id = aws_conn_id
        self.poll_interval = float(poll_interval)
        self.last: dict[str, Any] | None = None  # {"step", "hash"} of the last event

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "checkpoint_uri": self.checkpoint_uri,
            "every_steps": self.every_steps,
            "fractions": self.fractions or None,
            "aws_conn_id": self.aws_conn_id,
            "poll_interval": self.poll_interval,
        }

    @cached_property
    def checkpoints(self) -> Checkpoints:
        """The location's checkpoints, built on the first look (for s3://, its client too)."""
        from airflow_spot.checkpoint.checkpoints import Checkpoints
        from airflow_spot.checkpoint.stores import open_store
        from airflow_spot.hooks.conditions import s3_client_for

        uri = self.checkpoint_uri
        return Checkpoints.watching(open_store(uri, s3_client=s3_client_for(uri, self.aws_conn_id)))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look every ``poll_interval`` seconds; a failed look is logged and tried again."""
        self.last = await self._recall()
        while True:
            try:
                found = await asyncio.to_thread(self.look)
                if found is not None:
                    await self._remember(found)  # first: never twice, even across a restart
                    self.last = {"step": found["checkpoint_step"], "hash": found["manifest_hash"]}
                    yield TriggerEvent(found)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the watch goes on; the next look may pass
                self.log.warning(
                    "Looking at %s failed (%s: %s).", self.checkpoint_uri, type(e).__name__, e
                )
            await asyncio.sleep(self.poll_interval)

    def look(self) -> dict[str, Any] | None:
        """The payload of the newest whole checkpoint if it passes a milestone since the last
        event (None otherwise). Only a new newest manifest is verified (hashed)."""
        newest = self.checkpoints.latest_manifest()
        last_step = int(self.last["step"]) if self.last else 0
        if newest is None:
            return None
        if newest.step < last_step:  # the location started again: a new job's milestones
            last_step = 0
        elif newest.step == last_step:
            return None
        whole = self.checkpoints.latest_valid()
        if whole is None or whole.step <= last_step or not self.passes(last_step, whole):
            return None
        return self.payload(whole)

    def passes(self, last_step: int, m: Manifest) -> bool:
        """Whether going from ``last_step`` to ``m.step`` crosses a milestone."""
        if self.every_steps and m.step // self.every_steps > last_step // self.every_steps:
            return True
        total = m.total_steps
        if not total:
            return False
        return any(last_step < f * total <= m.step for f in self.fractions)

    def payload(self, m: Manifest) -> dict[str, Any]:
        from airflow_spot.checkpoint.manifest import MANIFEST

        raw = self.checkpoints.store.get(f"{m.name}/{MANIFEST}")
        return {
            "checkpoint_step": m.step,
            "manifest_hash": hashlib.sha256(raw).hexdigest(),
            "uri": f"{self.checkpoint_uri.rstrip('/')}/{m.name}",
            "total_steps": m.total_steps,
            "fraction": None if not m.total_steps else round(m.step / m.total_steps, 6),
            "metrics": m.metrics,
        }

    async def _recall(self) -> dict[str, Any] | None:
        """The last event's checkpoint, from the Asset's state store. Without one (a triggerer
        that gives none), the newest checkpoint now: nothing before this start is sent again."""
        if self.asset_state_store is not None:
            kept = await self.asset_state_store.aget(STATE_KEY) or {}
            got = kept.get(self.checkpoint_uri) if isinstance(kept, dict) else None
            return got if isinstance(got, dict) else None
        newest = await asyncio.to_thread(self.checkpoints.latest_manifest)
        return None if newest is None else {"step": newest.step, "hash": None}

    async def _remember(self, found: dict[str, Any]) -> None:
        if self.asset_state_store is None:
            return
        kept = await self.asset_state_store.aget(STATE_KEY) or {}
        kept = dict(kept) if isinstance(kept, dict) else {}
        kept[self.checkpoint_uri] = {
            "step": found["checkpoint_step"],
            "hash": found["manifest_hash"],
        }
        await self.asset_state_store.aset(STATE_KEY, kept)


def check_milestones(uri: Any, every_steps: Any, fractions: Any, poll_interval: Any = 30.0) -> None:
    """The watcher's arguments, each error naming its field."""
    from airflow_spot.checkpoint.stores import validate_uri

    if not isinstance(uri, str) or "{{" in uri or "{%" in uri:
        raise ConfigError(
            "checkpoint_uri", f"must be a literal location (no template), got {uri!r}"
        )
    validate_uri(uri)
    if every_steps is None and not fractions:
        raise ConfigError("every_steps", "give every_steps=N or fractions=[0.25, 0.5, ...]")
    if every_steps is not None and (not isinstance(every_steps, int) or every_steps < 1):
        raise ConfigError("every_steps", f"must be an integer >= 1, got {every_steps!r}")
    for f in fractions or ():
        if not isinstance(f, (int, float)) or not 0 < f <= 1 or math.isnan(f):
            raise ConfigError("fractions", f"each must be in (0, 1], got {f!r}")
    if not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
        raise ConfigError("poll_interval", f"must be seconds > 0, got {poll_interval!r}")


def milestone_asset(
    name: str,
    *,
    checkpoint_uri: str,
    every_steps: int | None = None,
    fractions: list[float] | None = None,
    aws_conn_id: str | None = None,
    poll_interval: float = 30.0,
    **asset_kwargs: Any,
) -> Asset:
    """An Asset whose events are ``checkpoint_uri``'s milestones (a watcher's), for a DAG to be
    scheduled on."""
    from airflow.sdk import Asset, AssetWatcher

    trigger = CheckpointMilestoneTrigger(
        checkpoint_uri=checkpoint_uri,
        every_steps=every_steps,
        fractions=fractions,
        aws_conn_id=aws_conn_id,
        poll_interval=poll_interval,
    )
    watcher = AssetWatcher(name=f"{name}_milestones", trigger=trigger)
    return Asset(name, watchers=[watcher], **asset_kwargs)
