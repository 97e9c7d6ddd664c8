"""The README's Kubernetes claims that no other real-control-plane test checked (issue 20),
each on the real kube-apiserver, scheduler and controllers:

* pod templates merged with ours are admitted as they are (server-side dry-run), a
  placement's affinity replacing the template's, and the
  shapes our parse-time checks refuse are ones the real server refuses (or silently changes);
* the pod is non-root, cannot escalate and gets no service-account token unless asked;
* a spot pod the real scheduler cannot place, past ``pending_timeout_s``, is "spot
  unavailable" and deleted whatever ``delete_pods`` says; so is a container that cannot start;
* the NTH, GKE and AKS notices on a real node are relayed, the container saves on them, and
  its exit 143 is the reclaim; a namesake node's (or a stale) event is no notice;
* a launch removes the task's live leftovers (its probe too) and keeps ended pods kept for
  inspection; ``find_attempts`` finds the task's pods by label, probes and other map indexes
  left out; the scheduler's "Preemption is not helpful" is no reclaim evidence;
* cancel deletes the pod when its node may not be read; a source RBAC forbids is warned about
  once and skipped, and the autoscaler's backoff (status ConfigMap, ``NotTriggerScaleUp`` on
  our probe) is read as the ServiceAccount;
* a probe never preempts (``preemptionPolicy: Never``) and any real pod preempts it;
* node pools place pods by pool, their signals are per pool, and a pool whose pod stays
  unschedulable cools down while the job runs in the other;
* a held (make-before-break) pod with a notice is not ready, and one reclaimed before its
  release is preempted while on-demand trains on.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_spot.backends.base import Outcome, State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubePool, KubernetesBackend
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.backends.kubernetes.pods import attempt_pod, task_labels
from airflow_spot.backends.kubernetes.probe import PRIORITY_CLASS, build_priority_class
from airflow_spot.exceptions import BackendError, ConfigError
from airflow_spot.testing.cluster.autoscaler import autoscaler_status
from airflow_spot.testing.cluster.looks import wait_ended, wait_running

NS = "ml-training"  # docker/rbac.yaml's namespace (the sa_kubeconfig fixture, conftest.py)
IDENT = TaskIdentity("nightly_train", "train", "manual__2026-01-01T00:00:00+00:00")
SLEEP = ["sleep", "600"]
SPOT = {"karpenter.sh/capacity-type": "spot"}
ZONE = "topology.kubernetes.io/zone"


def backend(cfg: str, namespace: str, **kw: Any) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1",
        config_file=cfg,
        namespace=namespace,
        preset=kw.pop("preset", "karpenter"),
        gpus=kw.pop("gpus", 1),
        pending_timeout_s=kw.pop("pending_timeout_s", 120.0),
        **kw,
    )


def until(what: Callable[[], Any], timeout: float = 30.0, msg: object = "") -> Any:
    """``what()``'s first truthy answer, polled every 0.2 s for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if got := what():
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {msg or what}")
        time.sleep(0.2)


def running(b: KubernetesBackend, h, timeout: float = 60.0) -> str:
    """Look (status, then what is due) until the attempt runs; its node's name."""
    return wait_running(b, h, timeout)


def ended(b: KubernetesBackend, h, timeout: float = 60.0):
    """Look until the attempt has its verdict."""
    return wait_ended(b, h, timeout)


def gone(api, ns: str, name: str | None) -> bool:
    from kubernetes.client import ApiException

    try:
        api.read_namespaced_pod(name, ns)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def live(api, ns: str, selector: str) -> set[str]:
    """The pods of ``selector`` that are not being deleted."""
    return {
        p.metadata.name
        for p in api.list_namespaced_pod(ns, label_selector=selector).items
        if p.metadata.deletion_timestamp is None
    }


def priority_class(api) -> None:
    """The probes' PriorityClass, made once by an admin, and seen by the Priority admission
    plugin (it reads PriorityClasses through an informer: a new one is refused a moment)."""
    from kubernetes import client

    with contextlib.suppress(client.ApiException):
        client.SchedulingV1Api(api.api_client).create_priority_class(build_priority_class())
    pod = {
        "metadata": {"name": "pc-check"},
        "spec": {"priorityClassName": PRIORITY_CLASS, "containers": [{"name": "c", "image": "x"}]},
    }

    def admitted() -> bool:
        try:
            api.create_namespaced_pod("default", pod, dry_run="All")
        except client.ApiException as e:
            if e.status != 403:
                raise
            return False
        return True

    until(admitted, 10, "the PriorityClass was not admitted")


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_event(api, node: str, uid: str, reason: str, message: str) -> str:
    """An event on a node (cluster-scoped: the API server keeps its events in ``default``)."""
    at = time.time()
    name = f"{node}.{uuid.uuid4().hex[:16]}"
    api.create_namespaced_event(
        "default",
        {
            "metadata": {"name": name},
            "reason": reason,
            "type": "Warning",
            "message": message,
            "involvedObject": {"kind": "Node", "name": node, "uid": uid},
            "source": {"component": "custom-plugin-monitor", "host": node},
            "count": 1,
            "firstTimestamp": iso(at),
            "lastTimestamp": iso(at),
        },
    )
    return name


