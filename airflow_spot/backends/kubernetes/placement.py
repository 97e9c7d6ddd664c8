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

    def __post_init__(self) -> None:
        if not isinstance(self.node_selector, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.node_selector.items()
        ):
            raise ConfigError(
                "placement.node_selector",
                f"must map label keys to strings, got {self.node_selector!r}",
            )
        if isinstance(self.tolerations, dict):
            raise ConfigError(
                "placement.tolerations", "give a list of tolerations: wrap it in [...]"
            )
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        for t in self.tolerations:
            unknown = set(t) - TOLERATION_FIELDS if isinstance(t, dict) else {"(not a mapping)"}
            if unknown:
                raise ConfigError(
                    "placement.tolerations",
                    f"unknown field(s) {sorted(unknown)} in {t!r}; a toleration has "
                    f"{sorted(TOLERATION_FIELDS - {'toleration_seconds'})}",
                )
            if t.get("operator", "Equal") not in ("Equal", "Exists"):
                raise ConfigError(
                    "placement.tolerations",
                    f"operator must be Equal or Exists, got {t['operator']!r}",
                )
            if t.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
                raise ConfigError(
                    "placement.tolerations",
                    f"effect must be NoSchedule, PreferNoSchedule or NoExecute, got {t['effect']!r}",
                )
        if self.affinity is not None and not isinstance(self.affinity, dict):
            raise ConfigError("placement.affinity", "must be an affinity as API JSON (a dict)")


TOLERATION_FIELDS = {
    "key",
    "operator",
    "value",
    "effect",
    "tolerationSeconds",
    "toleration_seconds",
}


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
    # Karpenter with a reserved fallback (ODCR or Capacity Blocks, capacity type "reserved",
    # Karpenter >= 1.3 with the ReservedCapacity gate): on-demand attempts may take reserved
    # or on-demand capacity, and Karpenter launches reserved first while the reservation
    # lasts (karpenter.sh/docs/tasks/odcrs): a gang's N fallback nodes without waiting for N
    # on-demand instances the market may not have
    "karpenter-reserved": {
        "spot": Placement({"karpenter.sh/capacity-type": "spot"}),
        "on_demand": Placement(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "karpenter.sh/capacity-type",
                                        "operator": "In",
                                        "values": ["reserved", "on-demand"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        ),
    },
}


def placement_for(preset: str | dict[str, Placement], capacity: str) -> Placement:
    """The placement of ``capacity`` ('spot' or 'on_demand') under a preset name or a custom preset."""
    table = PRESETS.get(preset) if isinstance(preset, str) else preset
    if table is None:
        raise ConfigError(
            "backend.preset",
            f"unknown preset {preset!r}; use one of {', '.join(PRESETS)} or a custom "
            "{'spot': Placement(...), 'on_demand': Placement(...)}",
        )
    if capacity not in table:
        raise ConfigError(
            "backend.preset",
            f"the preset has no {capacity!r} placement; give both 'spot' and 'on_demand'",
        )
    return table[capacity]
