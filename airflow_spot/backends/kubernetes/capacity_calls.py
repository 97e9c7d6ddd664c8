"""The API reads behind a gang's capacity signals: Karpenter's NodeClaims for the gang's pods
(:mod:`.capacity_signals`) and the gang's ProvisioningRequest (:mod:`.provisioning`).

Each read goes through the backend's :class:`~.cluster.ClusterView` (a 403 is one warning
naming the permission, then that source is left out; other failures skip it this time), so a
worker without these permissions still runs, with the signal unknown. Imported when first used
(it imports the Kubernetes client).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_spot.backends.kubernetes.capacity_signals import (
    NOMINATED_REASON,
    ClaimCount,
    claim_count,
)
from airflow_spot.backends.kubernetes.signals import ICE_REASON

NODECLAIMS = ("karpenter.sh", "v1", "nodeclaims")


def count_claims(
    view: Any, namespace: str, pods: Iterable[str], nodes: int, since: float, now: float
) -> ClaimCount:
    """What Karpenter did for ``pods`` (a gang's N, made at ``since``) in ``namespace``:
    their nominations, and which NodeClaims failed for capacity or launched."""
    from kubernetes.client import CustomObjectsApi

    names = list(pods)
    nominated = view.read(
        "karpenter-nominations",
        f"list events in namespace {namespace}",
        view.core.list_namespaced_event,
        namespace,
        field_selector=f"reason={NOMINATED_REASON},involvedObject.kind=Pod",
    )
    pod_events = nominated.items if nominated is not None else []
    ice: list[Any] = []
    if pod_events:
        got = view.read(
            "karpenter",
            "list events in all namespaces",
            view.core.list_event_for_all_namespaces,
            field_selector=f"reason={ICE_REASON},involvedObject.kind=NodeClaim",
        )
        ice = got.items if got is not None else []
    claims: list[Any] = []
    if pod_events:
        group, version, plural = NODECLAIMS
        got = view.read(
            "nodeclaims",
            f"list {plural} ({group})",
            CustomObjectsApi(view.core.api_client).list_cluster_custom_object,
            group,
            version,
            plural,
        )
        claims = list(got["items"]) if got is not None else []
    return claim_count(nodes, names, pod_events, ice, claims, since, now)


# -- a gang's ProvisioningRequest -----------------------------------------------------------------
PR_HINT = (
    " (capacity_check='atomic-scale-up' or 'provisioning-request' needs create, get and delete "
    "on podtemplates and on provisioningrequests (autoscaling.x-k8s.io) in the training "
    "namespace; see docker/rbac.yaml)"
)


def create_request(api: Any, template: dict[str, Any], request: dict[str, Any]) -> None:
    """Create the request's PodTemplate, then the request (one already there, 409, is fine).
    A 404 means the cluster serves no ProvisioningRequest API (no cluster-autoscaler CRD)."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    from airflow_spot.backends.kubernetes.api import api_message
    from airflow_spot.backends.kubernetes.provisioning import GROUP, PLURAL, VERSION
    from airflow_spot.exceptions import BackendError

    ns, custom = api.namespace, CustomObjectsApi(api.core.api_client)
    calls = (
        ("PodTemplate", lambda: api.core.create_namespaced_pod_template(ns, template)),
        (
            "ProvisioningRequest",
            lambda: custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, request),
        ),
    )
    for kind, create in calls:
        try:
            create()
        except ApiException as e:
            if e.status == 409:
                continue
            hint = PR_HINT if e.status == 403 else ""
            if e.status == 404:
                hint = (
                    f" (the cluster serves no {PLURAL}.{GROUP}/{VERSION}: install "
                    "cluster-autoscaler's ProvisioningRequest CRD and run it with "
                    "--enable-provisioning-requests, or use capacity_check='placeholders')"
                )
            name = template["metadata"]["name"]
            raise BackendError(
                f"could not create the gang's {kind} {name}: {e.status} {e.reason}{hint}"
                f"{api_message(e)}"
            ) from e


def read_request(view: Any, namespace: str, name: str) -> Any:
    """The request (API JSON), or None when gone or unreadable (a 403: one warning)."""
    from kubernetes.client import CustomObjectsApi

    from airflow_spot.backends.kubernetes.provisioning import GROUP, PLURAL, VERSION

    return view.read(
        "provisioning-requests",
        f"get {PLURAL} ({GROUP}) in namespace {namespace}",
        CustomObjectsApi(view.core.api_client).get_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
    )


def delete_request(api: Any, name: str) -> None:
    """Delete the request and its PodTemplate; gone already (404) is fine. A 403 is the
    ``BackendError`` that names the RBAC rule to add (the garbage collector would delete both
    with the Job, but a request left there keeps the capacity it booked for 10 minutes)."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    from airflow_spot.backends.kubernetes.api import api_message
    from airflow_spot.backends.kubernetes.provisioning import GROUP, PLURAL, VERSION
    from airflow_spot.exceptions import BackendError

    ns, custom = api.namespace, CustomObjectsApi(api.core.api_client)
    for kind, delete in (
        (
            "ProvisioningRequest",
            lambda: custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name),
        ),
        ("PodTemplate", lambda: api.core.delete_namespaced_pod_template(name, ns)),
    ):
        try:
            delete()
        except ApiException as e:
            if e.status == 404:
                continue
            hint = PR_HINT if e.status == 403 else ""
            raise BackendError(
                f"could not delete the gang's {kind} {name}: {e.status} {e.reason}{hint}"
                f"{api_message(e)}"
            ) from e
