"""The user's pod template: checked when the DAG is parsed, read when a pod is built.

``pod_template`` is a pod as API JSON (a dict) or the path of a YAML / JSON file holding one.
The check is light (no Kubernetes import at parse time): the shapes that would otherwise fail
deep inside the provider's reconcile at launch, as a ``ValueError`` mid-run, fail here with the
field named.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
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


_SUFFIX = {
    **{k: Decimal(1024) ** (i + 1) for i, k in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{k: Decimal(1000) ** (i + 1) for i, k in enumerate(("k", "M", "G", "T", "P", "E"))},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
}


def parse_quantity(q: Any) -> Decimal:
    """A Kubernetes quantity (``"64Gi"``, ``"500m"``, ``2``, ``"1e3"``) as a number; ValueError
    when it is not one (the API server's grammar, without importing the client)."""
    if isinstance(q, bool):
        raise ValueError(f"{q!r} is not a quantity")
    if isinstance(q, (int, float)):
        return Decimal(str(q))
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)", str(q))
    if m is None:
        raise ValueError(f"{q!r} is not a quantity (e.g. '64Gi', '500m', '2')")
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation as e:
        raise ValueError(f"{q!r} is not a quantity") from e


def check_resources(limits: dict[str, Any], requests: dict[str, Any]) -> None:
    """Quantities and requests the API server would refuse, named before any pod is sent."""
    for key, value in (*limits.items(), *requests.items()):
        try:
            parse_quantity(value)
        except ValueError as e:
            raise ConfigError("backend.resources", f"{key}: {e}") from e
    for key, req in requests.items():
        if key not in limits:
            continue
        r, lim = parse_quantity(req), parse_quantity(limits[key])
        if "/" in key and "kubernetes.io/" not in key and r != lim:  # extended: no overcommit
            raise ConfigError(
                "backend.resources",
                f"{key} request {req} must equal its limit {limits[key]} (an extended resource "
                "cannot be overcommitted); set only the limit, or `gpus`",
            )
        if r > lim:
            raise ConfigError(
                "backend.resources",
                f"{key} request {req} is above its limit {limits[key]} (the limit may come "
                "from the pod_template); raise the limit or lower the request",
            )
