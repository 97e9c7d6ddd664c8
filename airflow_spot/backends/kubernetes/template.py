"""The user's pod template: checked when the DAG is parsed, read when a pod is built.

``pod_template`` is a pod as API JSON (a dict) or the path of a YAML / JSON file holding one.
The check is light (no Kubernetes import at parse time): the shapes that would otherwise fail
deep inside the provider's reconcile at launch, as a ``ValueError`` mid-run, fail here with the
field named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_spot.exceptions import ConfigError

FIELD = "backend.pod_template"
LISTS = ("containers", "initContainers", "volumes", "tolerations", "imagePullSecrets")


def check_pod_template(tmpl: Any) -> None:
    """Raise :class:`ConfigError` for a template that cannot be a pod."""
    if tmpl is None:
        return
    if isinstance(tmpl, (str, Path)):
        if not str(tmpl).strip():
            raise ConfigError(FIELD, "give a pod (API JSON dict) or a YAML/JSON file path, not ''")
        return  # a path is read on the worker, where the file lives
    if not isinstance(tmpl, dict):
        raise ConfigError(
            FIELD,
            f"must be a pod as an API JSON dict or a YAML/JSON file path, got {type(tmpl).__name__}",
        )
    if tmpl.get("kind") not in (None, "Pod"):
        raise ConfigError(FIELD, f"must be a Pod, got kind {tmpl['kind']!r}")
    spec = tmpl.get("spec", {})
    if not isinstance(spec, dict):
        raise ConfigError(FIELD, f"'spec' must be a mapping, got {type(spec).__name__}")
    for key in LISTS:
        if key in spec and not isinstance(spec[key], list):
            raise ConfigError(
                FIELD,
                f"spec.{key} must be a list, got {type(spec[key]).__name__}: wrap it in [...]",
            )
    for i, c in enumerate(spec.get("containers") or []):
        if not isinstance(c, dict):
            raise ConfigError(FIELD, f"spec.containers[{i}] must be a mapping")
        for key in ("env", "volumeMounts", "envFrom", "ports"):
            if key in c and not isinstance(c[key], list):
                raise ConfigError(FIELD, f"spec.containers[{i}].{key} must be a list")
    meta = tmpl.get("metadata", {})
    if not isinstance(meta, dict):
        raise ConfigError(FIELD, "'metadata' must be a mapping")
    for key in ("labels", "annotations"):
        if not isinstance(meta.get(key, {}), dict):
            raise ConfigError(FIELD, f"metadata.{key} must be a mapping")


def load_pod_template(tmpl: Any):
    """The template as a ``V1Pod`` (None without one). A path is read here, on the worker."""
    if tmpl is None:
        return None
    if isinstance(tmpl, (str, Path)):
        path = Path(tmpl).expanduser()
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(FIELD, f"cannot read {path}: {e.strerror or e}") from e
        import yaml

        try:
            tmpl = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            raise ConfigError(FIELD, f"{path} is not valid YAML/JSON: {e}") from e
        if not isinstance(tmpl, dict):
            raise ConfigError(FIELD, f"{path} must hold one pod (a mapping)")
        check_pod_template(tmpl)
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    return PodGenerator.deserialize_model_dict(tmpl)
