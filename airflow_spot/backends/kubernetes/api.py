"""The Kubernetes API calls the backend makes, behind one object: :class:`KubeApi`.

It holds the ``CoreV1Api`` (built through the cncf-kubernetes provider's ``KubernetesHook``,
transient failures retried by :mod:`.retry`) and the backend's namespace. Each call turns the
server's refusal into what the backend acts on: a pod or node that is gone (404) is None or
False, a create that met itself (409) is fine, and any other refusal is a
:class:`~airflow_spot.exceptions.BackendError` that says what was being done, the status and,
where it helps, the missing permission or the server's own message. This is the one module of
the backend that reads the client's ``ApiException`` (besides the retries).

Imported lazily (it imports the client): the backend's module stays light for DAG parsing.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from kubernetes.client import SchedulingV1Api
from kubernetes.client.exceptions import ApiException

from airflow_spot.backends.kubernetes.connection import settings_error
from airflow_spot.backends.kubernetes.retry import created_by_us
from airflow_spot.backends.kubernetes.retry import install as install_retries
from airflow_spot.backends.kubernetes.vocabulary import LAUNCHED_ANNOTATION
from airflow_spot.exceptions import BackendError

log = logging.getLogger(__name__)
RBAC_HINT = (
    " (the worker's service account needs get on nodes and list on events in all namespaces:"
    " the verdict reads the node's labels, taints and events; see docker/rbac.yaml)"
)
PATCH_HINT = (
    " (the worker's service account needs patch on pods in its namespace; see docker/rbac.yaml)"
)


def refusal(e: BaseException) -> tuple[int, str] | None:
    """(status, reason) of the API server's refusal, or None when ``e`` is no refusal."""
    return (e.status, e.reason) if isinstance(e, ApiException) else None


def api_message(e: Any) -> str:
    """``": <the server's own message>"`` from an ApiException's Status body, or "": a 403
    for a missing ServiceAccount reads like RBAC without it."""
    try:
        msg = json.loads(e.body or "").get("message")
    except (TypeError, ValueError, AttributeError):
        return ""
    return f": {msg}" if isinstance(msg, str) and msg else ""


def _refused(e: ApiException, doing: str, detail: str = "") -> BackendError:
    return BackendError(f"{doing}: {e.status} {e.reason}{detail}")


class KubeApi:
    """The calls on pods, nodes and events in ``namespace``, through ``core`` (a CoreV1Api)."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core = core
        self.namespace = namespace

    @classmethod
    def connect(cls, backend: Any) -> KubeApi:
        """Through the backend's connection settings (a setting that cannot be loaded is a
        ConfigError naming it, not the client's traceback), with the retries installed."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        hook = KubernetesHook(
            conn_id=backend.kubernetes_conn_id,
            config_file=backend.config_file,
            in_cluster=backend.in_cluster,
        )
        try:
            client = hook.core_v1_client
        except Exception as e:
            error = settings_error(backend, e)
            if error is None:
                raise
            raise error from e
        install_retries(client.api_client)  # transient API failures, retried (retry.py)
        return cls(client, backend.namespace)

    def as_json(self, obj: Any) -> Any:
        """A model object as API JSON."""
        return self.core.api_client.sanitize_for_serialization(obj)

    # -- pods -------------------------------------------------------------------------------
    def pods(self, label_selector: str) -> list[Any]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=label_selector).items

    def read_pod(self, name: str) -> Any:
        """The pod, or None when it is gone."""
        try:
            return self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _refused(e, f"reading pod {name}") from e

    def create_pod(self, pod: Any, name: str, stamp: str) -> None:
        """Create an attempt's pod, its ``LAUNCHED_ANNOTATION`` being ``stamp``: a 409 on a pod
        with that stamp is this create, carried out before its answer was lost."""
        try:
            self.core.create_namespaced_pod(self.namespace, pod)
        except ApiException as e:
            if e.status == 409 and created_by_us(
                self.read_pod(name), name, LAUNCHED_ANNOTATION, stamp
            ):
                log.info("Pod %s was created; its answer was lost and the retry met it.", name)
            else:
                raise _refused(e, f"could not create pod {name}", api_message(e)) from e

    def create_probe(self, body: dict[str, Any], name: str, hint: str) -> None:
        """Create a probe pod; a 409 is fine (the name is this probe's alone, a retry met what
        it made); any other refusal says ``hint``."""
        try:
            self.core.create_namespaced_pod(self.namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise _refused(e, f"could not create probe pod {name}", hint) from e

    def create_priority_class(self, body: dict[str, Any]) -> None:
        """Create a PriorityClass; one that exists (409: made by an earlier worker or an admin)
        is fine, any other refusal is raised as the client's."""
        try:
            SchedulingV1Api(self.core.api_client).create_priority_class(body)
        except ApiException as e:
            if e.status != 409:
                raise

    def annotate(
        self, name: str, annotations: dict[str, str], doing: str, *, explain: bool = False
    ) -> bool:
        """Set annotations on the pod; False if it is gone. ``explain``: a refusal names the
        permission (403) and carries the server's message."""
        body = {"metadata": {"annotations": annotations}}
        try:
            self.core.patch_namespaced_pod(name, self.namespace, body)
        except ApiException as e:
            if e.status == 404:
                return False
            detail = ((PATCH_HINT if e.status == 403 else "") + api_message(e)) if explain else ""
            raise _refused(e, doing, detail) from e
        return True

    def delete_pod(
        self, name: str, grace: int, *, namespace: str | None = None, what: str = "pod"
    ) -> None:
        """Delete the pod; one already gone is fine."""
        try:
            self.core.delete_namespaced_pod(
                name, namespace or self.namespace, grace_period_seconds=grace
            )
        except ApiException as e:
            if e.status != 404:
                raise _refused(e, f"deleting {what} {name}") from e

    def wait_gone(self, name: str, wait_s: float) -> None:
        """Wait (at most ``wait_s``) until the pod is gone; a failed read means not yet."""
        until = time.time() + wait_s
        while time.time() < until:
            try:
                if self.read_pod(name) is None:
                    return
            except BackendError:
                pass
            time.sleep(0.2)

    def pod_log(self, name: str, container: str, lines: int) -> str:
        # raw bytes: kubernetes-client 36 returns str(b'...') when it decodes the log itself
        resp = self.core.read_namespaced_pod_log(
            name, self.namespace, container=container, tail_lines=lines, _preload_content=False
        )
        return resp.data.decode("utf-8", errors="replace")

    # -- nodes and events -------------------------------------------------------------------
    def read_node(self, name: str) -> Any:
        """The node, or None when it is gone."""
        try:
            return self.core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _refused(e, f"reading node {name}", RBAC_HINT if e.status == 403 else "") from e

    def pod_events(self, name: str) -> list[Any]:
        """Events of the objects in the namespace named ``name`` (the pod and its namesakes)."""
        return self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items

    def node_events(self, name: str) -> list[Any]:
        """Events of the objects named ``name`` in all namespaces (the node and its namesakes)."""
        try:
            return self.core.list_event_for_all_namespaces(
                field_selector=f"involvedObject.name={name}"
            ).items
        except ApiException as e:
            raise _refused(
                e, f"listing events of node {name}", RBAC_HINT if e.status == 403 else ""
            ) from e