@pytest.fixture
def plane(kube_control_plane):
    """The session's control plane, its ``default`` namespace ready for pods (the
    ServiceAccount admission refuses pods until the namespace's service account exists)."""
    api = kube_control_plane.api
    until(lambda: api.list_namespaced_service_account("default").items, 30, "no default SA")
    return kube_control_plane


@contextlib.contextmanager
def warnings_of(logger: str) -> Iterator[list[str]]:
    """The messages ``logger`` warns with meanwhile (a handler of its own: Airflow's logging
    set-up may stop records from reaching pytest's)."""
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    keep, log = Keep(logging.WARNING), logging.getLogger(logger)
    log.addHandler(keep)
    try:
        yield got
    finally:
        log.removeHandler(keep)


def server_error(e) -> str:
    return json.loads(e.body).get("message", "")


# -- pods the real API server admits --------------------------------------------------------
Check = Callable[[Any, Any], bool]  # (the pod the server answers, its training container)
TEMPLATES: list[tuple[str, dict[str, Any], dict[str, Any], Check]] = [  # id, backend, spec, check
    (
        "gpu",  # a KPO-style GPU template: our gpus replace its GPU request and limit
        {"gpus": 8},
        {
            "containers": [
                {
                    "name": "base",
                    "resources": {
                        "requests": {"nvidia.com/gpu": "1", "memory": "32Gi"},
                        "limits": {"nvidia.com/gpu": "1", "memory": "32Gi"},
                    },
                }
            ]
        },
        # the server defaults a missing request to its limit
        lambda pod, c: (
            c.resources.limits == {"memory": "32Gi", "nvidia.com/gpu": "8"}
            and c.resources.requests == {"memory": "32Gi", "nvidia.com/gpu": "8"}
        ),
    ),
    (
        "request-over-template-limit",  # our request replaces the template's limit of it
        {"gpus": 0, "resources": {"requests": {"memory": "64Gi"}}},
        {"containers": [{"name": "base", "resources": {"limits": {"memory": "32Gi"}}}]},
        lambda pod, c: c.resources.requests == {"memory": "64Gi"} and not c.resources.limits,
    ),
    (
        "privileged",  # RDMA: no allowPrivilegeEscalation=false beside it (opted in)
        {"allow_privileged": True},
        {"containers": [{"name": "train", "securityContext": {"privileged": True}}]},
        lambda pod, c: (
            c.security_context.privileged is True
            and c.security_context.allow_privilege_escalation is None
        ),
    ),
    (
        "cap-sys-admin",
        {"allow_privileged": True},
        {
            "containers": [
                {"name": "train", "securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}}
            ]
        },
        lambda pod, c: (
            c.security_context.capabilities.add == ["CAP_SYS_ADMIN"]
            and c.security_context.allow_privilege_escalation is None
        ),
    ),
    (
        "root",  # root asked for: no runAsNonRoot beside it (the kubelet would refuse both)
        {"allow_privileged": True},
        {"securityContext": {"runAsUser": 0}, "containers": [{"name": "base"}]},
        lambda pod, c: (
            pod.spec.security_context.run_as_user == 0
            and pod.spec.security_context.run_as_non_root is None
            and c.security_context.run_as_non_root is None
        ),
    ),
    (
        "sidecar-only",  # it stays a sidecar with its own limits
        {"gpus": 0},
        {
            "containers": [
                {
                    "name": "log-shipper",
                    "image": "fluent/fluent-bit:3",
                    "resources": {"limits": {"memory": "256Mi"}},
                }
            ]
        },
        lambda pod, c: (
            [(x.name, x.image) for x in pod.spec.containers]
            == [("train", "ghcr.io/me/train:1"), ("log-shipper", "fluent/fluent-bit:3")]
            and not (c.resources.limits or c.resources.requests)
            and pod.spec.containers[1].resources.limits == {"memory": "256Mi"}
        ),
    ),
    (
        "by-name",  # the training container is found by name, wherever it is
        {"gpus": 0},
        {
            "containers": [
                {"name": "proxy", "image": "envoyproxy/envoy:v1"},
                {"name": "train", "resources": {"limits": {"cpu": "8"}}},
            ]
        },
        lambda pod, c: (
            [x.name for x in pod.spec.containers] == ["train", "proxy"]
            and c.resources.limits == {"cpu": "8"}
        ),
    ),
    (
        "native-sidecar",  # an init container with restartPolicy Always stays one
        {},
        {
            "initContainers": [
                {"name": "proxy", "image": "envoyproxy/envoy:v1", "restartPolicy": "Always"}
            ],
            "containers": [{"name": "train"}],
        },
        lambda pod, c: (
            [(x.name, x.restart_policy) for x in pod.spec.init_containers] == [("proxy", "Always")]
        ),
    ),
]


def build(b: KubernetesBackend, capacity: str = "spot"):
    return attempt_pod(
        b,
        name=f"dry-{uuid.uuid4().hex[:8]}",
        labels={"airflow-spot/task-id": "train"},
        attempt=1,
        capacity=capacity,
        command=["python", "-m", "train"],
        checkpoint_uri="s3://bucket/ckpt",
    )


@pytest.mark.parametrize(
    ("backend_kw", "template", "check"), [t[1:] for t in TEMPLATES], ids=[t[0] for t in TEMPLATES]
)
def test_a_template_merged_with_ours_is_admitted_as_merged(
    plane, backend_kw, template, check
) -> None:
    """The pod built on a template passes the real API server's validation and admission
    (server-side dry-run), and what the server answers is the merge the README describes."""
    c = plane
    b = backend(c.kubeconfig, "default", pod_template={"spec": template}, **backend_kw)
    pod = c.api.create_namespaced_pod("default", build(b), dry_run="All")
    assert check(pod, pod.spec.containers[0]), pod.spec


def test_a_template_file_keeps_its_placement_and_security_and_ours_are_added(
    plane, tmp_path: Path
) -> None:
    """A YAML template on the worker: its node selector, tolerations, labels and security
    settings survive the real server's admission beside the GKE spot placement and our
    defaults."""
    template = {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "nodeSelector": {ZONE: "us-west-2a"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "securityContext": {"runAsUser": 2000},
            "containers": [
                {
                    "name": "train",
                    "resources": {"limits": {"memory": "60Gi"}, "requests": {"cpu": "8"}},
                    "securityContext": {"readOnlyRootFilesystem": True},
                }
            ],
        },
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(template))
    c = plane
    b = backend(c.kubeconfig, "default", preset="gke", pod_template=str(path))
    pod = c.api.create_namespaced_pod("default", build(b), dry_run="All")
    main = pod.spec.containers[0]
    assert main.resources.limits == {"memory": "60Gi", "nvidia.com/gpu": "1"}
    assert pod.spec.node_selector == {ZONE: "us-west-2a", "cloud.google.com/gke-spot": "true"}
    assert {"nvidia.com/gpu", "cloud.google.com/gke-spot"} <= {t.key for t in pod.spec.tolerations}
    sc = pod.spec.security_context
    assert (sc.run_as_user, sc.run_as_non_root) == (2000, True)
    assert main.security_context.read_only_root_filesystem is True
    assert main.security_context.allow_privilege_escalation is False
    assert pod.metadata.labels["team"] == "ml" and pod.metadata.labels["airflow-spot/attempt"]


def test_a_placements_affinity_replaces_the_templates(plane) -> None:
    """GKE's on-demand placement keeps pods off spot nodes by node affinity: on a template
    with an affinity of its own, the admitted pod has the placement's term only."""
    zone_term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["us-west-2a"]}]}
    tmpl = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [zone_term]
                    }
                }
            },
            "containers": [{"name": "train"}],
        }
    }
    b = backend(plane.kubeconfig, "default", preset="gke", pod_template=tmpl)
    pod = plane.api.create_namespaced_pod("default", build(b, "on_demand"), dry_run="All")
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    terms = [
        [(e.key, e.operator, e.values) for e in t.match_expressions]
        for t in required.node_selector_terms
    ]
    assert terms == [[("cloud.google.com/gke-spot", "NotIn", ["true"])]], terms


