"""The pure decision core: which capacity to use now so that the deadline is met at least cost.

Imports nothing from Airflow, Kubernetes or boto3, and never reads a clock: time is an
argument. The simulator, the local backend and the Kubernetes backend all call the same
:meth:`Policy.decide`.
"""

from __future__ import annotations

from airflow_spot.policy import baselines as _baselines  # noqa: F401  (registers the baselines)
from airflow_spot.policy import deadline_aware as _deadline_aware  # noqa: F401
from airflow_spot.policy import reserve as _reserve  # noqa: F401
from airflow_spot.policy.base import Policy, get_policy, policy_names, register, safety_net
from airflow_spot.policy.model import (
    HOUR,
    Capacity,
    Decision,
    JobSpec,
    Observation,
    SpotView,
    observation,
    observe,
)

__all__ = [
    "HOUR",
    "Capacity",
    "Decision",
    "JobSpec",
    "Observation",
    "Policy",
    "get_policy",
    "policy_names",
    "register",
    "SpotView",
    "observation",
    "observe",
    "safety_net",
]
