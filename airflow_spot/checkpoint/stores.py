"""Which store a checkpoint URI names (a path, ``file://`` or ``s3://bucket/prefix``), and
the URI's shape checked without touching disk or network. No Airflow import; boto3 only once
an S3 store is used."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from airflow_spot.checkpoint.base import Store
from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.checkpoint.s3 import S3Store
from airflow_spot.exceptions import ConfigError


def validate_uri(uri: str, field: str = "checkpoint_uri") -> str:
    """Check a checkpoint URI's shape without touching disk or network."""
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(field, "must be a path, file:///path or s3://bucket/prefix")
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc or not re.fullmatch(
            r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", parsed.netloc
        ):
            raise ConfigError(
                field, f"{uri!r}: S3 URIs look like s3://bucket/prefix with a valid bucket name"
            )
        if any(p in ("..", ".") for p in parsed.path.split("/")):
            raise ConfigError(field, f"{uri!r}: the prefix must not contain '.' or '..'")
    elif parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ConfigError(field, f"{uri!r}: file URIs look like file:///absolute/path")
    elif parsed.scheme and len(parsed.scheme) > 1:
        raise ConfigError(
            field, f"{uri!r}: unsupported scheme {parsed.scheme!r}; use a path, file:// or s3://"
        )
    if parsed.scheme != "s3" and ".." in (parsed.path if parsed.scheme else uri).split("/"):
        # a templated part (dag_run.conf) would otherwise step out of the folder it names
        raise ConfigError(
            field,
            f"{uri!r}: a local path must not contain '..' (it would leave the folder it "
            "names); give the folder itself, e.g. /data/spot_checkpoints/my-run, and keep "
            "templated parts (dag_run.conf) free of '..'",
        )
    return uri


def open_store(uri: str, *, s3_client: Any = None, training: bool = False) -> Store:
    """The store for a checkpoint URI (a path, ``file://`` or ``s3://bucket/prefix``); an S3
    client built from an Airflow connection may be given. ``training``: opened by the
    training process (its errors then give the advice that fits it)."""
    validate_uri(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return S3Store(parsed.netloc, parsed.path, client=s3_client, training=training)
    if parsed.scheme == "file":
        return LocalStore(parsed.path)
    return LocalStore(uri)
