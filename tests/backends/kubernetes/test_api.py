"""The backend's API calls read the server's refusals as the backend acts on them: gone is
None or False, a create that met itself is fine, anything else a BackendError that says what
was being done. A fake CoreV1Api answers with the statuses a real server sends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import V1ObjectMeta, V1Pod
from kubernetes.client.exceptions import ApiException

from airflow_spot.backends.kubernetes.api import KubeApi, refusal
from airflow_spot.exceptions import BackendError


def refused(status: int, reason: str, message: str = "") -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return e


class FakeCore:
    """A CoreV1Api whose calls answer ``answers[name]``: an exception is raised."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers

    def __getattr__(self, name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            got = self.answers[name]
            if isinstance(got, BaseException):
                raise got
            return got

        return call


def api(**answers: Any) -> KubeApi:
    return KubeApi(FakeCore(**answers), "ml")


def test_a_pod_or_node_that_is_gone_reads_as_none() -> None:
    gone = refused(404, "Not Found")
    assert api(read_namespaced_pod=gone).read_pod("p") is None
    assert api(read_node=gone).read_node("n") is None
    assert api(patch_namespaced_pod=gone).annotate("p", {"a": "b"}, "relaying") is False
    api(delete_namespaced_pod=gone).delete_pod("p", grace=0)  # already gone: fine


def test_other_refusals_say_what_was_being_done_and_what_is_missing() -> None:
    with pytest.raises(BackendError, match=r"^reading pod p: 500 Internal Server Error$"):
        api(read_namespaced_pod=refused(500, "Internal Server Error")).read_pod("p")
    with pytest.raises(BackendError, match=r"reading node n: 403 Forbidden \(the worker's"):
        api(read_node=refused(403, "Forbidden")).read_node("n")
    with pytest.raises(BackendError, match=r"listing events of node n: 403 Forbidden \("):
        api(list_event_for_all_namespaces=refused(403, "Forbidden")).node_events("n")
    patch = refused(403, "Forbidden", "pods is forbidden")
    with pytest.raises(BackendError, match=r"needs patch on pods.*\): pods is forbidden$"):
        api(patch_namespaced_pod=patch).annotate("p", {}, "relaying", explain=True)
    with pytest.raises(BackendError, match=r"^releasing pod p: 403 Forbidden$"):
        api(patch_namespaced_pod=patch).annotate("p", {}, "releasing pod p")
    with pytest.raises(BackendError, match=r"^deleting probe pod p: 409 Conflict$"):
        api(delete_namespaced_pod=refused(409, "Conflict")).delete_pod("p", 0, what="probe pod")


def test_a_create_that_met_its_own_pod_is_fine_and_a_namesake_is_not() -> None:
    """The retry of a create whose answer was lost meets 409: the pod is ours when it carries
    this launch's stamp."""
    ours = V1Pod(metadata=V1ObjectMeta(name="p", annotations={"airflow-spot/launched-at": "1.5"}))
    conflict = refused(409, "Conflict", 'pods "p" already exists')
    met = api(create_namespaced_pod=conflict, read_namespaced_pod=ours)
    met.create_pod(V1Pod(), "p", "1.5")
    with pytest.raises(BackendError, match=r"could not create pod p: 409 Conflict: pods \"p\""):
        met.create_pod(V1Pod(), "p", "2.5")  # another launch's pod of that name
    api(create_namespaced_pod=conflict).create_probe({}, "probe", " (hint)")  # its own name
    with pytest.raises(BackendError, match=r"^could not create probe pod probe: 403 F.* \(hint\)"):
        api(create_namespaced_pod=refused(403, "Forbidden")).create_probe({}, "probe", " (hint)")


def test_only_the_servers_refusals_have_a_status() -> None:
    assert refusal(refused(403, "Forbidden")) == (403, "Forbidden")
    assert refusal(OSError("reset")) is None