@pytest.mark.parametrize(
    ("security", "words"),
    [
        ({"privileged": True}, "`privileged` to true"),
        ({"capabilities": {"add": ["CAP_SYS_ADMIN"]}}, "`capabilities.Add` CAP_SYS_ADMIN"),
    ],
    ids=["privileged", "cap-sys-admin"],
)
def test_our_no_escalation_default_beside_privilege_is_what_the_server_refuses(
    plane, security, words
) -> None:
    """Our no-escalation default steps aside for a privileged (or CAP_SYS_ADMIN) template
    container because the real API server refuses the two together (422)."""
    from kubernetes import client

    c = plane
    tmpl = {"spec": {"containers": [{"name": "train", "securityContext": security}]}}
    pod = build(backend(c.kubeconfig, "default", pod_template=tmpl, allow_privileged=True))
    assert c.api.create_namespaced_pod("default", pod, dry_run="All").metadata.uid
    pod.spec.containers[0].security_context.allow_privilege_escalation = False
    with pytest.raises(client.ApiException) as err:
        c.api.create_namespaced_pod("default", pod, dry_run="All")
    assert err.value.status == 422 and words in server_error(err.value), server_error(err.value)


def test_what_our_parse_time_checks_refuse_the_server_refuses_or_changes(plane) -> None:
    """A request above its limit, a GPU request unlike its limit and an unknown toleration
    operator are 422s on the real server, and refused by us first, naming the field. A
    mistyped toleration field is no 422: the server drops it and stores another toleration
    (``operator`` gone: Equal, with an empty value), so only our check names it."""
    from kubernetes import client

    api = plane.api

    def raw(resources: dict | None = None, tolerations: list | None = None) -> dict:
        spec: dict = {"containers": [{"name": "c", "image": "x", "resources": resources or {}}]}
        if tolerations:
            spec["tolerations"] = tolerations
        return {"metadata": {"name": "raw"}, "spec": spec}

    refused = [
        (
            raw({"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}),
            lambda: KubernetesBackend(
                image="x", resources={"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}
            ),
            "backend.resources",
        ),
        (
            raw({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}),
            lambda: KubernetesBackend(
                image="x",
                resources={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
            ),
            "backend.resources",
        ),
        (
            raw(tolerations=[{"key": "gpu", "operator": "In"}]),
            lambda: Placement({}, ({"key": "gpu", "operator": "In"},)),
            "placement.tolerations",
        ),
    ]
    for body, ours, field in refused:
        with pytest.raises(client.ApiException) as err:
            api.create_namespaced_pod("default", body, dry_run="All")
        assert err.value.status == 422, server_error(err.value)
        with pytest.raises(ConfigError, match=f"^{field}: "):
            ours()
    typo = [{"key": "gpu", "opertor": "Exists", "effect": "NoSchedule"}]
    stored = api.create_namespaced_pod("default", raw(tolerations=typo), dry_run="All")
    tol = next(t for t in stored.spec.tolerations if t.key == "gpu")
    assert tol.operator is None and tol.value is None  # "Exists" is lost, silently
    with pytest.raises(ConfigError, match=r"^placement.tolerations: unknown field\(s\)"):
        Placement({}, tuple(typo))


def test_the_pod_is_non_root_and_gets_no_token_unless_asked(plane) -> None:
    """After the real ServiceAccount admission: no token volume unless
    ``mount_service_account_token``; non-root, no escalation, no capabilities; labels name
    DAG, task, run, map index, try and attempt; a service account that does not exist is
    refused by the server, and the launch says so."""
    c = plane
    plain = c.api.create_namespaced_pod(
        "default", build(backend(c.kubeconfig, "default")), dry_run="All"
    )
    assert plain.spec.automount_service_account_token is False
    assert not [v for v in plain.spec.volumes if v.name.startswith("kube-api-access-")]
    main = plain.spec.containers[0]
    assert plain.spec.security_context.run_as_non_root is True
    assert plain.spec.security_context.run_as_user == 1000
    assert main.security_context.allow_privilege_escalation is False
    assert main.security_context.capabilities.drop == ["ALL"]
    b = backend(c.kubeconfig, "default", mount_service_account_token=True)
    asked = c.api.create_namespaced_pod("default", build(b), dry_run="All")
    token = [v.name for v in asked.spec.volumes if v.name.startswith("kube-api-access-")]
    assert token, asked.spec.volumes  # injected by the ServiceAccount admission plugin
    mounts = {m.name: m.mount_path for m in asked.spec.containers[0].volume_mounts}
    assert mounts[token[0]] == "/var/run/secrets/kubernetes.io/serviceaccount"
    pod = attempt_pod(
        b,
        name="labels",
        labels=task_labels(replace(IDENT, map_index=3)),
        try_number=2,
        attempt=4,
        capacity="on_demand",
        command=["x"],
        checkpoint_uri="/c",
    )
    labels = c.api.create_namespaced_pod("default", pod, dry_run="All").metadata.labels
    ours = {k.removeprefix("airflow-spot/") for k in labels if k.startswith("airflow-spot/")}
    assert ours == {"dag-id", "task-id", "run-id", "map-index", "try-number", "attempt", "capacity"}
    assert (labels["airflow-spot/attempt"], labels["airflow-spot/try-number"]) == ("4", "2")
    missing = backend(c.kubeconfig, "default", service_account="trainer-that-is-not-there")
    with pytest.raises(BackendError, match="could not create pod .*403"):
        missing.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")


# -- pods that will never run ----------------------------------------------------------------
def test_a_spot_pod_unschedulable_past_its_bound_is_spot_unavailable_and_deleted(
    kube_cluster,
) -> None:
    """No spot node and no autoscaler: the real scheduler marks the pod Unschedulable; past
    ``pending_timeout_s`` the attempt is "spot unavailable" (its FailedScheduling "Preemption
    is not helpful" is no preemption), and the pending pod is deleted though
    ``delete_pods="never"``, so it cannot start later beside the next attempt."""
    k, ns = kube_cluster.kubelet, kube_cluster.namespace
    k.autoscale = False
    b = backend(kube_cluster.kubeconfig, ns, pending_timeout_s=2.0, delete_pods="never")
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    st = until(lambda: (s := b.status(h)).terminal and s, 30, "no verdict")
    assert st.outcome is Outcome.SPOT_UNAVAILABLE and "unschedulable" in st.reason, st
    assert "give_up" in st.due and not gone(b.api.core, ns, h.pod)  # status() only reports
    events = b.api.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={h.pod},reason=FailedScheduling"
    ).items
    assert any("Preemption is not helpful for scheduling" in e.message for e in events), events
    b.carry_out(h, st)
    until(lambda: gone(b.api.core, ns, h.pod), 10, "the pending pod was not deleted")
    assert b.status(h).outcome is Outcome.SPOT_UNAVAILABLE  # the 404 is ours: the verdict stays


def test_a_container_that_cannot_start_fails_the_attempt_and_its_pod_goes(kube_cluster) -> None:
    """On a Ready node that no kubelet of ours tends, the scheduler binds the pod and the
    test writes what a kubelet writes for a bad image: ``ErrImagePull`` is waited out for
    ``pending_timeout_s``, ``InvalidImageName`` fails at once; each is an application failure
    and its bound pod is deleted though ``delete_pods="never"``."""
    k, ns = kube_cluster.kubelet, kube_cluster.namespace
    k.autoscale = False
    node = k.add_node("untended-spot", SPOT, gpus=2)
    k.nodes.pop(node)  # our kubelet leaves its pods alone: the test is its kubelet
    try:
        k.wait_ready(node)
        b = backend(kube_cluster.kubeconfig, ns, pending_timeout_s=2.0, delete_pods="never")
        for attempt, reason in ((1, "ErrImagePull"), (2, "InvalidImageName")):
            st = _cannot_start(b, attempt, reason)
            assert st.outcome is Outcome.APP_FAILURE and reason in st.reason, st
    finally:
        with contextlib.suppress(Exception):
            k.api.delete_node(node)


def _cannot_start(b: KubernetesBackend, attempt: int, reason: str):
    """Launch, wait until bound, write the kubelet's waiting status with ``reason``; the
    verdict, once its pod is deleted (carry_out)."""
    ns = b.namespace
    h = b.launch(IDENT, attempt, "spot", SLEEP, checkpoint_uri="/c")
    until(lambda: b.api.core.read_namespaced_pod(h.pod, ns).spec.node_name, 30, "not bound")
    waiting = {
        "name": "train",
        "image": "ghcr.io/me/train:1",
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": f"{reason}: no such image"}},
    }
    b.api.core.patch_namespaced_pod_status(
        h.pod, ns, {"status": {"phase": "Pending", "containerStatuses": [waiting]}}
    )
    first = b.status(h)
    if reason == "ErrImagePull":
        assert first.state is State.WAITING, first  # a pull may be slow or retried: not yet
    st = until(lambda: (s := b.status(h)).terminal and s, 20, "no verdict")
    assert "give_up" in st.due and not gone(b.api.core, ns, h.pod)  # status() only reports
    b.carry_out(h, st)
    until(lambda: gone(b.api.core, ns, h.pod), 10, "the bound pod was not deleted")
    return st


# -- notices ---------------------------------------------------------------------------------
def _nth(api, node: str) -> None:
    _taint(api, node, {"key": "aws-node-termination-handler/spot-itn", "value": "evt-1a2b3c"})


def _gke(api, node: str) -> None:
    _taint(api, node, {"key": "cloud.google.com/impending-node-termination", "value": "true"})


def _aks(api, node: str) -> None:  # node-problem-detector's relay: the node's name as uid
    msg = "Node will change into status 'Preempt' (Azure scheduled event)"
    node_event(api, node, node, "VMEventScheduled", msg)


def _taint(api, node: str, taint: dict) -> None:
    have = [
        {k: v for k, v in t.to_dict().items() if v is not None and k in ("key", "value", "effect")}
        for t in api.read_node(node).spec.taints or []
    ]
    api.patch_node(node, {"spec": {"taints": [*have, {**taint, "effect": "NoSchedule"}]}})


@pytest.mark.parametrize(
    ("preset", "notify", "notice"),
    [
        ("eks", _nth, "node taint aws-node-termination-handler/spot-itn"),
        ("gke", _gke, "node taint cloud.google.com/impending-node-termination"),
        ("aks", _aks, "scheduled event Preempt"),
    ],
    ids=["nth-taint", "gke-impending-termination", "aks-preempt-event"],
)
def test_a_clouds_notice_is_relayed_the_pod_saves_and_its_exit_is_the_reclaim(
    kube_cluster, tmp_path: Path, preset, notify, notice
) -> None:
    """A namesake node's warning (an event of another uid on the node's name) is no notice; the
    cloud's own notice on the real node is relayed to the pod's annotation, the training
    saves at once and exits 143 with nothing evicted, and that exit is a preemption."""
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store
    from airflow_spot.testing import train_command

    ns = kube_cluster.namespace
    b = backend(kube_cluster.kubeconfig, ns, preset=preset)
    ckpt = tmp_path / "ckpt"
    cmd = train_command(100_000, step_seconds=0.01, save_every=10_000)
    h = b.launch(IDENT, 1, "spot", cmd, checkpoint_uri=str(ckpt))
    node = running(b, h)
    api = kube_cluster.api
    # an earlier node of the same name (another uid) was interrupted: not this node's notice
    stale = [node_event(api, node, str(uuid.uuid4()), "SpotInterrupted", "Spot warning")]
    try:
        st = b.status(h)
        assert st.state is State.RUNNING and st.evidence["notice"] is None and not st.due, st
        notify(api, node)
        st = ended(b, h)
    finally:
        for name in stale:
            with contextlib.suppress(Exception):
                api.delete_namespaced_event(name, "default")
    assert h.notice == notice and h.notice_sent, h.notice
    ann = api.read_namespaced_pod(h.pod, ns).metadata.annotations
    assert ann["airflow-spot/preemption-notice"] == notice
    assert st.outcome is Outcome.PREEMPTED and st.exit_code == 143, st
    assert "after the reclaim notice" in st.reason, st
    saved = Checkpoints(open_store(str(ckpt))).latest_valid()
    assert saved is not None and 0 < saved.step < 10_000  # saved on the notice, not on schedule


# -- one attempt pod at a time ---------------------------------------------------------------
def test_a_launch_removes_live_leftovers_and_keeps_pods_kept_for_inspection(kube_cluster) -> None:
    """With ``delete_pods="never"``: an ended attempt pod stays through later launches; a held
    launch keeps the attempt that trains and removes the task's probe; a plain launch
    removes every live pod of the task, and no pod of another map index. ``find_attempts``
    finds the task's attempt pods by the real label selector, probes left out. The first pod
    waited for a node (the scheduler's "Preemption is not helpful"), ran and exited 3: an
    application failure."""
    from airflow_spot.backends.kubernetes.pods import task_labels

    api, ns = kube_cluster.api, kube_cluster.namespace
    priority_class(api)
    b = backend(kube_cluster.kubeconfig, ns, gpus=0, delete_pods="never")
    h1 = b.launch(IDENT, 1, "on_demand", ["sh", "-c", "exit 3"], checkpoint_uri="/c")
    st = ended(b, h1)
    assert st.outcome is Outcome.APP_FAILURE and st.exit_code == 3, st
    waited = api.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={h1.pod},reason=FailedScheduling"
    ).items
    assert any("Preemption is not helpful" in e.message for e in waited), waited
    h2 = b.launch(IDENT, 2, "on_demand", SLEEP, checkpoint_uri="/c")
    running(b, h2)
    other = b.launch(replace(IDENT, map_index=0), 1, "on_demand", SLEEP, checkpoint_uri="/c")
    probe = b.probe(IDENT)
    found = [(x.attempt, x.pod, x.capacity) for x in b.find_attempts(IDENT)]
    assert found == [(1, h1.pod, "on_demand"), (2, h2.pod, "on_demand")]
    labels = task_labels(IDENT)
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    h3 = b.launch(IDENT, 3, "spot", SLEEP, checkpoint_uri="/c", hold=True)
    assert live(api, ns, selector) == {h1.pod, h2.pod, h3.pod}  # the probe went, h2 trains on
    assert probe["name"] not in live(api, ns, selector)
    h4 = b.launch(IDENT, 4, "on_demand", SLEEP, checkpoint_uri="/c")
    until(lambda: live(api, ns, selector) == {h1.pod, h4.pod}, 10, live(api, ns, selector))
    assert not gone(api, ns, other.pod)  # another task instance's pod
    b.release(h1, Outcome.APP_FAILURE.value)
    assert not gone(api, ns, h1.pod)  # "never": kept for inspection
    backend(kube_cluster.kubeconfig, ns, gpus=0).release(h1, Outcome.APP_FAILURE.value)
    until(lambda: gone(api, ns, h1.pod), 10, "'always' did not delete the ended pod")


# -- RBAC -------------------------------------------------------------------------------------
def _without(api, docs: list[dict], keep: Callable[[dict], dict | None]) -> None:
    """Replace docker/rbac.yaml's ClusterRole by ``keep`` applied to each rule (None: drop)."""
    from kubernetes import client

    role = next(d for d in docs if d["kind"] == "ClusterRole")
    rules = [r for r in (keep(dict(r)) for r in role["rules"]) if r is not None]
    client.RbacAuthorizationV1Api(api.api_client).replace_cluster_role(
        role["metadata"]["name"], {**role, "rules": rules}
    )


def _allowed(b: KubernetesBackend, verb: str, resource: str, namespace: str | None) -> bool:
    from kubernetes import client

    attrs = {"verb": verb, "resource": resource, "namespace": namespace}
    review = client.AuthorizationV1Api(b.api.core.api_client).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(spec={"resourceAttributes": attrs})
    )
    return bool(review.status.allowed)


def test_cancel_deletes_the_pod_even_when_its_node_may_not_be_read(
    kube_cluster, sa_kubeconfig
) -> None:
    """As the ServiceAccount with ``get`` on nodes taken away, the status of a bound pod
    fails with the 403 named; cancelling still deletes the pod, and it goes."""
    cfg, docs = sa_kubeconfig
    api = kube_cluster.api
    _without(
        api,
        docs,
        lambda r: (
            {**r, "verbs": [v for v in r["verbs"] if v != "get"]}
            if "nodes" in r["resources"]
            else r
        ),
    )
    b = backend(cfg, NS)
    until(lambda: not _allowed(b, "get", "nodes", None), 10, "RBAC change not seen")
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    until(lambda: api.read_namespaced_pod(h.pod, NS).status.phase == "Running", 60)
    with pytest.raises(BackendError, match="403"):
        b.status(h)
    st = b.cancel(h, wait_s=30)
    assert st.outcome is Outcome.CANCELLED, st
    assert gone(api, NS, h.pod)


def test_a_forbidden_source_is_named_once_and_the_autoscalers_backoff_is_still_read(
    kube_cluster, sa_kubeconfig
) -> None:
    """As the ServiceAccount without cluster-wide pod listing: the free-GPU source is named
    once in the log and skipped; the autoscaler's Backoff in its status ConfigMap and its
    ``NotTriggerScaleUp ... backoff`` event on our probe are read (spot down), and the
    probe's own answer is down."""
    cfg, docs = sa_kubeconfig
    api, k = kube_cluster.api, kube_cluster.kubelet
    k.autoscale = False
    _without(api, docs, lambda r: None if r["resources"] == ["pods"] else r)
    b = backend(cfg, NS)
    until(lambda: not _allowed(b, "list", "pods", None), 10, "RBAC change not seen")
    probe = b.probe(IDENT)

    def unschedulable():
        p = api.read_namespaced_pod(probe["name"], NS)
        return p if any(c.reason == "Unschedulable" for c in p.status.conditions or []) else None

    pod = until(unschedulable, 30, "the probe was not marked Unschedulable")
    now = time.time()
    api.create_namespaced_event(
        NS,
        {
            "metadata": {"name": f"{probe['name']}.{uuid.uuid4().hex[:16]}"},
            "reason": "NotTriggerScaleUp",
            "type": "Normal",
            "message": "pod didn't trigger scale-up: 1 in backoff after failed scale-up",
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": probe["name"],
                "namespace": NS,
                "uid": pod.metadata.uid,
            },
            "source": {"component": "cluster-autoscaler"},
            "count": 1,
            "firstTimestamp": iso(now),
            "lastTimestamp": iso(now),
        },
    )
    sig = until(lambda: b.probe_signal(probe, time.time()), 10, "the probe said nothing")
    assert (sig.up, sig.source) == (False, "probe") and "backoff" in sig.detail, sig
    api.create_namespaced_config_map("kube-system", autoscaler_status("eks-gpu-spot-2a", True))
    try:
        k.wait_ready(k.add_node("spare-spot", SPOT))  # a free GPU the worker may not see
        with warnings_of("airflow_spot.backends.kubernetes.cluster") as warned:
            first = b.spot_signals(time.time())
            second = b.spot_signals(time.time())
    finally:
        with contextlib.suppress(Exception):
            api.delete_namespaced_config_map("cluster-autoscaler-status", "kube-system")
    for got in (first, second):
        seen = sorted((s.source, s.up) for s in got if s.source != "karpenter")
        assert seen == [("autoscaler", False), ("autoscaler", False)], got
    details = sorted(s.detail for s in first if s.source == "autoscaler")
    assert "node group eks-gpu-spot-2a in Backoff" in details[0], details
    assert details[1].startswith(f"pod {probe['name']}: pod didn't trigger scale-up"), details
    assert len(warned) == 1 and "list pods in all namespaces (403 Forbidden)" in warned[0], warned
    assert "nodes" in b.cluster.forbidden
    b.drop_probe(probe)


