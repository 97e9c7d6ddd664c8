"""Reading a Kubernetes object the way the API gives it: as the python client's model object or
as API JSON, each field under its snake_case or camelCase spelling, and its times as wall
seconds. Pure: no client import, no clock."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# RFC 3339 (``2026-09-15T04:05:52Z``) and the autoscaler's Go time (``2026-09-15
# 04:05:52.354884346 +0000 UTC m=+13.18``): a date, a time, a fraction and a zone, then anything
_TIME = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,](\d+))?\s*([+-]\d\d:?\d\d|Z)?")


def as_dict(obj: Any) -> dict[str, Any]:
    """A model object (through its ``to_dict()``) or a mapping as a dict; ``{}`` for None."""
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"cannot read {type(obj).__name__} as a Kubernetes object")


def pick(d: Mapping[str, Any] | None, *names: str) -> Any:
    """The first present field among snake_case / camelCase spellings."""
    if not d:
        return None
    for n in names:
        v = d.get(n)
        if v is not None:
            return v
    return None


def wall_time(value: Any) -> float | None:
    """Wall seconds of an API time: a datetime (the client's; one without a zone is UTC, as
    every Kubernetes time is), RFC 3339 text (``...Z``, an offset, any fraction), the
    autoscaler's Go time, or other ISO 8601 text; None if absent or unreadable."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    text = str(value).strip()
    m = _TIME.match(text)
    if m is None:
        return _iso_time(text)
    day, clock, frac, zone = m.groups()
    zone = "+0000" if zone in (None, "Z") else zone.replace(":", "")
    stamp = f"{day}T{clock}.{(frac or '0')[:6]}{zone}"
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:  # a field out of range (month 13, hour 25)
        return None


def _iso_time(text: str) -> float | None:
    """ISO 8601 forms RFC 3339 leaves out (a date alone, no seconds, no dashes), or None."""
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
