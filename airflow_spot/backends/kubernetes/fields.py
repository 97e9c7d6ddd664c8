"""The Kubernetes backend's configuration: the checks of every field of
:class:`~airflow_spot.backends.kubernetes.backend.KubernetesBackend` and its node pools
(:class:`KubePool`), each error naming the field and its fix (a wrong field would otherwise
fail at launch, or never), and the settings' stored form (JSON: the operator's task state and
the trigger carry it). Pure: nothing here reaches a server."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from airflow_spot.backends.base import check_pool_price, check_pools
from airflow_spot.backends.kubernetes.placement import Placement, placement_for
from airflow_spot.backends.kubernetes.template import check_pod_template, check_resources
from airflow_spot.exceptions import ConfigError, finite_number

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # DNS-1123 label
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # DNS-1123 subdomain
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
DELETE_POLICIES = ("always", "on_success", "never")


@dataclass(frozen=True)
class KubePool:
    """One spot node pool (zone, instance type or node group): where its pods go and its price.

    :param placement: node selector / tolerations / affinity of this pool's spot nodes.
    :param spot_price: a fixed price per hour, or
    :param price_from: a live price through an Airflow AWS connection:
        ``{"aws_conn_id": ..., "instance_type": ..., "zone": ...}``.
    """

    name: str
    placement: Placement
    spot_price: float | None = None
    price_from: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _LABEL.fullmatch(self.name):
            raise ConfigError(
                "backend.pools",
                f"pool name {self.name!r} must be a short lowercase name (letters, digits, '-')",
            )
        if not isinstance(self.placement, Placement):
            raise ConfigError(
                "backend.pools",
                f"pool {self.name!r}: placement must be a Placement(node_selector=..., "
                f"tolerations=...), got {type(self.placement).__name__}",
            )
        check_pool_price(self.name, self.spot_price, self.price_from)


def check_backend_fields(b: Any) -> None:
    """Check a ``KubernetesBackend``'s fields (normalising ``env_from_secrets`` to a tuple and
    ``pools`` to :class:`KubePool` objects); raise :class:`ConfigError` naming the first wrong
    one."""
    if not b.image:
        raise ConfigError("backend.image", "give the training image, e.g. 'ghcr.io/me/train:1.0'")
    if b.delete_pods not in DELETE_POLICIES:
        raise ConfigError(
            "backend.delete_pods", f"must be one of {DELETE_POLICIES}, got {b.delete_pods!r}"
        )
    placement_for(b.preset, "spot")
    placement_for(b.preset, "on_demand")
    if not isinstance(b.allow_privileged, bool):
        raise ConfigError(
            "backend.allow_privileged", f"must be True or False, got {b.allow_privileged!r}"
        )
    check_pod_template(b.pod_template, b.allow_privileged)
    if isinstance(b.gpus, bool) or not isinstance(b.gpus, int) or b.gpus < 0:
        raise ConfigError("backend.gpus", f"must be a whole number >= 0, got {b.gpus!r}")
    if b.resources is not None and (
        not isinstance(b.resources, dict)
        or set(b.resources) - {"limits", "requests"}
        or not all(isinstance(v, dict) for v in b.resources.values())
    ):
        raise ConfigError(
            "backend.resources",
            'give {"limits": {...}, "requests": {...}}, e.g. {"limits": {"memory": "64Gi"}}, '
            f"got {b.resources!r}",
        )
    _check_shapes(b)


def _check_shapes(b: Any) -> None:
    """The remaining fields' types and shapes, each named."""
    if not isinstance(b.namespace, str) or not _LABEL.fullmatch(b.namespace):
        raise ConfigError(
            "backend.namespace",
            f"must be a Kubernetes namespace name (lowercase letters, digits and '-', at "
            f"most 63), got {b.namespace!r}",
        )
    if isinstance(b.preset, dict):
        for cap in ("spot", "on_demand"):
            if not isinstance(b.preset.get(cap), Placement):
                raise ConfigError(
                    "backend.preset",
                    f"a custom preset maps 'spot' and 'on_demand' to Placement(...) objects, "
                    f"got {type(b.preset.get(cap)).__name__} for {cap!r}",
                )
    for name in ("pending_timeout_s", "spot_cooldown_s"):
        v = getattr(b, name)
        if not (finite_number(v) and v > 0):
            raise ConfigError(f"backend.{name}", f"must be a number of seconds > 0, got {v!r}")
    g = b.grace_period_s
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
        raise ConfigError("backend.grace_period_s", f"must be whole seconds >= 0, got {g!r}")
    if not isinstance(b.env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str)
        for k, v in b.env.items()
    ):
        raise ConfigError(
            "backend.env",
            f'give {{"NAME": "value"}} with string values, got {b.env!r}',
        )
    secrets = b.env_from_secrets
    if isinstance(secrets, list):
        object.__setattr__(b, "env_from_secrets", secrets := tuple(secrets))
    if not isinstance(secrets, tuple) or not all(
        isinstance(x, str) and _SUBDOMAIN.fullmatch(x) for x in secrets
    ):
        raise ConfigError(
            "backend.env_from_secrets",
            f"give a tuple of Secret names, e.g. ('hf-token',), got {secrets!r}",
        )
    sa = b.service_account
    if sa is not None and not (isinstance(sa, str) and _SUBDOMAIN.fullmatch(sa)):
        raise ConfigError(
            "backend.service_account", f"must be a service account name or None, got {sa!r}"
        )
    for name in ("kubernetes_conn_id", "config_file"):
        v = getattr(b, name)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise ConfigError(f"backend.{name}", f"must be a non-empty string or None, got {v!r}")
    for name in ("in_cluster", "mount_service_account_token"):
        v = getattr(b, name)
        if not (isinstance(v, bool) or (v is None and name == "in_cluster")):
            raise ConfigError(f"backend.{name}", f"must be True or False, got {v!r}")
    object.__setattr__(b, "pools", check_pools(b.pools, KubePool))
    if b.resources:
        check_resources(b.resources.get("limits") or {}, b.resources.get("requests") or {})


def stored_settings(b: Any) -> dict[str, Any]:
    """A ``KubernetesBackend``'s settings as JSON, with its ``kind``."""
    d = asdict(b)
    if isinstance(b.preset, dict):
        d["preset"] = {k: asdict(v) for k, v in b.preset.items()}
    d["pools"] = [{**asdict(p), "placement": asdict(p.placement)} for p in b.pools]
    d["kind"] = "kubernetes"
    return d


def settings_from(d: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a ``KubernetesBackend`` stored by :func:`stored_settings`."""
    d = {k: v for k, v in d.items() if k != "kind"}
    if isinstance(d.get("preset"), dict):
        d["preset"] = {
            k: Placement(v["node_selector"], tuple(v["tolerations"]), v["affinity"])
            for k, v in d["preset"].items()
        }
    d["env_from_secrets"] = tuple(d.get("env_from_secrets") or ())
    d["pools"] = tuple(
        KubePool(
            p["name"], _placement_from(p["placement"]), p.get("spot_price"), p.get("price_from")
        )
        for p in d.get("pools") or ()
    )
    return d


def _placement_from(d: dict[str, Any]) -> Placement:
    return Placement(
        d.get("node_selector") or {}, tuple(d.get("tolerations") or ()), d.get("affinity")
    )
