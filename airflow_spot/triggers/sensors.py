"""Triggers of the deferrable sensors (same base class as the attempt triggers).

Each builds its client once, on the first poll (a ``cached_property``, as the amazon provider's
triggers do), and reuses it for every poll after; what they check is shared with the sensors
through :mod:`airflow_spot.hooks.conditions` and :mod:`airflow_spot.checkpoint.find`.
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_spot.triggers.base import SpotPollingTrigger
from airflow_spot.triggers.events import EventKind, SpotEvent

if TYPE_CHECKING:
    from airflow_spot.checkpoint.base import Store
    from airflow_spot.hooks.aws import SpotMarketHook


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

    @cached_property
    def hook(self) -> SpotMarketHook:
        """The hook of every poll: its connection and EC2 clients are built once. Its answer
        cache is off (``cache_ttl_s=0``): each poll asks for prices afresh."""
        from airflow_spot.hooks.aws import SpotMarketHook

        k = self._kwargs
        return SpotMarketHook(
            aws_conn_id=k["aws_conn_id"], region_name=k["region_name"], cache_ttl_s=0.0
        )

    def poll(self) -> SpotEvent | None:
        from airflow_spot.hooks.conditions import cheapest_below

        k = self._kwargs
        found = cheapest_below(
            self.hook.current_spot_prices(k["instance_type"], k["zones"]), k["threshold"]
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

    @cached_property
    def store(self) -> Store:
        """The store of every poll (for ``s3://``, its S3 client on ``aws_conn_id``), built once."""
        from airflow_spot.checkpoint.stores import open_store
        from airflow_spot.hooks.conditions import s3_client_for

        uri = self._kwargs["checkpoint_uri"]
        return open_store(uri, s3_client=s3_client_for(uri, self._kwargs["aws_conn_id"]))

    def poll(self) -> SpotEvent | None:
        from airflow_spot.checkpoint.find import find_checkpoint

        k: dict[str, Any] = self._kwargs
        found = find_checkpoint(k["checkpoint_uri"], k["min_step"], k["newer_than"], self.store)
        return (
            None if found is None else SpotEvent(EventKind.CONDITION_MET, time.time(), None, found)
        )
