"""Where a local checkpoint location may be: inside one of the folders of the provider setting
``[spot_training] allowed_local_checkpoint_roots``.

A ``checkpoint_uri`` is templated, and whoever may trigger the DAG fills ``dag_run.conf``: a
local path taken from it would let them choose where the worker writes checkpoints and its
``job-owner*.json`` claims, and where the training process's retention deletes ``ckpt-*``
folders. So the rendered path, resolved with its symlinks followed, must lie inside an
allowed root. The setting is read through Airflow's configuration when the task starts (never
at import: the operator's module must stay cheap to import). ``..`` is refused before this,
by :func:`airflow_spot.checkpoint.stores.validate_uri`, at parse time and once rendered.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from airflow_spot.exceptions import ConfigError
from airflow_spot.settings import CONFIG_SECTION, LOCAL_ROOTS_OPTION
from airflow_spot.settings import raw as setting

SETTING = f"[{CONFIG_SECTION}] {LOCAL_ROOTS_OPTION}"
SETTING_ENV = f"AIRFLOW__{CONFIG_SECTION}__{LOCAL_ROOTS_OPTION}".upper()


def allowed_roots() -> list[Path]:
    """The allowed roots, resolved, as Airflow's configuration gives them now (its default:
    ``{AIRFLOW_HOME}/spot_checkpoints``). A relative root is the setting's error."""
    from airflow.configuration import AIRFLOW_HOME

    roots = []
    for part in setting(LOCAL_ROOTS_OPTION).split(","):
        part = part.strip().replace("{AIRFLOW_HOME}", str(AIRFLOW_HOME))
        if not part:
            continue
        if not os.path.isabs(part):
            raise ConfigError(
                SETTING,
                f"{part!r} is not an absolute path; give absolute folders, comma-separated "
                f"(airflow.cfg, or the environment variable {SETTING_ENV})",
            )
        roots.append(Path(part).resolve())
    return roots


def local_path(uri: str) -> Path | None:
    """The folder a local ``checkpoint_uri`` names (None for S3)."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return None
    return Path(parsed.path if parsed.scheme == "file" else uri)


def check_local_root(uri: str) -> None:
    """Raise :class:`ConfigError` naming ``checkpoint_uri`` unless a local ``uri`` (rendered)
    lies inside an allowed root once resolved (symlinks followed, relative to the worker's
    working folder). Nothing is created or written."""
    path = local_path(uri)
    if path is None:
        return
    resolved = path.resolve()
    roots = allowed_roots()
    if any(resolved.is_relative_to(root) for root in roots):
        return
    allowed = ", ".join(str(r) for r in roots) or "none (the setting is empty: s3:// only)"
    raise ConfigError(
        "checkpoint_uri",
        f"{uri!r} resolves to {resolved}, outside the allowed local checkpoint roots "
        f"({allowed}); give a path inside one of them (or s3://bucket/prefix), or add its "
        f"folder to the provider setting {SETTING} (environment variable {SETTING_ENV}). "
        "Nothing was written there",
    )
