"""Sensors: ``SpotPriceSensor`` and ``CheckpointSensor`` (deferrable by default)."""

from __future__ import annotations

from airflow_spot.sensors.checkpoint import CheckpointSensor
from airflow_spot.sensors.spot import SpotPriceSensor

__all__ = ["CheckpointSensor", "SpotPriceSensor"]
