"""A pod template that asks for its node (privileged, root, escalation, added capabilities,
hostPath, host ports, host namespaces) is refused by default, naming the field's path: when the
DAG is parsed for a dict, when the pod is built for a file on the worker. A platform team need
not rely on Pod Security Admission being set. ``allow_privileged=True`` lets it through,
unchanged. No API server: the pod is built as a launch builds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.pods import attempt_pod
from airflow_spot.exceptions import ConfigError

NOWHERE = "/nonexistent/kubeconfig"  # never read: no API call is made


def _c(**fields) -> dict:
    return {"name": "train", **fields}


# (the template's spec, the field path the error must name)
ASKS_FOR_THE_NODE = [
    ({"containers": [_c(securityContext={"privileged": True})]}, "spec.containers[0].securityContext.privileged"),
    ({"securityContext": {"runAsUser": 0}, "containers": [_c()]}, "spec.securityContext.runAsUser"),
    ({"containers": [_c(securityContext={"runAsNonRoot": False})]}, "spec.containers[0].securityContext.runAsNonRoot"),
    ({"containers": [_c(), {"name": "side", "image": "x", "securityContext": {"runAsUser": 0}}]}, "spec.containers[1].securityContext.runAsUser"),
    ({"containers": [_c()], "initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": True}}]}, "spec.initContainers[0].securityContext.privileged"),
    ({"containers": [_c(securityContext={"allowPrivilegeEscalation": True})]}, "spec.containers[0].securityContext.allowPrivilegeEscalation"),
    ({"containers": [_c(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "CAP_SYS_ADMIN"]}})]}, "spec.containers[0].securityContext.capabilities.add[1]"),
    ({"containers": [_c()], "volumes": [{"name": "data", "emptyDir": {}}, {"name": "root", "hostPath": {"path": "/"}}]}, "spec.volumes[1].hostPath"),
    ({"containers": [_c()], "volumes": [{"name": "cache", "hostPath": {"path": "/var/cache/models"}}]}, "spec.volumes[0].hostPath"),
    ({"containers": [_c()], "hostNetwork": True}, "spec.hostNetwork"),
    ({"containers": [_c()], "hostPID": True}, "spec.hostPID"),
    ({"containers": [_c()], "hostIPC": True}, "spec.hostIPC"),
    ({"containers": [_c(ports=[{"containerPort": 80, "hostPort": 80}])]}, "spec.containers[0].ports[0].hostPort"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "path"), ASKS_FOR_THE_NODE, ids=[p for _, p in ASKS_FOR_THE_NODE])
def test_a_template_asking_for_its_node_is_refused_at_parse_time_naming_the_field(
    spec: dict, path: str
) -> None:
    with pytest.raises(ConfigError) as err:
        KubernetesBackend(image="img", config_file=NOWHERE, pod_template={"spec": spec})
    assert err.value.field == f"backend.pod_template.{path}"
    assert "allow_privileged=True" in str(err.value)
    allowed = KubernetesBackend(
        image="img", config_file=NOWHERE, pod_template={"spec": spec}, allow_privileged=True
    )
    assert KubernetesBackend.from_dict(allowed.to_dict()) == allowed  # the opt-in is stored


def test_the_opt_in_keeps_the_template_as_it_asked() -> None:
    """With ``allow_privileged=True`` the pod built is the template's, privileges included."""
    spec = {
        "hostNetwork": True,
        "containers": [_c(securityContext={"privileged": True, "runAsUser": 0})],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    }
    b = KubernetesBackend(
        image="img", config_file=NOWHERE, pod_template={"spec": spec}, allow_privileged=True
    )
    pod = _build(b)
    sc = pod.spec.containers[0].security_context
    assert (sc.privileged, sc.run_as_user, pod.spec.host_network) == (True, 0, True)
    (root,) = [v for v in pod.spec.volumes if v.name == "root"]
    assert root.host_path.path == "/"


def test_a_template_file_asking_for_its_node_is_refused_when_the_pod_is_built(
    tmp_path: Path,
) -> None:
    """A file is read on the worker, at launch: refused there, before any pod is sent."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps({"spec": {"containers": [_c()], "hostPID": True}}))
    b = KubernetesBackend(image="img", config_file=NOWHERE, pod_template=str(path))
    with pytest.raises(ConfigError) as err:
        _build(b)
    assert err.value.field == "backend.pod_template.spec.hostPID"
    opted = KubernetesBackend(
        image="img", config_file=NOWHERE, pod_template=str(path), allow_privileged=True
    )
    assert _build(opted).spec.host_pid is True


def test_ordinary_templates_and_the_opt_in_type() -> None:
    """What needs no node is not refused (a non-root user, baseline capabilities, volumes that
    are not the host's, a container port); the opt-in must be a bool."""
    spec = {
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 1000},
        "containers": [
            _c(
                securityContext={
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                },
                ports=[{"containerPort": 8080}],
            )
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "ckpt"}}],
        "hostNetwork": False,
    }
    b = KubernetesBackend(image="img", config_file=NOWHERE, pod_template={"spec": spec})
    assert _build(b).spec.containers[0].security_context.privileged is None
    with pytest.raises(ConfigError, match="backend.allow_privileged: must be True or False"):
        KubernetesBackend(image="img", allow_privileged="yes")


def _build(b: KubernetesBackend):
    return attempt_pod(
        b,
        name="p",
        labels={},
        attempt=1,
        capacity="spot",
        command=["python", "train.py"],
        checkpoint_uri="s3://bucket/ckpt",
    )
