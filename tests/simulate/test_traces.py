"""Trace loading: every format of the shared collection, and clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from airflow_spot.exceptions import TraceFormatError
from airflow_spot.simulate.traces import bundled, load_trace, load_traces


def _json(tmp_path: Path, data, name="t.json", **extra) -> Path:
    p = tmp_path / name
    p.write_text(
        json.dumps(
            {"metadata": {"gap_seconds": 600, **extra.pop("meta", {})}, "data": data, **extra}
        )
    )
    return p


def test_unavailability_windows_of_the_paper() -> None:
    """A bundled paper window loads with 1 = spot down, 554 ticks of 600 s."""
    t = load_trace(bundled("cant-be-late/us-west-2a_k80_1/0.json"), polarity="unavailable")
    raw = json.loads(bundled("cant-be-late/us-west-2a_k80_1/0.json").read_text())["data"]
    assert len(t) == 554 and t.gap_s == 600
    assert (t.available == (np.array(raw) == 0)).all()


def test_both_polarities(tmp_path: Path) -> None:
    """The same 0/1 data reads inverted under the two polarities."""
    p = _json(tmp_path, [1, 0, 0, 1])
    assert load_trace(p, polarity="available").available.tolist() == [True, False, False, True]
    assert load_trace(p, polarity="unavailable").available.tolist() == [False, True, True, False]


def test_polarity_is_required_for_01_json(tmp_path: Path) -> None:
    """A 0/1 JSON without a polarity is ambiguous: the error says what to pass."""
    with pytest.raises(
        TraceFormatError, match="polarity: .*'available' \\(1 = spot up\\) or 'unavailable'"
    ):
        load_trace(_json(tmp_path, [1, 0]))


def test_multinode_counts_need_the_cluster_size(tmp_path: Path) -> None:
    """Instance counts are up only at full size, and the size must be given."""
    p = _json(tmp_path, [4, 3, 0, 4, 2])
    assert load_trace(p, nodes=4).available.tolist() == [True, False, False, True, False]
    with pytest.raises(TraceFormatError, match="nodes: .*counts up to 4; pass nodes=N"):
        load_trace(p)
    # counts that happen never to exceed 1 stay counts when nodes is given, whatever polarity
    low = _json(tmp_path, [0, 1, 1, 0], name="low.json")
    assert not load_trace(low, nodes=2, polarity="available").available.any()
    with pytest.raises(TraceFormatError, match="nodes: .*drop nodes for this file"):
        load_trace(low, nodes=2, polarity="unavailable")


def test_prices_and_on_demand_price_are_read() -> None:
    """The GCP H100 sample carries per-tick spot prices and the on-demand price."""
    t = load_trace(bundled("gcp-h100/us-central1-a_h100_16.json"), polarity="unavailable")
    assert t.prices is not None and t.prices.shape == (len(t),)
    assert t.on_demand_price == pytest.approx(82.52543396)


def test_timestamped_csv_is_resampled(tmp_path: Path) -> None:
    """Probes ~195 s apart become 600 s ticks that are up only if every probe in them was."""
    p = tmp_path / "zone_v100_1.csv"
    rows = ["date,availability"] + [
        f"2023-02-15 00:{m:02d}:{s:02d},{v}"
        for m, s, v in [
            (0, 0, 1),
            (3, 15, 1),
            (6, 30, 1),
            (9, 45, 0),
            (13, 0, 1),
            (16, 15, 1),
            (19, 30, 1),
            (22, 45, 1),
        ]
    ]
    p.write_text("\n".join(rows) + "\n")
    (tmp_path / "spot_prices.json").write_text(json.dumps({"zone_v100_1": [1.0] * 4 + [2.0] * 4}))
    t = load_trace(p, gap_s=600)
    assert t.available.tolist() == [False, True, True]  # the 4th probe (585 s) was down
    assert t.prices.tolist() == pytest.approx([1.0, 2.0, 2.0])


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        ("not json", "a.json", "not valid JSON"),
        ('{"data": [1]}', "b.json", 'expected {"metadata"'),
        ('{"metadata": {}, "data": [1, 0]}', "c.json", "gap_seconds must be a positive number"),
        ('{"metadata": {"gap_seconds": 600}, "data": []}', "d.json", "non-empty list of whole"),
        ('{"metadata": {"gap_seconds": 600}, "data": [1, NaN, 0]}', "h.json", "whole numbers >= 0"),
        ('{"metadata": {"gap_seconds": 600}, "data": [1, Infinity]}', "i.json", "whole numbers"),
        ('{"metadata": {"gap_seconds": 600}, "data": [-1, 0.5]}', "j.json", "whole numbers >= 0"),
        ('{"metadata": {"gap_seconds": 600}, "data": [1, null]}', "k.json", "whole numbers"),
        ('{"metadata": {"gap_seconds": NaN}, "data": [1, 0]}', "l.json", "gap_seconds must be"),
        ('{"metadata": {"gap_seconds": true}, "data": [1, 0]}', "m.json", "gap_seconds must be"),
        (
            '{"metadata": {"gap_seconds": 600}, "data": [1, 0], "prices": [1.0, NaN]}',
            "n.json",
            "prices must be",
        ),
        (
            '{"metadata": {"gap_seconds": 600}, "data": [1, 0], "prices": ["a", "b"]}',
            "o.json",
            "prices must be",
        ),
        (
            '{"metadata": {"gap_seconds": 600, "price_info": {"on_demand_price": -3}}, "data": [1, 0]}',
            "p.json",
            "on_demand_price must be",
        ),
        ("date,avail\n2023-01-01 00:00:00,1\n", "e.csv", "header 'date,availability'"),
        ("date,availability\nyesterday,1\nnow,0\n", "f.csv", "bad row"),
        ("x", "g.txt", "expected a .json or .csv trace"),
    ],
)
def test_malformed_files_say_what_was_expected(
    tmp_path: Path, content: str, name: str, message: str
) -> None:
    """A malformed trace file raises TraceFormatError describing the expected format."""
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(p, polarity="available")


@pytest.mark.parametrize(
    ("tz", "day"),
    [("UTC", "2023-03-12"), ("America/New_York", "2023-03-12"), ("Europe/Berlin", "2023-03-26")],
)
def test_csv_times_without_a_zone_are_utc(tmp_path: Path, monkeypatch, tz: str, day: str) -> None:
    """Probes across a daylight-saving change load the same whatever the machine's time zone
    (local time would make them jump back an hour and the file be rejected)."""
    import time

    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        p = tmp_path / "z.csv"
        stamps = [f"{day} 02:50:00", f"{day} 03:00:00", f"{day} 03:10:00"]  # DST begins at 2:00
        p.write_text("\ufeffdate,availability\n" + "".join(f"{d},1\n\n" for d in stamps))
        t = load_trace(p)
        assert (len(t), t.gap_s, t.meta["start"]) == (3, 600.0, f"{day}T02:50:00+00:00")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_folder_loads_in_natural_order() -> None:
    """A folder of windows loads 0, 1, 2, ..., 10, 11 and names each by folder and stem."""
    ts = load_traces([bundled("cant-be-late/us-west-2a_v100_1")], polarity="unavailable")
    assert [t.name for t in ts][:3] == [
        "us-west-2a_v100_1/0",
        "us-west-2a_v100_1/1",
        "us-west-2a_v100_1/2",
    ]
    assert ts[-1].name == "us-west-2a_v100_1/11"


def test_load_trace_takes_a_bundled_name_as_its_error_says() -> None:
    tr = load_trace("bundled:cant-be-late/us-west-2a_v100_1/3.json", polarity="unavailable")
    assert tr.gap_s == 600 and len(tr.available) == 554
