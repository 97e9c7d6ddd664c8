"""The Kubernetes backend against an API server over HTTP: the pods it creates, re-attach after
a worker restart, never adopting a dead pod, at most one attempt pod, cleanup."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.exceptions import BackendError, ConfigError
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, train_command
from airflow_spot.testing_kube import FakeCloud, FakeKube

IDENT = {
    "dag_id": "nightly_train",
    "task_id": "train",
    "run_id": "manual__2026-01-01T00:00:00+00:00",
    "map_index": -1,
    "try_number": 2,
}


@pytest.fixture
def kube(tmp_path: Path):
    k = FakeKube().start()
    yield k, k.kubeconfig(tmp_path / "kubeconfig")
    k.stop()


@pytest.mark.parametrize(
    ("preset", "selector", "toleration"),
    [
        ("eks", {"eks.amazonaws.com/capacityType": "SPOT"}, None),
        ("karpenter", {"karpenter.sh/capacity-type": "spot"}, None),
        ("gke", {"cloud.google.com/gke-spot": "true"}, "cloud.google.com/gke-spot"),
        (
            "aks",
            {"kubernetes.azure.com/scalesetpriority": "spot"},
            "kubernetes.azure.com/scalesetpriority",
        ),
    ],
)
def test_spot_pod_shape(kube, preset, selector, toleration) -> None:
    """A spot pod carries the preset's placement, the identity labels, a GPU limit, the notice
    annotation exposed through the downward API, and secure defaults."""
    _, cfg = kube
    b = KubernetesBackend(
        image="ghcr.io/me/train:1", config_file=cfg, namespace="default", preset=preset, gpus=2
    )
    h = b.launch(IDENT, 1, "spot", ["python", "-m", "train"], checkpoint_uri="s3://bucket/ckpt")
    pod = b.api.read_namespaced_pod(h.pod, "default")
    assert pod.spec.node_selector == selector
    assert (pod.spec.tolerations[0].key if pod.spec.tolerations else None) == toleration
    labels = pod.metadata.labels
    assert (
        labels["airflow-spot/dag-id"] == "nightly_train"
        and labels["airflow-spot/task-id"] == "train"
    )
    assert labels["airflow-spot/attempt"] == "1" and labels["airflow-spot/try-number"] == "2"
    assert labels["airflow-spot/run-id"] == "manual__2026-01-01T00_00_00_00_00-33e279c4f8"
    assert pod.metadata.annotations == {"airflow-spot/preemption-notice": ""}
    c = pod.spec.containers[0]
    assert c.resources.limits == {"nvidia.com/gpu": "2"}
    env = {e.name: e.value for e in c.env}
    assert (
        env["AIRFLOW_SPOT_CHECKPOINT_URI"] == "s3://bucket/ckpt"
        and env["AIRFLOW_SPOT_CAPACITY"] == "spot"
    )
    assert env["AIRFLOW_SPOT_NOTICE_ANNOTATIONS"] == "/etc/airflow-spot/podinfo/annotations"
    assert pod.spec.volumes[0].downward_api.items[0].field_ref.field_path == "metadata.annotations"
    assert (
        c.security_context.allow_privilege_escalation is False
        and c.security_context.run_as_non_root is True
    )
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.restart_policy == "Never"


def test_on_demand_pod_avoids_spot_nodes(kube) -> None:
    """On GKE an on-demand pod is kept off spot nodes by node affinity."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg, preset="gke")
    pod = b.api.read_namespaced_pod(
        b.launch(IDENT, 1, "on_demand", ["x"], checkpoint_uri="/c").pod, "default"
    )
    expr = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[
        0
    ].match_expressions[0]
    assert (expr.key, expr.operator, expr.values) == (
        "cloud.google.com/gke-spot",
        "NotIn",
        ["true"],
    )