# -- probes on the real scheduler ----------------------------------------------------------------
def test_a_probe_never_preempts_and_any_real_pod_preempts_it(kube_cluster) -> None:
    """One spot GPU: the probe (admitted at priority -10, ``preemptionPolicy: Never``) binds;
    another task's training pod needs the GPU and the real scheduler evicts the probe for it;
    a new probe then waits and never preempts the training pod."""
    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    k.autoscale = False
    node = k.add_node("one-gpu-spot", SPOT, gpus=1)
    k.wait_ready(node)
    priority_class(api)
    b = backend(kube_cluster.kubeconfig, ns)
    probe = b.probe(IDENT)
    sig = until(lambda: b.probe_signal(probe, time.time()), 30, "the probe never answered")
    assert sig.up is True, sig
    stored = api.read_namespaced_pod(probe["name"], ns)
    assert (stored.spec.priority, stored.spec.preemption_policy) == (-10, "Never")
    # its GPU is the probe's: the node shows no free GPU for the job while the probe holds it
    assert [s for s in b.spot_signals(time.time()) if s.source == "node"] == []
    assert stored.metadata.annotations["karpenter.sh/do-not-disrupt"] == "true"
    other = replace(IDENT, task_id="other")
    h = b.launch(other, 1, "spot", SLEEP, checkpoint_uri="/c")
    assert running(b, h) == node  # the probe made way
    until(lambda: gone(api, ns, probe["name"]), 10, "the probe was not preempted")
    second = b.probe(IDENT)

    def refused() -> list:
        # the scheduler's own word: Karpenter, watching the same pending pod, may write its
        # FailedScheduling too ("did not tolerate taint" for its tainted nodes), and it may come last
        return [
            e
            for e in api.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={second['name']},reason=FailedScheduling"
            ).items
            if (e.reporting_component or (e.source and e.source.component)) == "default-scheduler"
        ]

    events = until(refused, 30, "no FailedScheduling from the scheduler for the second probe")
    assert "preemptionPolicy=Never" in events[-1].message, events[-1].message
    assert not api.read_namespaced_pod(second["name"], ns).spec.node_name
    assert b.status(h).state is State.RUNNING  # never preempted by a probe
    b.drop_probe(second)


