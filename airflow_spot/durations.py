"""Durations as people write them (``'48h'``, ``'90m'``, ``'600s'``, ``'2d'``): pure, shared by
the command line and the operator's deadline."""

from __future__ import annotations

import re

from airflow_spot.exceptions import ConfigError

_UNITS = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0, "d": 24.0}


def parse_hours(text: str, field: str = "duration") -> float:
    """``'48h'``, ``'90m'``, ``'0.2h'``, ``'2d'``, ``'600s'`` (or a bare number of hours) -> hours."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d)?\s*", str(text))
    if not m:
        raise ConfigError(field, f"{text!r} is not a duration; write e.g. 48h, 90m, 600s or 2d")
    return float(m.group(1)) * _UNITS[m.group(2) or "h"]
