"""What an S3 store asks of S3 (issue 38): a listing follows every page without botocore's
paginator (the first one a client builds loads its model, ~14 ms, which every resume paid),
a listing that does not move on is an error, not a loop, and a call that succeeds does not
read the retry setting (an Airflow process reads its configuration for it). A stub client
stands in for S3: it answers in pages of its own."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_spot.checkpoint import s3
from airflow_spot.checkpoint.s3 import S3Store
from airflow_spot.exceptions import CheckpointError


class _Paged:
    """list_objects_v2 and list_multipart_uploads answered two keys a page; no paginator."""

    def __init__(self, keys: list[str], stuck: bool = False) -> None:
        self.keys, self.stuck = keys, stuck
        self.calls: list[dict[str, Any]] = []
        self.aborted: list[str] = []

    def get_paginator(self, name: str) -> Any:
        raise AssertionError(f"a paginator was built for {name}")

    def _page(self, at: int, prefix: str) -> tuple[list[str], bool]:
        keys = [k for k in self.keys if k.startswith(prefix)]
        return keys[at : at + 2], at + 2 < len(keys)

    def list_objects_v2(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        at = 0 if self.stuck else int(kw.get("ContinuationToken", 0))
        keys, more = self._page(at, kw["Prefix"])
        page: dict[str, Any] = {"Contents": [{"Key": k} for k in keys], "IsTruncated": more}
        if more:
            page["NextContinuationToken"] = str(at + 2)
        return page

    def list_multipart_uploads(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        at = int(kw.get("KeyMarker", 0))
        keys, more = self._page(at, kw["Prefix"])
        page: dict[str, Any] = {"Uploads": [{"Key": k, "UploadId": f"u-{k}"} for k in keys]}
        page["IsTruncated"] = more
        if more:
            page |= {"NextKeyMarker": str(at + 2), "NextUploadIdMarker": f"u{at + 2}"}
        return page

    def abort_multipart_upload(self, Key: str, **kw: Any) -> None:
        self.aborted.append(Key)


KEYS = [f"p/ckpt-00000000000{i}/shard.bin" for i in range(5)]


def test_a_listing_follows_every_page_without_a_paginator() -> None:
    client = _Paged(KEYS)
    store = S3Store("bkt", "p", client=client, training=True)
    assert store.list("ckpt-") == [k[2:] for k in KEYS]
    assert [c.get("ContinuationToken") for c in client.calls] == [None, "2", "4"]
    client.calls.clear()
    store.discard_partial("ckpt-", "ckpt-000000000003")  # aborts those of steps 0-2
    assert client.aborted == KEYS[:3]
    assert [(c.get("KeyMarker"), c.get("UploadIdMarker")) for c in client.calls] == [
        (None, None),
        ("2", "u2"),
        ("4", "u4"),
    ]


def test_a_listing_that_does_not_move_on_is_an_error_not_a_loop() -> None:
    client = _Paged(KEYS, stuck=True)  # the same page, truncated, whatever is asked
    with pytest.raises(CheckpointError, match="did not move on"):
        S3Store("bkt", "p", client=client, training=True).list("ckpt-")
    assert len(client.calls) == 2


def test_a_call_that_succeeds_reads_no_retry_setting(monkeypatch) -> None:
    def unread(*a: Any, **kw: Any) -> float:
        raise AssertionError("the retry setting was read for a call that succeeded")

    monkeypatch.setattr(s3, "s3_retry_s", unread)
    assert S3Store("bkt", "p", client=_Paged(KEYS)).list("ckpt-000000000001") == [KEYS[1][2:]]
