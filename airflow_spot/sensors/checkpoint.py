"""``CheckpointSensor``: wait for a checkpoint at or beyond a step (or newer than a time).

``find_checkpoint`` (the check over an AWS connection) lives in
:mod:`airflow_spot.hooks.conditions`, on top of :mod:`airflow_spot.checkpoint.find`, which its
trigger shares; it stays importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import PokeReturnValue

from airflow_spot.checkpoint.stores import validate_uri
from airflow_spot.exceptions import ConfigError
from airflow_spot.hooks.conditions import find_checkpoint
from airflow_spot.sensors.base import DeferrableSpotSensor


class CheckpointSensor(DeferrableSpotSensor):
    """Wait until a valid checkpoint at or beyond ``min_step`` (or newer than ``newer_than``)
    exists under ``checkpoint_uri``; returns its manifest. Lets a downstream task evaluate
    intermediate checkpoints while training continues.

    :param checkpoint_uri: a path, ``file://`` or ``s3://bucket/prefix``. Templated.
    :param min_step: the step to reach.
    :param newer_than: or a time the checkpoint must be newer than (timezone-aware).
    :param aws_conn_id: the AWS connection for ``s3://`` URIs (None: boto3's own environment).
    :param deferrable: wait in the triggerer (default).
    """

    template_fields: Sequence[str] = ("checkpoint_uri",)

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        min_step: int | None = None,
        newer_than: datetime | None = None,
        aws_conn_id: str | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 60)
        super().__init__(**kwargs)
        if "{{" not in str(checkpoint_uri):
            validate_uri(checkpoint_uri)
        if min_step is None and newer_than is None:
            raise ConfigError("min_step", "give min_step (a step to reach) or newer_than (a time)")
        if min_step is not None and (not isinstance(min_step, int) or min_step < 0):
            raise ConfigError("min_step", f"must be an integer >= 0, got {min_step!r}")
        if newer_than is not None and (
            not isinstance(newer_than, datetime) or newer_than.tzinfo is None
        ):
            raise ConfigError("newer_than", "must be a timezone-aware datetime")
        self.checkpoint_uri = checkpoint_uri
        self.min_step = min_step
        self.newer_than = newer_than
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable

    def _newer(self) -> float | None:
        return self.newer_than.timestamp() if self.newer_than else None

    def poke(self, context: Any) -> PokeReturnValue:
        found = find_checkpoint(self.checkpoint_uri, self.min_step, self._newer(), self.aws_conn_id)
        return PokeReturnValue(is_done=found is not None, xcom_value=found)

    def trigger(self) -> Any:
        from airflow_spot.triggers.sensors import CheckpointTrigger

        return CheckpointTrigger(
            checkpoint_uri=self.checkpoint_uri,
            min_step=self.min_step,
            newer_than=self._newer(),
            aws_conn_id=self.aws_conn_id,
            poll_interval=float(self.poke_interval),
        )
