"""The API calls a gang makes beyond a pod's (:mod:`.api`): its Job, its headless Service,
its rank pods and placeholders. A Job or Service that is gone (404) is None or fine, a create
that met itself (409) is fine, and any other refusal is a
:class:`~airflow_spot.exceptions.BackendError` saying what was being done, and for a 403 the
permission the worker's service account lacks (``docker/rbac.yaml`` grants them).

Imported lazily (it imports the client), like :mod:`.api`, whose client (and its retries) it
shares.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client import BatchV1Api
from kubernetes.client.exceptions import ApiException

from airflow_spot.backends.kubernetes.api import KubeApi, api_message
from airflow_spot.backends.kubernetes.gang_launch import GATE, JOB_NAME_LABEL
from airflow_spot.backends.kubernetes.gating import PLACEHOLDER_LABEL
from airflow_spot.exceptions import BackendError

RBAC_HINT = (
    " (a gang needs create, get, list, watch, patch and delete on jobs (batch) and on "
    "services in the training namespace, beside the pods'; see docker/rbac.yaml)"
)


def _refused(e: ApiException, doing: str) -> BackendError:
    hint = RBAC_HINT if e.status == 403 else ""
    return BackendError(f"{doing}: {e.status} {e.reason}{hint}{api_message(e)}")


class GangApi:
    """Jobs, Services and rank pods in the backend's namespace, through its :class:`KubeApi`."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.core = api.core
        self.namespace = api.namespace
        self.batch = BatchV1Api(api.core.api_client)

    # -- the Job --------------------------------------------------------------------------
    def create_job(self, body: dict[str, Any]) -> Any:
        """Create the gang's Job; one of that name that exists (409: the retry of a create
        whose answer was lost) is read back. Returns the Job."""
        name = body["metadata"]["name"]
        try:
            return self.batch.create_namespaced_job(self.namespace, body)
        except ApiException as e:
            if e.status == 409:
                found = self.read_job(name)
                if found is not None:
                    return found
            raise _refused(e, f"could not create the gang's Job {name}") from e

    def read_job(self, name: str) -> Any:
        """The Job, or None when it is gone."""
        try:
            return self.batch.read_namespaced_job(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _refused(e, f"reading Job {name}") from e

    def jobs(self, selector: str) -> list[Any]:
        try:
            return self.batch.list_namespaced_job(self.namespace, label_selector=selector).items
        except ApiException as e:
            raise _refused(e, "listing the task's Jobs") from e

    def delete_job(self, name: str) -> None:
        """Delete the Job; its pods, Service and placeholders go with it (the garbage
        collector, in the background). Gone is fine."""
        try:
            self.batch.delete_namespaced_job(name, self.namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise _refused(e, f"deleting Job {name}") from e

    def annotate_job(self, name: str, annotations: dict[str, str]) -> bool:
        """Set annotations on the Job; False if it is gone."""
        try:
            self.batch.patch_namespaced_job(
                name, self.namespace, {"metadata": {"annotations": annotations}}
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise _refused(e, f"annotating Job {name}") from e
        return True

    # -- the Service and the pods -----------------------------------------------------------
    def create_service(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        try:
            self.core.create_namespaced_service(self.namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise _refused(e, f"could not create the gang's Service {name}") from e

    def delete_service(self, name: str) -> None:
        try:
            self.core.delete_namespaced_service(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise _refused(e, f"deleting Service {name}") from e

    def rank_pods(self, job: str) -> list[Any]:
        """The Job's pods (its ranks)."""
        return self.api.pods(f"{JOB_NAME_LABEL}={job}")

    def placeholders(self, job: str) -> list[Any]:
        return self.api.pods(f"{PLACEHOLDER_LABEL}={job}")

    def create_placeholder(self, body: dict[str, Any]) -> None:
        """Create a placeholder (a probe pod of the gang's); one that exists (409) is fine."""
        name = body["metadata"]["name"]
        for wait in (0.2, 0.5, 1.0, 2.0, None):
            try:
                self.core.create_namespaced_pod(self.namespace, body)
                return
            except ApiException as e:
                if e.status == 409:
                    return
                # a PriorityClass made a moment ago: the API server's admission has not seen
                # it yet (its cache lags the write)
                if e.status == 403 and "PriorityClass" in str(e.body) and wait is not None:
                    time.sleep(wait)
                    continue
                hint = (
                    f" (placeholders run at the PriorityClass "
                    f"{body['spec']['priorityClassName']!r}, as probes do: create it once from "
                    "probe.build_priority_class())"
                )
                raise BackendError(
                    f"could not create placeholder {name}: {e.status} {e.reason}{hint}"
                    f"{api_message(e)}"
                ) from e

    def lift_gate(self, pod: str) -> bool:
        """Remove the gang's scheduling gate from a rank pod (the only edit the API allows a
        gate: its removal; any other gate stays); False if the pod is gone."""
        body = {"spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}}
        try:
            self.core.patch_namespaced_pod(pod, self.namespace, body)
        except ApiException as e:
            if e.status == 404:
                return False
            raise _refused(e, f"lifting the gate {GATE} of pod {pod}") from e
        return True