def test_pools_place_pods_and_signal_per_pool(kube_cluster) -> None:
    """Two spot pools in two zones: a launch into zone-b lands on the zone-b node; zone-a's
    free GPU is "up" for zone-a only, and a Karpenter ICE naming zone-a's zone is "down" for
    zone-a only, for the 3 minutes Karpenter remembers it."""
    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    k.autoscale = False
    zones = {"zone-a": "eu-west-3a", "zone-b": "eu-west-3b"}
    nodes = {pool: k.add_node(f"spot-{pool}", {**SPOT, ZONE: z}) for pool, z in zones.items()}
    for n in nodes.values():
        k.wait_ready(n)
    pools = tuple(KubePool(p, Placement({**SPOT, ZONE: z}), 1.0) for p, z in zones.items())
    b = backend(kube_cluster.kubeconfig, ns, pools=pools)
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c", pool="zone-b")
    assert running(b, h) == nodes["zone-b"]
    now = time.time()
    claim = f"default-{uuid.uuid4().hex[:5]}"
    ice = api.create_namespaced_event(
        "default",
        {
            "metadata": {"name": f"{claim}.{uuid.uuid4().hex[:16]}"},
            "reason": "InsufficientCapacityError",
            "type": "Warning",
            "message": f"NodeClaim {claim} event: insufficient capacity, with fleet error(s), "
            "InsufficientInstanceCapacity: We currently do not have sufficient g4dn.xlarge "
            "capacity in the Availability Zone you requested (eu-west-3a).",
            "involvedObject": {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodeClaim",
                "name": claim,
                "uid": str(uuid.uuid4()),
            },
            "source": {"component": "karpenter"},
            "count": 1,
            "firstTimestamp": iso(now),
            "lastTimestamp": iso(now),
        },
    )
    try:
        got = {(s.source, s.pool, s.up) for s in b.spot_signals(time.time())}
        later = {(s.source, s.pool, s.up) for s in b.spot_signals(time.time() + 200)}
    finally:
        api.delete_namespaced_event(ice.metadata.name, "default")
    assert got == {("node", "zone-a", True), ("karpenter", "zone-a", False)}, got
    assert ("karpenter", "zone-a", False) not in later  # Karpenter forgets after 3 min


