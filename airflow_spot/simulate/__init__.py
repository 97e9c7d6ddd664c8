"""Trace loading, tick replay with the paper's rules, and the exact omniscient optimum."""

from __future__ import annotations

from airflow_spot.simulate.engine import RunResult, replay
from airflow_spot.simulate.traces import Trace, load_trace, load_traces

__all__ = ["RunResult", "Trace", "load_trace", "load_traces", "replay"]