def test_custom_preset_and_bad_settings(kube) -> None:
    """A custom preset places pods as given; bad settings name the field."""
    _, cfg = kube
    custom = {"spot": Placement({"pool": "cheap"}), "on_demand": Placement({"pool": "steady"})}
    b = KubernetesBackend(image="img", config_file=cfg, preset=custom)
    pod = b.api.read_namespaced_pod(
        b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c").pod, "default"
    )
    assert pod.spec.node_selector == {"pool": "cheap"}
    assert KubernetesBackend.from_dict(b.to_dict()) == b
    with pytest.raises(ConfigError, match="preset: unknown preset 'mars'"):
        KubernetesBackend(image="img", preset="mars")
    with pytest.raises(ConfigError, match="backend.image"):
        KubernetesBackend(image="")
    with pytest.raises(ConfigError, match="backend.delete_pods"):
        KubernetesBackend(image="img", delete_pods="sometimes")


def test_at_most_one_attempt_pod(kube) -> None:
    """Launching attempt 2 removes any leftover pod of the task first."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    h2 = b.launch(IDENT, 2, "on_demand", ["x"], checkpoint_uri="/c")
    names = [
        p.metadata.name
        for p in b.api.list_namespaced_pod(
            "default", label_selector="airflow-spot/task-id=train"
        ).items
    ]
    assert names == [h2.pod]


def _operator(cfg: str, root: Path) -> SpotTrainingOperator:
    return SpotTrainingOperator(
        task_id="train",
        command=train_command(2000, step_seconds=0.02),
        checkpoint_uri=str(root / "ckpt"),
        expected_compute=timedelta(seconds=40),
        total_steps=2000,
        deadline=timedelta(seconds=300),
        changeover=timedelta(seconds=1),
        policy="greedy",
        backend=KubernetesBackend(
            image="img", config_file=cfg, preset="karpenter", spot_cooldown_s=0.5
        ),
        decision_interval=timedelta(seconds=5),
        poll_interval=0.1,
        min_deferral=timedelta(0),
    )


def test_worker_restart_reattaches_only_to_a_healthy_pod(kube, tmp_path: Path) -> None:
    """Try 2 re-attaches to the running pod; after the pod is evicted by a drain, try 3 does not
    adopt it: it records the verdict and starts a new pod, the only one of the task."""
    _, cfg = kube
    cloud = FakeCloud(cfg, tmp_path / "nodes").start()
    try:
        store = FileTaskStateStore(tmp_path / "state.json")
        with pytest.raises(TaskDeferred):
            _operator(cfg, tmp_path).execute(make_context(store))
        pod1 = store.get(STATE_KEY)["attempts"][0]["handle"]["pod"]
        until = time.time() + 20
        while time.time() < until and pod1 not in cloud.procs:
            time.sleep(0.05)
        with pytest.raises(TaskDeferred):  # the worker died; a new try starts
            _operator(cfg, tmp_path).execute(make_context(store, try_number=2))
        st = store.get(STATE_KEY)
        assert len(st["attempts"]) == 1 and st["current"] == 0  # re-attached, nothing new launched
        cloud.inject(pod1, "pod_gc")  # the node is deleted; PodGC fails the pod
        time.sleep(0.5)
        with pytest.raises(TaskDeferred):
            _operator(cfg, tmp_path).execute(make_context(store, try_number=3))
        st = store.get(STATE_KEY)
        assert st["attempts"][0]["outcome"] == "preempted"
        assert len(st["attempts"]) == 2 and st["current"] == 1
        api = KubernetesBackend(image="img", config_file=cfg).api
        pods = [
            p.metadata.name
            for p in api.list_namespaced_pod(
                "default", label_selector="airflow-spot/task-id=train"
            ).items
        ]
        assert pods == [st["attempts"][1]["handle"]["pod"]]
        _operator(cfg, tmp_path).on_kill()  # no live handle on a fresh operator: nothing happens
        KubernetesBackend(image="img", config_file=cfg).cancel(
            AttemptHandle.from_dict(st["attempts"][1]["handle"]), wait_s=5
        )
        assert (
            api.list_namespaced_pod("default", label_selector="airflow-spot/task-id=train").items
            == []
        )
    finally:
        cloud.stop()


def test_node_pools_cheapest_with_capacity(kube, tmp_path: Path) -> None:
    """Two spot node pools: the cheaper one has no capacity, so its pod stays unschedulable, the
    pool cools down, and the job runs in the other pool, billed at that pool's price."""
    from airflow_spot.backends.kubernetes.backend import KubePool

    _, cfg = kube
    zone_a = KubePool(
        "zone-a",
        Placement(
            {"karpenter.sh/capacity-type": "spot", "topology.kubernetes.io/zone": "us-east-1a"}
        ),
        0.8,
    )
    zone_b = KubePool(
        "zone-b",
        Placement(
            {"karpenter.sh/capacity-type": "spot", "topology.kubernetes.io/zone": "us-east-1b"}
        ),
        1.2,
    )
    cloud = FakeCloud(cfg, tmp_path / "nodes")
    cloud.blocked_selectors.append({"topology.kubernetes.io/zone": "us-east-1a"})
    cloud.start()
    try:
        op = SpotTrainingOperator(
            task_id="train",
            command=train_command(40, step_seconds=0.02),
            checkpoint_uri=str(tmp_path / "ckpt"),
            expected_compute=timedelta(seconds=1),
            total_steps=40,
            deadline=timedelta(seconds=60),
            changeover=timedelta(seconds=0.5),
            policy="greedy",
            backend=KubernetesBackend(
                image="img",
                config_file=cfg,
                preset="karpenter",
                pools=(zone_a, zone_b),
                pending_timeout_s=1.0,
                spot_cooldown_s=30.0,
            ),
            decision_interval=timedelta(seconds=0.5),
            poll_interval=0.1,
            deferrable=False,
        )
        store = FileTaskStateStore(tmp_path / "state.json")
        summary = op.execute(make_context(store))
    finally:
        cloud.stop()
    attempts = store.get(STATE_KEY)["attempts"]
    assert (attempts[0]["pool"], attempts[0]["outcome"]) == ("zone-a", "spot_unavailable")
    assert (attempts[-1]["pool"], attempts[-1]["outcome"]) == ("zone-b", "succeeded")
    assert {s["price_per_h"] for s in summary["segments"] if s["pool"] == "zone-b"} == {1.2}
    assert KubernetesBackend.from_dict(op.backend.to_dict()) == op.backend


