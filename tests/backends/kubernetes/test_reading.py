"""Reading Kubernetes objects: both spellings of a field, and one timestamp parser for every
time the backend reads (pods, nodes, events, the autoscaler's status), odd inputs included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from kubernetes.client import V1ObjectMeta, V1Pod

from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time

T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2026-03-02T10:00:00Z", T0),  # what the API server writes
        ("2026-03-02T12:00:00+02:00", T0),
        ("2026-03-02T10:00:00+0000", T0),
        ("2026-03-02T10:00:00.123456789Z", T0 + 0.123456),  # beyond microseconds: cut
        ("2026-03-02 10:00:00.354884346 +0000 UTC", T0 + 0.354884),  # the autoscaler's Go time
        ("2026-03-02 10:00:00.1 +0000 UTC m=+13.183998415", T0 + 0.1),
        (datetime.fromtimestamp(T0, UTC), T0),  # the client's model objects
        (datetime(2026, 3, 2, 12, tzinfo=timezone(timedelta(hours=2))), T0),
        # no zone: UTC, as every Kubernetes time is (a YAML status may hold one)
        (datetime(2026, 3, 2, 10), T0),
        ("2026-03-02T10:00:00", T0),
        # odd text the API does not write, read as ISO 8601 reads it
        (" 2026-03-02T10:00:00z ", T0),
        ("2026-03-02T10:00:00,5Z", T0 + 0.5),
        ("2026-03-02T10:00Z", T0),
        ("20260302T100000Z", T0),
        ("2026-03-02", T0 - 10 * 3600),
        # nothing, or nothing readable
        (None, None),
        ("", None),
        ("not a time", None),
        ("2026-13-45T10:00:00Z", None),  # out of range
        (1772445600, None),  # a number is no API time
    ],
)
def test_every_api_time_is_read_by_one_parser(value, seconds) -> None:
    """Pods' and events' RFC 3339 times, the autoscaler's Go times and the client's datetimes
    give wall seconds; anything unreadable gives None (never an error)."""
    got = wall_time(value)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


def test_fields_are_read_under_either_spelling_from_models_or_json() -> None:
    """A model object reads through to_dict (snake_case), API JSON as it is (camelCase)."""
    model = as_dict(V1Pod(metadata=V1ObjectMeta(name="p", creation_timestamp=datetime(2026, 3, 2))))
    raw = as_dict({"metadata": {"name": "p", "creationTimestamp": "2026-03-02T00:00:00Z"}})
    for d in (model, raw):
        meta = pick(d, "metadata")
        assert pick(meta, "name") == "p"
        assert wall_time(pick(meta, "creation_timestamp", "creationTimestamp")) == T0 - 36000
    assert as_dict(None) == {} and pick(None, "x") is None and pick({"x": None}, "x") is None
    with pytest.raises(TypeError, match="cannot read int"):
        as_dict(3)
