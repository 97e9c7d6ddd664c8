"""The embedded local backend."""

from __future__ import annotations

from airflow_spot.backends.local.backend import LocalBackend
from airflow_spot.backends.local.market import MarketSpec, ReplayMarket

__all__ = ["LocalBackend", "MarketSpec", "ReplayMarket"]