def test_an_unschedulable_pool_cools_down_and_the_job_runs_in_the_other(
    kube_cluster, tmp_path: Path
) -> None:
    """The operator with two spot pools: the cheaper one has no node and no autoscaler, so
    its pod stays Unschedulable on the real scheduler; that attempt is "spot unavailable",
    the pool cools down, and the job runs in the other pool, billed at that pool's price."""
    from datetime import timedelta

    from airflow_spot.operators import SpotTrainingOperator
    from airflow_spot.operators.spot_training import STATE_KEY
    from airflow_spot.testing import FileTaskStateStore, make_context, train_command

    k = kube_cluster.kubelet
    k.autoscale = False
    k.wait_ready(k.add_node("spot-zone-b", {**SPOT, ZONE: "us-east-1b"}))
    pools = (
        KubePool("zone-a", Placement({**SPOT, ZONE: "us-east-1a"}), 0.8),
        KubePool("zone-b", Placement({**SPOT, ZONE: "us-east-1b"}), 1.2),
    )
    op = SpotTrainingOperator(
        task_id="train",
        command=train_command(40, step_seconds=0.02),
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=1),
        total_steps=40,
        deadline=timedelta(seconds=60),
        changeover=timedelta(seconds=0.5),
        policy="greedy",
        backend=backend(
            kube_cluster.kubeconfig,
            kube_cluster.namespace,
            gpus=0,
            pools=pools,
            pending_timeout_s=1.0,
            spot_cooldown_s=30.0,
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.1,
        deferrable=False,
    )
    store = FileTaskStateStore(tmp_path / "state.json")
    summary = op.execute(make_context(store))
    attempts = store.get(STATE_KEY)["attempts"]
    assert (attempts[0]["pool"], attempts[0]["outcome"]) == ("zone-a", "spot_unavailable")
    assert (attempts[-1]["pool"], attempts[-1]["outcome"]) == ("zone-b", "succeeded")
    assert {s["price_per_h"] for s in summary["segments"] if s["pool"] == "zone-b"} == {1.2}


