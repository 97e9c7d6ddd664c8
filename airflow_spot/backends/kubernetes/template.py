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


def check_pod_template(tmpl: Any, allow_privileged: bool = False) -> None:
    """Raise :class:`ConfigError` for a template that cannot be a pod, or (unless
    ``allow_privileged``) one that asks for its node (see :func:`check_privileges`)."""
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
    if not allow_privileged:
        check_privileges(spec)


# capabilities a container may add at Pod Security "baseline" (any other one reaches the node)
BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD"}
    | {"NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def check_privileges(spec: dict[str, Any]) -> None:
    """Refuse a template spec that asks for its node: a host namespace, a hostPath volume, a
    host port, root, a privileged container, privilege escalation or a capability beyond
    Pod Security "baseline". Each error names the field's path; a platform team then need not
    rely on Pod Security Admission being set. ``KubernetesBackend(allow_privileged=True)``
    lets them through (our own defaults then step aside, see :mod:`.pods`)."""
    for key in HOST_NAMESPACES:
        if spec.get(key):
            _refuse(f"spec.{key}", f"{key}: true shares the node's namespace with the pod")
    for i, vol in enumerate(spec.get("volumes") or []):
        if isinstance(vol, dict) and vol.get("hostPath") is not None:
            _refuse(
                f"spec.volumes[{i}].hostPath",
                "a hostPath volume opens the node's file system to the pod; use a "
                "persistentVolumeClaim, emptyDir or CSI volume",
            )
    _check_security(spec.get("securityContext"), "spec.securityContext")
    for key in CONTAINER_LISTS:
        for i, c in enumerate(spec.get(key) or []):
            if not isinstance(c, dict):
                continue
            at = f"spec.{key}[{i}]"
            _check_security(c.get("securityContext"), f"{at}.securityContext")
            for j, port in enumerate(c.get("ports") or []):
                if isinstance(port, dict) and port.get("hostPort"):
                    _refuse(f"{at}.ports[{j}].hostPort", "a host port binds the node's network")


def _check_security(sc: Any, at: str) -> None:
    """A pod's or container's securityContext: root, privilege, escalation, capabilities."""
    if not isinstance(sc, dict):
        return
    if sc.get("privileged"):
        _refuse(f"{at}.privileged", "a privileged container has every power over its node")
    if sc.get("allowPrivilegeEscalation") is True:
        _refuse(f"{at}.allowPrivilegeEscalation", "lets a process gain more privileges")
    if sc.get("runAsUser") == 0:
        _refuse(f"{at}.runAsUser", "0 runs the container as root")
    if sc.get("runAsNonRoot") is False:
        _refuse(f"{at}.runAsNonRoot", "false lets the container run as root")
    caps = sc.get("capabilities")
    added = caps.get("add") if isinstance(caps, dict) else None
    for k, cap in enumerate(added or []):
        if str(cap).upper().removeprefix("CAP_") not in BASELINE_CAPABILITIES:
            _refuse(f"{at}.capabilities.add[{k}]", f"{cap} reaches beyond the container")


def _refuse(path: str, why: str) -> None:
    raise ConfigError(
        f"{FIELD}.{path}",
        f"{why}; refused by default. Remove it from the pod template, or pass "
        "KubernetesBackend(allow_privileged=True) if your cluster's policy allows such pods",
    )


def load_pod_template(tmpl: Any, allow_privileged: bool = False):
    """The template as a ``V1Pod`` (None without one). A path is read here, on the worker,
    and checked as a dict is when the DAG is parsed (its privileges too)."""
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
        check_pod_template(tmpl, allow_privileged)
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
