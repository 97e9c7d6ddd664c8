"""Triggers of the deferrable sensors (same base class as the attempt triggers)."""

from __future__ import annotations

import time
from typing import Any

from airflow_spot.triggers.base import SpotPollingTrigger
from airflow_spot.triggers.events import EventKind, SpotEvent


class SpotPriceTrigger(SpotPollingTrigger):
    """Fires when the spot price of an instance type is at or below ``threshold`` in a zone."""

    def __init__(
        self,
        *,
        instance_type: str,
        zones: list[str],
        threshold: float,
        aws_conn_id: str | None,
        region_name: str | None = None,
        poll_interval: float = 300.0,
    ) -> None:
        super().__init__(
            poll_interval=poll_interval,
            instance_type=instance_type,
            zones=list(zones),
            threshold=threshold,
            aws_conn_id=aws_conn_id,
            region_name=region_name,
        )

    def poll(self) -> SpotEvent | None:
        from airflow_spot.hooks.aws import SpotMarketHook
        from airflow_spot.sensors.spot import cheapest_below

        k = self._kwargs
        hook = SpotMarketHook(aws_conn_id=k["aws_conn_id"], region_name=k["region_name"])
        found = cheapest_below(
            hook.current_spot_prices(k["instance_type"], k["zones"]), k["threshold"]
        )
        if found is None:
            return None
        return SpotEvent(
            EventKind.CONDITION_MET,
            time.time(),
            True,
            {**found, "instance_type": k["instance_type"]},
        )


class CheckpointTrigger(SpotPollingTrigger):
    """Fires when a valid checkpoint at or beyond ``min_step`` (or newer than ``newer_than``) exists."""

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        min_step: int | None,
        newer_than: float | None,
        aws_conn_id: str | None = None,
        poll_interval: float = 60.0,
    ) -> None:
        super().__init__(
            poll_interval=poll_interval,
            checkpoint_uri=checkpoint_uri,
            min_step=min_step,
            newer_than=newer_than,
            aws_conn_id=aws_conn_id,
        )

    def poll(self) -> SpotEvent | None:
        from airflow_spot.sensors.checkpoint import find_checkpoint

        k: dict[str, Any] = self._kwargs
        found = find_checkpoint(
            k["checkpoint_uri"], k["min_step"], k["newer_than"], k["aws_conn_id"]
        )
        return (
            None if found is None else SpotEvent(EventKind.CONDITION_MET, time.time(), None, found)
        )
