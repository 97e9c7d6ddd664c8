"""A gang's capacity asked of cluster-autoscaler: a ProvisioningRequest (pure).

Where cluster-autoscaler runs with ``--enable-provisioning-requests``, a spot gang can be gated
on a ProvisioningRequest instead of N placeholder pods: an ``autoscaling.x-k8s.io/v1``
ProvisioningRequest whose one pod set is N copies of the rank pod (a PodTemplate), of one of
two classes (cluster-autoscaler's FAQ, "Supported ProvisioningClasses"):

* ``capacity_check="atomic-scale-up"``: :data:`ATOMIC_SCALE_UP` (cluster-autoscaler >= 1.30.2).
  The autoscaler scales a node group up for all N at once (atomically where the cloud
  provider implements ``AtomicIncreaseSize``) and says ``Provisioned=True``
  (``CapacityIsProvisioned``) once the scale-up is asked: the nodes are still to come, so the
  gang's timeout (``gang_timeout_s``, counted from that grant: give it the nodes' boot) ends
  a gang whose nodes the cloud does not deliver. The grant, and so the spot bill and the
  measured changeover, start at the ask, the nodes' boot inside them. (Where the N pods fit
  already, it says ``CapacityIsFound`` as check-capacity does.) This is the one for spot
  nodes that scale from zero.
* ``capacity_check="provisioning-request"``: :data:`CHECK_CAPACITY`. The autoscaler only
  simulates scheduling the N pods on the nodes *already in the cluster*; it never scales up.
  It sees spot only where spot nodes stand (a fixed spot pool, or nodes another job keeps):
  on a spot node group that scales from zero it answers ``CapacityIsNotFound`` for ever, and
  the gang always falls back to on-demand.

The conditions (cluster-autoscaler's ``provisioningrequest/conditions``):

* ``Provisioned=True`` (reason ``CapacityIsFound``, or ``CapacityIsProvisioned`` for the
  atomic class): all N fit now, or were asked for together ("N seen"); the autoscaler books
  that capacity for 10 minutes for the pods that carry :data:`CONSUME_ANNOTATION`;
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
ATOMIC_SCALE_UP = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
NOT_FOUND = "CapacityIsNotFound"
PLACEHOLDERS, PROVISIONING_REQUEST, ATOMIC = (
    "placeholders",
    "provisioning-request",
    "atomic-scale-up",
)
CAPACITY_CHECKS = (PLACEHOLDERS, ATOMIC, PROVISIONING_REQUEST)
CLASSES = {PROVISIONING_REQUEST: CHECK_CAPACITY, ATOMIC: ATOMIC_SCALE_UP}  # by capacity_check
UNKNOWN_CONDITIONS = ("BookingExpired", "CapacityRevoked")


def check_capacity_check(value: object) -> None:
    """``capacity_check``: one of :data:`CAPACITY_CHECKS`, each named with what it does."""
    if value not in CAPACITY_CHECKS:
        raise ConfigError(
            "backend.capacity_check",
            f"must be {PLACEHOLDERS!r} (N placeholder pods at the lowest priority ask the "
            f"autoscaler for the gang's nodes; works with Karpenter and cluster-autoscaler), "
            f"{ATOMIC!r} (a {ATOMIC_SCALE_UP} ProvisioningRequest: cluster-autoscaler >= "
            f"1.30.2 scales up all N at once) or {PROVISIONING_REQUEST!r} (a {CHECK_CAPACITY} "
            f"ProvisioningRequest: sees only nodes already in the cluster, never scales up); "
            f"both need cluster-autoscaler with --enable-provisioning-requests; got {value!r}",
        )


def request_name(job: str) -> str:
    """The ProvisioningRequest (and its PodTemplate) of a gang's Job."""
    return f"{job}-capacity"[:253]


def consume(pod: Mapping[str, Any], job: str, cls: str) -> dict[str, Any]:
    """The rank pod (API JSON) annotated to consume the gang's request of class ``cls`` (the
    autoscaler keeps the capacity it booked for the pods that carry it)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        CONSUME_ANNOTATION: request_name(job),
        CLASS_ANNOTATION: cls,
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
    *,
    job: str,
    nodes: int,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
    cls: str,
) -> dict[str, Any]:
    """The ProvisioningRequest of class ``cls`` for N copies of the PodTemplate."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": request_name(job),
            "labels": dict(labels),
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            "provisioningClassName": cls,
            "podSets": [{"podTemplateRef": {"name": request_name(job)}, "count": int(nodes)}],
        },
    }


def request_signal(request: Any, nodes: int, pool: str = "") -> SpotSignal | None:
    """What a gang's request says of its N (see the module's notes): up ("N seen"), down
    ("fewer than N"), or None (unknown), at the condition's transition."""
    pr = as_dict(request)
    if not pr:
        return None
    name = pick(pick(pr, "metadata") or {}, "name")
    cls = pick(pick(pr, "spec") or {}, "provisioningClassName") or CHECK_CAPACITY
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
        f"{what}: ProvisioningRequest {name} ({cls}) "
        f"{pick(answer, 'type')}={pick(answer, 'status')} {pick(answer, 'reason')}: "
        f"{pick(answer, 'message') or ''}"
    ).rstrip(": ")
    if not up and cls == CHECK_CAPACITY:  # the one a user may not expect: say what it sees
        detail += (
            f" ({CHECK_CAPACITY} sees only nodes already in the cluster and never scales up; "
            f"for spot nodes that scale from zero use capacity_check={ATOMIC!r})"
        )
    return SpotSignal(up, at, "autoscaler", pool, detail)
