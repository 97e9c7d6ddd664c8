"""Operators. ``from airflow_spot.operators import SpotTrainingOperator``."""

from __future__ import annotations

from airflow_spot.operators.spot_training import SpotTrainingOperator

__all__ = ["SpotTrainingOperator"]
