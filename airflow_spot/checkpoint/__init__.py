"""Checkpoints that are visible only when complete, in a directory or S3, and a training-loop helper.

Usable inside a training container with only the standard library (and boto3 for S3):
nothing here imports Airflow.
"""

from __future__ import annotations

from airflow_spot.checkpoint.base import Store
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.local import LocalStore
from airflow_spot.checkpoint.manifest import FileEntry, Manifest
from airflow_spot.checkpoint.s3 import S3Store
from airflow_spot.checkpoint.stores import open_store, validate_uri

__all__ = [
    "Checkpoints",
    "FileEntry",
    "LocalStore",
    "Manifest",
    "S3Store",
    "Store",
    "open_store",
    "validate_uri",
]
