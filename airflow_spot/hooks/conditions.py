"""The conditions the sensors and their triggers both check, over an Airflow AWS connection.

Importing this module imports no Airflow and no AWS SDK (a DAG file that builds a sensor
stays cheap to parse): the AWS hook is imported only when an ``s3://`` URI needs a client.
"""

from __future__ import annotations

from typing import Any

from airflow_spot.checkpoint.find import find_checkpoint as _find_checkpoint


def cheapest_below(prices: dict[str, float], threshold: float) -> dict[str, Any] | None:
    """The cheapest zone whose price is at or below ``threshold`` (None if there is none)."""
    ok = {z: p for z, p in prices.items() if p <= threshold}
    if not ok:
        return None
    zone = min(ok, key=lambda z: (ok[z], z))
    return {"zone": zone, "price": ok[zone], "threshold": threshold}


def s3_client_for(uri: str, aws_conn_id: str | None) -> Any:
    """An S3 client on the AWS connection ``aws_conn_id`` for an ``s3://`` checkpoint URI;
    None for a local URI or no connection (the store then uses boto3's own environment)."""
    if not (uri.startswith("s3://") and aws_conn_id):
        return None
    from airflow_spot.hooks.aws import SpotMarketHook

    return SpotMarketHook(aws_conn_id=aws_conn_id).s3_client()


def find_checkpoint(
    uri: str, min_step: int | None, newer_than: float | None, aws_conn_id: str | None
) -> dict[str, Any] | None:
    """The newest valid checkpoint meeting the bounds, as a manifest dict (None if there is none)."""
    from airflow_spot.checkpoint.stores import open_store

    store = open_store(uri, s3_client=s3_client_for(uri, aws_conn_id))
    return _find_checkpoint(uri, min_step, newer_than, store)