def test_an_on_demand_pod_is_recorded_as_not_spot(kube) -> None:
    """An on-demand pod that cannot be scheduled is a capacity/quota problem, not 'spot
    unavailable' (which the controller would treat like a preemption)."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    assert b.launch(IDENT, 1, "on_demand", ["x"], checkpoint_uri="/c").was_spot is False
    assert b.launch(IDENT, 2, "spot", ["x"], checkpoint_uri="/c").was_spot is True


def _pod_names(b: KubernetesBackend) -> list[str]:
    return [p.metadata.name for p in b.api.list_namespaced_pod("default").items]


def test_a_container_that_cannot_start_fails_the_attempt_and_its_pod_goes(kube) -> None:
    """ImagePullBackOff keeps a scheduled pod Pending for ever: after the pending bound the
    attempt is an application failure naming the reason, and the pod (which holds a node) is
    deleted even with delete_pods='never'."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg, pending_timeout_s=0.5, delete_pods="never")
    h = b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    waiting = {
        "name": "train",
        "image": "registry.example/missing:1",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
    }
    b.api.patch_namespaced_pod_status(
        h.pod, "default", {"status": {"phase": "Pending", "containerStatuses": [waiting]}}
    )
    assert b.status(h).state.value == "waiting"  # a pull can be slow or retried: not yet
    time.sleep(0.6)
    st = b.status(h)
    assert (st.state.value, st.outcome.value) == ("ended", "app_failure")
    assert "ImagePullBackOff" in st.reason and "Back-off pulling image" in st.reason
    assert st.due == ("give_up",) and _pod_names(b) == [h.pod]  # status() only reports
    b.carry_out(h, st)
    assert _pod_names(b) == []
    assert b.status(h).outcome.value == "app_failure"  # the 404 now is ours: the verdict stays


