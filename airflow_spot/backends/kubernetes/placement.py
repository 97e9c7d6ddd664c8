"""Where spot and on-demand pods go: placement presets per cloud (pure data).

Exact label and taint strings and their sources: ``../shared/research/anchors.md`` section 2
(E1 EKS managed node groups, KP4 Karpenter, G1 GKE Spot VMs, Z1 AKS spot node pools).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_spot.exceptions import ConfigError


@dataclass(frozen=True)
class Placement:
    """Node selector, tolerations and affinity for one capacity type (Kubernetes API JSON)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None


def _not_spot(key: str, values: list[str]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "NotIn", "values": values}]}
                ]
            }
        }
    }


PRESETS: dict[str, dict[str, Placement]] = {
    # EKS managed node groups label nodes eks.amazonaws.com/capacityType=SPOT|ON_DEMAND [E1]
    "eks": {
        "spot": Placement({"eks.amazonaws.com/capacityType": "SPOT"}),
        "on_demand": Placement({"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
    },
    # Karpenter: karpenter.sh/capacity-type=spot|on-demand [KP4]
    "karpenter": {
        "spot": Placement({"karpenter.sh/capacity-type": "spot"}),
        "on_demand": Placement({"karpenter.sh/capacity-type": "on-demand"}),
    },
    # GKE: cloud.google.com/gke-spot=true, optional taint of the same key on Standard pools [G1]
    "gke": {
        "spot": Placement(
            {"cloud.google.com/gke-spot": "true"},
            (
                {
                    "key": "cloud.google.com/gke-spot",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                },
            ),
        ),
        "on_demand": Placement(affinity=_not_spot("cloud.google.com/gke-spot", ["true"])),
    },
    # AKS: kubernetes.azure.com/scalesetpriority=spot label and NoSchedule taint, added automatically [Z1]
    "aks": {
        "spot": Placement(
            {"kubernetes.azure.com/scalesetpriority": "spot"},
            (
                {
                    "key": "kubernetes.azure.com/scalesetpriority",
                    "operator": "Equal",
                    "value": "spot",
                    "effect": "NoSchedule",
                },
            ),
        ),
        "on_demand": Placement(
            affinity=_not_spot("kubernetes.azure.com/scalesetpriority", ["spot"])
        ),
    },
}


def placement_for(preset: str | dict[str, Placement], capacity: str) -> Placement:
    """The placement of ``capacity`` ('spot' or 'on_demand') under a preset name or a custom preset."""
    table = PRESETS.get(preset) if isinstance(preset, str) else preset
    if table is None:
        raise ConfigError(
            "preset",
            f"unknown preset {preset!r}; use one of {', '.join(PRESETS)} or a custom "
            "{'spot': Placement(...), 'on_demand': Placement(...)}",
        )
    if capacity not in table:
        raise ConfigError(
            "preset", f"the preset has no {capacity!r} placement; give both 'spot' and 'on_demand'"
        )
    return table[capacity]
