"""A gang's capacity asked of cluster-autoscaler: a ``check-capacity`` ProvisioningRequest (pure).

Where cluster-autoscaler runs with ``--enable-provisioning-requests``, a spot gang can be gated
on a ProvisioningRequest instead of N placeholder pods (``capacity_check="provisioning-request"``
on the backend): an ``autoscaling.x-k8s.io/v1`` ProvisioningRequest of class
:data:`CHECK_CAPACITY` whose one pod set is N copies of the rank pod (a PodTemplate). The
autoscaler simulates scheduling those N pods on the cluster and answers in the request's
conditions (cluster-autoscaler's ``provisioningrequest/conditions``):

* ``Provisioned=True`` (reason ``CapacityIsFound``): all N fit now ("N seen"); the autoscaler
  books that capacity for 10 minutes for the pods that carry :data:`CONSUME_ANNOTATION`;
* ``Provisioned=False`` (``CapacityIsNotFound``: "CA will try to find it later"), or
  ``Failed=True`` with that reason (the request asked not to retry): fewer than N;
* ``Failed=True`` for another reason, ``BookingExpired`` or ``CapacityRevoked``, or no
  condition yet: unknown. ``CapacityAvailable`` (the class's earlier condition) reads as
  ``Provisioned``.

Builds the two manifests (owned by the gang's Job, so the garbage collector deletes them with
it) and reads a request's conditions as a :class:`~airflow_spot.backends.signals.SpotSignal`
(source ``autoscaler``); :mod:`.capacity_calls` does the calls.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from airflow_spot.backends.kubernetes.reading import as_dict, pick, wall_time
from airflow_spot.backends.signals import SpotSignal
from airflow_spot.exceptions import ConfigError

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
NOT_FOUND = "CapacityIsNotFound"
PLACEHOLDERS, PROVISIONING_REQUEST = "placeholders", "provisioning-request"
CAPACITY_CHECKS = (PLACEHOLDERS, PROVISIONING_REQUEST)
UNKNOWN_CONDITIONS = ("BookingExpired", "CapacityRevoked")


def check_capacity_check(value: object) -> None:
    """``capacity_check``: one of :data:`CAPACITY_CHECKS`, each named with what it does."""
    if value not in CAPACITY_CHECKS:
        raise ConfigError(
            "backend.capacity_check",
            f"must be {PLACEHOLDERS!r} (N placeholder pods at the lowest priority ask the "
            f"autoscaler for the gang's nodes; works with Karpenter and cluster-autoscaler) or "
            f"{PROVISIONING_REQUEST!r} (a {CHECK_CAPACITY} ProvisioningRequest; needs "
            f"cluster-autoscaler with --enable-provisioning-requests), got {value!r}",
        )


def request_name(job: str) -> str:
    """The ProvisioningRequest (and its PodTemplate) of a gang's Job."""
    return f"{job}-capacity"[:253]


def consume(pod: Mapping[str, Any], job: str) -> dict[str, Any]:
    """The rank pod (API JSON) annotated to consume the gang's request (the autoscaler keeps
    the capacity it booked for the pods that carry it)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        CONSUME_ANNOTATION: request_name(job),
        CLASS_ANNOTATION: CHECK_CAPACITY,
    }
    return out


def build_pod_template(
    pod: Mapping[str, Any], *, job: str, owner: Mapping[str, Any], labels: Mapping[str, str]
) -> dict[str, Any]:
    """The PodTemplate of the request: the rank pod's spec, without its scheduling gate."""
    spec = copy.deepcopy(dict(pick(pod, "spec") or {}))
    spec.pop("schedulingGates", None)
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": request_name(job),
            "labels": dict(labels),
            "ownerReferences": [dict(owner)],
        },
        "template": {"metadata": {"labels": dict(labels)}, "spec": spec},
    }


def build_request(
    *, job: str, nodes: int, owner: Mapping[str, Any], labels: Mapping[str, str]
) -> dict[str, Any]:
    """The ``check-capacity`` ProvisioningRequest for N copies of the PodTemplate."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": request_name(job),
            "labels": dict(labels),
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            "provisioningClassName": CHECK_CAPACITY,
            "podSets": [{"podTemplateRef": {"name": request_name(job)}, "count": int(nodes)}],
        },
    }


def request_signal(request: Any, nodes: int, pool: str = "") -> SpotSignal | None:
    """What a ``check-capacity`` request says of the gang's N (see the module's notes): up
    ("N seen"), down ("fewer than N"), or None (unknown), at the condition's transition."""
    pr = as_dict(request)
    if not pr:
        return None
    name = pick(pick(pr, "metadata") or {}, "name")
    conds = {pick(c, "type"): c for c in pick(pick(pr, "status") or {}, "conditions") or []}
    if any(pick(conds.get(t) or {}, "status") == "True" for t in UNKNOWN_CONDITIONS):
        return None
    failed = conds.get("Failed") or {}
    answer = conds.get("Provisioned") or conds.get("CapacityAvailable") or {}
    if pick(failed, "status") == "True":
        answer = failed if pick(failed, "reason") == NOT_FOUND else {}
        up = False
    else:
        up = pick(answer, "status") == "True"
        if not up and (pick(answer, "status") != "False" or pick(answer, "reason") != NOT_FOUND):
            return None
    at = wall_time(pick(answer, "last_transition_time", "lastTransitionTime"))
    if at is None:
        return None
    what = f"{nodes} seen" if up else f"fewer than {nodes}"
    detail = (
        f"{what}: ProvisioningRequest {name} ({CHECK_CAPACITY}) "
        f"{pick(answer, 'type')}={pick(answer, 'status')} {pick(answer, 'reason')}: "
        f"{pick(answer, 'message') or ''}"
    ).rstrip(": ")
    return SpotSignal(up, at, "autoscaler", pool, detail)