def test_a_spot_pod_given_up_as_unschedulable_is_deleted(kube) -> None:
    """'Spot unavailable' ends the attempt; the pending pod must not start later beside the
    next attempt, whatever delete_pods says."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg, pending_timeout_s=0.2, delete_pods="never")
    h = b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    b.api.patch_namespaced_pod_status(
        h.pod, "default", {"status": {"phase": "Pending", "conditions": [unschedulable]}}
    )
    time.sleep(0.3)
    st = b.status(h)
    assert st.outcome.value == "spot_unavailable"
    b.carry_out(h, st)
    assert _pod_names(b) == []


def test_labels_and_names_stay_valid_and_distinct() -> None:
    """Run ids that differ only in characters a label cannot hold get different labels (the
    leftover cleanup selects by them); ids made only of '_' or '.' still give a valid name."""
    from airflow_spot.backends.kubernetes.pods import label_value, pod_name

    a, b = "manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00_00_00_00_00"
    assert label_value(a) != label_value(b) and label_value(b) == b
    for text in (a, "x" * 80, "___", ":x:"):
        v = label_value(text)
        assert len(v) <= 63 and v[0].isalnum() and v[-1].isalnum(), v
    name = pod_name("__", "..", 1, "r")
    assert name[0].isalnum() and len(name) <= 63, name


def test_mapped_task_instances_get_their_own_pods(kube) -> None:
    """Two map indexes of one task launch attempt 1 side by side without a name clash."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    h0 = b.launch({**IDENT, "map_index": 0}, 1, "spot", ["x"], checkpoint_uri="/c0")
    h1 = b.launch({**IDENT, "map_index": 1}, 1, "spot", ["x"], checkpoint_uri="/c1")
    assert h0.pod != h1.pod
    assert sorted(_pod_names(b)) == sorted([h0.pod, h1.pod])