# -- make-before-break --------------------------------------------------------------------------
def test_a_held_pod_with_a_notice_is_not_ready_and_its_reclaim_leaves_on_demand_training(
    kube_cluster,
) -> None:
    """A held spot pod launched beside the on-demand attempt is ready once its container
    starts; an interruption warning on its node takes that back; its node is then deleted:
    preempted with its training never begun, and the on-demand pod runs on untouched."""
    b = backend(kube_cluster.kubeconfig, kube_cluster.namespace)
    od = b.launch(IDENT, 1, "on_demand", SLEEP, checkpoint_uri="/c")
    running(b, od)
    spot = b.launch(IDENT, 2, "spot", SLEEP, checkpoint_uri="/c", hold=True)
    ready = until(lambda: (s := b.status(spot)).ready_at is not None and s, 60, "never ready")
    assert ready.state is State.LAUNCHING and ready.started_at is None, ready
    assert b.status(od).state is State.RUNNING  # the held launch kept it
    node = b.api.core.read_namespaced_pod(spot.pod, b.namespace).spec.node_name
    kube_cluster.kubelet._notice(node)  # Karpenter's interruption warning, no eviction yet
    warned = until(lambda: (s := b.status(spot)).evidence["notice"] and s, 20, "no notice")
    assert warned.ready_at is None and warned.started_at is None, warned
    kube_cluster.kubelet.reclaim(node, "delete")
    end = ended(b, spot)
    assert end.outcome is Outcome.PREEMPTED and end.started_at is None, end
    assert b.status(od).state is State.RUNNING