def test_cancel_deletes_the_pod_even_when_its_status_cannot_be_read(kube, monkeypatch) -> None:
    """A 403 on nodes (or a 500) while cancelling must not leave the training pod running."""
    from kubernetes.client.exceptions import ApiException

    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    h = b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    h.node = "spot-node-1"

    def forbidden(name, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(b.api, "read_node", forbidden)
    with pytest.raises(BackendError, match="403 Forbidden .*get on nodes"):
        b.status(h)
    st = b.cancel(h, wait_s=5)
    assert st.outcome.value == "cancelled"
    assert _pod_names(b) == []


def test_a_launch_keeps_ended_pods_kept_for_inspection(kube) -> None:
    """delete_pods='never' keeps every ended attempt pod: the next launch removes only a live
    leftover (which could train beside it). With 'always' an ended leftover goes too."""
    _, cfg = kube
    for policy, kept in (("never", True), ("always", False)):
        b = KubernetesBackend(image="img", config_file=cfg, delete_pods=policy)
        ident = {**IDENT, "task_id": f"train-{policy}"}
        h1 = b.launch(ident, 1, "spot", ["x"], checkpoint_uri="/c")
        b.api.patch_namespaced_pod_status(h1.pod, "default", {"status": {"phase": "Failed"}})
        h2 = b.launch(ident, 2, "spot", ["x"], checkpoint_uri="/c")
        h3 = b.launch(ident, 3, "on_demand", ["x"], checkpoint_uri="/c")  # h2 is live: goes
        names = set(_pod_names(b))
        assert (h1.pod in names) is kept and h2.pod not in names and h3.pod in names


def test_the_log_tail_is_text(kube) -> None:
    """The failed attempt's log tail reads as text lines, not a bytes repr."""
    k, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    h = b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    k.emulator.pod_logs = {("default", h.pod): "step 10 loss 0.5\nTraceback: boom\n"}
    assert b.log_tail(h) == "step 10 loss 0.5\nTraceback: boom\n"


def test_the_pod_template_is_merged_not_overridden(kube, tmp_path: Path) -> None:
    """The template's resources, node selector, tolerations and security settings survive;
    ours are added. A template file (YAML) works like the dict; a malformed one is refused
    when the DAG is parsed, naming the field."""
    _, cfg = kube
    template = {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "nodeSelector": {"topology.kubernetes.io/zone": "us-west-2a"},
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
    import yaml

    path.write_text(yaml.safe_dump(template))
    for tmpl in (template, str(path), path):
        b = KubernetesBackend(image="img", config_file=cfg, preset="gke", gpus=1, pod_template=tmpl)
        h = b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
        pod = b.api.read_namespaced_pod(h.pod, "default")
        c = pod.spec.containers[0]
        assert c.resources.limits == {"memory": "60Gi", "nvidia.com/gpu": "1"}
        assert c.resources.requests == {"cpu": "8"}
        assert pod.spec.node_selector == {
            "topology.kubernetes.io/zone": "us-west-2a",
            "cloud.google.com/gke-spot": "true",
        }
        assert {t.key for t in pod.spec.tolerations} == {
            "nvidia.com/gpu",
            "cloud.google.com/gke-spot",
        }
        assert pod.spec.security_context.run_as_user == 2000
        assert pod.spec.security_context.run_as_non_root is True
        assert c.security_context.read_only_root_filesystem is True
        assert c.security_context.allow_privilege_escalation is False
        assert pod.metadata.labels["team"] == "ml" and "airflow-spot/attempt" in pod.metadata.labels
        assert KubernetesBackend.from_dict(b.to_dict()) == b
    for bad, match in (
        ({"spec": {"containers": {"name": "train"}}}, r"spec.containers must be a list"),
        ({"kind": "Deployment"}, "must be a Pod"),
        (42, "got int"),
    ):
        with pytest.raises(ConfigError, match=f"backend.pod_template: .*{match}"):
            KubernetesBackend(image="img", pod_template=bad)
    missing = KubernetesBackend(
        image="img", config_file=cfg, pod_template=str(tmp_path / "no.yaml")
    )
    with pytest.raises(ConfigError, match="backend.pod_template: cannot read"):
        missing.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")


def test_events_of_a_namesake_node_or_pod_are_not_read(kube) -> None:
    """Events outlive their object: a spot warning on an earlier node of the same name (other
    uid), or on an earlier pod of the same name, is not a notice for this attempt."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    b.api.create_node(
        {"metadata": {"name": "n1", "labels": {"karpenter.sh/capacity-type": "spot"}}}
    )
    h = b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    b.api.patch_namespaced_pod(h.pod, "default", {"spec": {"nodeName": "n1"}})
    b.api.patch_namespaced_pod_status(h.pod, "default", {"status": {"phase": "Running"}})

    def event(name, kind, obj, uid, reason, message):
        b.api.create_namespaced_event(
            "default",
            {
                "metadata": {"name": name},
                "reason": reason,
                "message": message,
                "type": "Warning",
                "involvedObject": {"kind": kind, "name": obj, "uid": uid},
            },
        )

    event("old-node", "Node", "n1", "uid-of-an-earlier-n1", "SpotInterrupted", "Spot warning")
    event("old-pod", "Pod", h.pod, "uid-of-an-earlier-pod", "Preempted", "Preempt")
    st = b.status(h)
    assert st.state.value == "running" and st.evidence["notice"] is None
    # node-problem-detector (AKS relays scheduled events with it) and the kubelet give a node
    # event the node's name as uid
    event("npd", "Node", "n1", "n1", "VMEventScheduled", "Node will change into status 'Preempt'")
    st = b.status(h)
    assert st.state.value == "preempting" and st.evidence["notice"] == "scheduled event Preempt"
    assert st.due == ("relay_notice",)
    b.carry_out(h, st)
    assert h.notice_sent is True and b.status(h).due == ()
    node_uid = b.api.read_node("n1").metadata.uid
    event("this-node", "Node", "n1", node_uid, "SpotInterrupted", "Spot warning")
    assert b.status(h).evidence["notice"] == "scheduled event Preempt"  # the first one is kept


def test_cancel_leaves_a_failed_pod_for_its_log_to_be_read(kube) -> None:
    """A pod that failed on its own before the cancel keeps its log until the controller has
    read it; the controller's cleanup then deletes it."""
    k, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg)
    h = b.launch(IDENT, 1, "on_demand", ["x"], checkpoint_uri="/c")
    k.emulator.pod_logs = {("default", h.pod): "Traceback: loss is NaN\n"}
    failed = {"name": "train", "image": "img", "imageID": "", "ready": False, "restartCount": 0}
    failed["state"] = {"terminated": {"exitCode": 1, "reason": "Error"}}
    b.api.patch_namespaced_pod_status(
        h.pod, "default", {"status": {"phase": "Failed", "containerStatuses": [failed]}}
    )
    st = b.cancel(h)
    assert st.outcome.value == "app_failure"
    assert b.log_tail(h) == "Traceback: loss is NaN\n"
    b.release(h, st.outcome.value)
    assert _pod_names(b) == []


@pytest.mark.parametrize(
    ("backend", "template", "check"),
    [
        (  # a KPO-style GPU template: our gpus replace its GPU request and limit
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
            lambda pod, c: (
                c.resources.limits == {"memory": "32Gi", "nvidia.com/gpu": "8"}
                and c.resources.requests == {"memory": "32Gi"}
            ),
        ),
        (  # our memory request replaces the template's memory limit (not request > limit)
            {"resources": {"requests": {"memory": "64Gi"}}},
            {"containers": [{"name": "base", "resources": {"limits": {"memory": "32Gi"}}}]},
            lambda pod, c: c.resources.requests == {"memory": "64Gi"} and not c.resources.limits,
        ),
        (  # privileged (RDMA): no allowPrivilegeEscalation=false beside it
            {},
            {"containers": [{"name": "train", "securityContext": {"privileged": True}}]},
            lambda pod, c: (
                c.security_context.privileged is True
                and c.security_context.allow_privilege_escalation is None
            ),
        ),
        (  # root asked for: no runAsNonRoot beside it
            {},
            {"securityContext": {"runAsUser": 0}, "containers": [{"name": "base"}]},
            lambda pod, c: (
                pod.spec.security_context.run_as_user == 0
                and pod.spec.security_context.run_as_non_root is None
                and c.security_context.run_as_non_root is None
            ),
        ),
        (  # a template with only a sidecar: it stays a sidecar with its own limits
            {},
            {
                "containers": [
                    {
                        "name": "log-shipper",
                        "image": "fluent/fluent-bit",
                        "resources": {"limits": {"memory": "256Mi"}},
                    }
                ]
            },
            lambda pod, c: (
                [(x.name, x.image) for x in pod.spec.containers]
                == [("train", "img"), ("log-shipper", "fluent/fluent-bit")]
                and c.resources is None
                and pod.spec.containers[1].resources.limits == {"memory": "256Mi"}
            ),
        ),
        (  # the training container is found by name, wherever it is
            {},
            {
                "containers": [
                    {"name": "proxy", "image": "envoy"},
                    {"name": "train", "resources": {"limits": {"cpu": "8"}}},
                ]
            },
            lambda pod, c: (
                [x.name for x in pod.spec.containers] == ["train", "proxy"]
                and c.resources.limits == {"cpu": "8"}
            ),
        ),
    ],
    ids=["gpu", "request-over-template-limit", "privileged", "root", "sidecar-only", "by-name"],
)
def test_a_template_and_our_settings_make_a_valid_pod(kube, backend, template, check) -> None:
    """Merging the template never yields a pod the API server or kubelet would refuse."""
    _, cfg = kube
    b = KubernetesBackend(image="img", config_file=cfg, pod_template={"spec": template}, **backend)
    pod = b.api.read_namespaced_pod(
        b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c").pod, "default"
    )
    assert check(pod, pod.spec.containers[0]), pod.spec


def test_resources_and_placements_the_api_would_refuse_name_the_field(kube) -> None:
    """A request above its limit, a GPU request unlike its limit, a mistyped toleration and
    odd resources are refused with the field named, not as a 422 on every launch."""
    _, cfg = kube
    # the backend's own resources are checked when it is built (the DAG is parsed)
    with pytest.raises(ConfigError, match="backend.resources: .*above its limit"):
        KubernetesBackend(
            image="img", resources={"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}
        )
    with pytest.raises(ConfigError, match="backend.resources: memory: '64Gb' is not a quantity"):
        KubernetesBackend(image="img", resources={"limits": {"memory": "64Gb"}})
    # merged with `gpus` (or a template's limits) at launch
    b = KubernetesBackend(
        image="img", config_file=cfg, gpus=2, resources={"requests": {"nvidia.com/gpu": "1"}}
    )
    with pytest.raises(ConfigError, match="backend.resources: .*must equal its limit"):
        b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    with pytest.raises(
        ConfigError, match=r"placement.tolerations: unknown field\(s\) \['opertor'\]"
    ):
        Placement({"pool": "a"}, ({"key": "gpu", "opertor": "Exists"},))
    with pytest.raises(ConfigError, match="placement.tolerations: operator"):
        Placement({}, ({"key": "gpu", "operator": "In"},))
    with pytest.raises(ConfigError, match="backend.resources"):
        KubernetesBackend(image="img", resources={"memory": "64Gi"})
    with pytest.raises(ConfigError, match="backend.gpus"):
        KubernetesBackend(image="img", gpus=1.5)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"namespace": "Bad_NS"}, "backend.namespace"),
        ({"namespace": ""}, "backend.namespace"),
        ({"preset": {"spot": {"node_selector": {}}, "on_demand": {}}}, "backend.preset"),
        ({"pending_timeout_s": "10m"}, "backend.pending_timeout_s"),
        ({"spot_cooldown_s": float("nan")}, "backend.spot_cooldown_s"),
        ({"grace_period_s": -1}, "backend.grace_period_s"),
        ({"env": {"A": 1}}, "backend.env"),
        ({"env_from_secrets": "mysecret"}, "backend.env_from_secrets"),
        ({"service_account": "Bad SA"}, "backend.service_account"),
        ({"in_cluster": "yes"}, "backend.in_cluster"),
        ({"pools": [{"name": "a"}]}, "backend.pools"),
        ({"pools": ("zone-a",)}, "backend.pools"),
    ],
)
def test_every_backend_field_is_checked_when_the_dag_is_parsed(kwargs: dict, field: str) -> None:
    """Each was accepted before and failed at launch, at to_dict(), or never."""
    with pytest.raises(ConfigError, match=f"^{re.escape(field)}: "):
        KubernetesBackend(image="img", **kwargs)


def test_pool_prices_and_price_sources_are_checked() -> None:
    from airflow_spot.backends.kubernetes.backend import KubePool

    with pytest.raises(
        ConfigError, match=r"backend.pools: pool 'a': placement must be a Placement"
    ):
        KubePool("a", {"node_selector": {}})
    with pytest.raises(ConfigError, match=r"backend.pools: pool 'a': spot_price"):
        KubePool("a", Placement(), spot_price=-1)
    with pytest.raises(ConfigError, match=r"backend.pools\[a\].price_from: give"):
        KubePool("a", Placement(), price_from={"aws_conn_id": "aws", "instance": "p3.2xlarge"})
    ok = KubePool(
        "a", Placement(), price_from={"instance_type": "p3.2xlarge", "zone": "us-east-1a"}
    )
    b = KubernetesBackend(image="img", pools=[ok], env_from_secrets=["hf-token"])
    assert b.pools == (ok,) and b.env_from_secrets == ("hf-token",)  # lists become tuples


def test_a_refused_create_says_what_the_server_said() -> None:
    """A missing ServiceAccount is a 403 that reads like RBAC unless the message is kept."""
    from types import SimpleNamespace

    from airflow_spot.backends.kubernetes.backend import api_message

    body = '{"kind":"Status","message":"pods \\"p\\" is forbidden: error looking up service account ml/x: serviceaccount \\"x\\" not found","code":403}'
    assert 'serviceaccount "x" not found' in api_message(SimpleNamespace(body=body))
    assert api_message(SimpleNamespace(body="not json")) == ""
    assert api_message(SimpleNamespace(body=None)) == ""


def test_a_notice_for_a_pod_already_gone_is_dropped_not_raised(kube) -> None:
    """The notice is relayed after a look; the pod can be evicted in between (seen on the
    real control plane with a drain): the 404 is no error, the next look gives the verdict.
    Any other refusal names the pod and the permission."""
    from kubernetes.client.exceptions import ApiException

    from airflow_spot.backends.kubernetes.backend import BackendError

    _, cfg = kube
    b = KubernetesBackend(image="x", config_file=cfg, namespace="default")
    calls: list[int] = []

    def refuse(status: int):
        def patch(*args, **kwargs):
            calls.append(status)
            raise ApiException(status=status, reason="Not Found" if status == 404 else "Forbidden")

        return patch

    b.api.patch_namespaced_pod = refuse(404)  # type: ignore[method-assign]
    b._relay_notice("gone", "spot-itn")
    b.api.patch_namespaced_pod = refuse(403)  # type: ignore[method-assign]
    with pytest.raises(BackendError, match=r"notice to pod gone: 403.*patch on pods.*rbac.yaml"):
        b._relay_notice("gone", "spot-itn")
    assert calls == [404, 403]
