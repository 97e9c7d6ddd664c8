"""Behaviours the FakeKube tests alone checked, now on the real control plane (issue 20): the
real kube-apiserver, scheduler and controllers, our kubelet running each pod as a process.

* the attempt pod as the real server stores it carries the notice annotation, the
  downward-API volume that mounts it where the container looks, and ``restartPolicy: Never``;
* an on-demand pod the real scheduler cannot place is no "spot unavailable";
* a namesake pod's ``Preempted`` event (the real scheduler's, on an earlier pod of the same
  name) is not read for this attempt, and the first interruption notice is the one kept;
* a notice relayed to a pod gone since the look (a real 404) is dropped; a refused relay (a
  real 403) names the permission;
* cancel leaves a pod that failed on its own for its log to be read, and a launch with
  ``delete_pods="always"`` removes an ended leftover;
* a held (make-before-break) pod trains nothing until released, then resumes from the
  checkpoint the on-demand attempt saved as it stopped;
* probes: refused by a Karpenter ICE for their pool (down, no node made, nothing bound);
  unschedulable past the 60 s rule with no scale-up asked for (down); a new probe replaces
  the task's leftover; a worker that may not create the PriorityClass is told once;
* the operator: a training process that exits 78 fails the task at once with a ConfigError
  quoting its last log line (read through the real ``pods/log``); an attempt pod a dying
  worker launched but never recorded is adopted by the next try (re-attached while it
  trains), and one found beside an attempt that trains is stopped while that one keeps its
  place (it lost it before this test: the try then launched another attempt and deleted the
  training pod as a leftover).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

# the constants and helpers test_real_claims.py (run first) defines, not a copy of them
from test_real_claims import (  # noqa: E402
    IDENT,
    NS,
    SLEEP,
    SPOT,
    ZONE,
    backend,
    until,
    warnings_of,
)

from airflow_spot.backends.base import Outcome, State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubePool, KubernetesBackend
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.backends.kubernetes.probe import SETTLE_S
from airflow_spot.exceptions import BackendError, ConfigError
from airflow_spot.testing.cluster.looks import wait_ended, wait_running


def gone(api, ns: str, name: str) -> bool:
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


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def event(api, ns: str, kind: str, name: str, uid: str, reason: str, message: str, **kw) -> str:
    """An event as client-go's recorder writes it: named ``<object>.<hex nanoseconds>`` (so
    the server, which lists by name, lists one object's events oldest first)."""
    now = time.time()
    ev_name = f"{name}.{time.time_ns():x}"
    api.create_namespaced_event(
        ns,
        {
            "metadata": {"name": ev_name},
            "reason": reason,
            "type": kw.pop("type", "Warning"),
            "message": message,
            "involvedObject": {"kind": kind, "name": name, "uid": uid, **kw.pop("obj", {})},
            "source": {"component": kw.pop("component", "custom-plugin-monitor")},
            "count": 1,
            "firstTimestamp": stamp(now),
            "lastTimestamp": stamp(now),
            **kw,
        },
    )
    return ev_name


def ice(api, zone: str) -> str:
    """Karpenter's ``InsufficientCapacityError`` on a NodeClaim it made and deleted (a
    NodeClaim is cluster-scoped: its events go to ``default``)."""
    claim = f"default-{uuid.uuid4().hex[:5]}"
    return event(
        api,
        "default",
        "NodeClaim",
        claim,
        str(uuid.uuid4()),
        "InsufficientCapacityError",
        f"NodeClaim {claim} event: insufficient capacity, with fleet error(s), "
        "InsufficientInstanceCapacity: We currently do not have sufficient g4dn.xlarge "
        f"capacity in the Availability Zone you requested ({zone}). Our system will be "
        "working on provisioning additional capacity.",
        obj={"apiVersion": "karpenter.sh/v1"},
        component="karpenter",
        reportingComponent="karpenter",
    )


def probes(api, ns: str) -> set[str]:
    return live(api, ns, "airflow-spot/probe=true")


@contextlib.contextmanager
def without_patch_on_pods(api, docs: list[dict]) -> None:
    """docker/rbac.yaml's namespaced Role with ``patch`` taken off pods."""
    from kubernetes import client

    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == NS)
    rules = [
        {**r, "verbs": [v for v in r["verbs"] if v != "patch"]} if "pods" in r["resources"] else r
        for r in role["rules"]
    ]
    client.RbacAuthorizationV1Api(api.api_client).replace_namespaced_role(
        role["metadata"]["name"], NS, {**role, "rules": rules}
    )


def allowed(b: KubernetesBackend, verb: str, resource: str, namespace: str | None) -> bool:
    from kubernetes import client

    attrs = {"verb": verb, "resource": resource, "namespace": namespace}
    review = client.AuthorizationV1Api(b.api.core.api_client).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(spec={"resourceAttributes": attrs})
    )
    return bool(review.status.allowed)


# -- the pod as the server stores it ----------------------------------------------------------
def test_the_notice_reaches_the_container_through_a_downward_api_volume(kube_cluster) -> None:
    """Stored by the real server (its defaults applied): the empty notice annotation, a
    downward-API volume of ``metadata.annotations`` mounted read-only in the training
    container where ``AIRFLOW_SPOT_NOTICE_ANNOTATIONS`` points, the checkpoint location and
    capacity in its environment, our GPUs as limit and (defaulted) request, and no restart
    (an ended attempt is judged, never rerun in place)."""
    from airflow_spot.backends.kubernetes.pods import attempt_pod, task_labels

    api, ns = kube_cluster.api, kube_cluster.namespace
    b = backend(kube_cluster.kubeconfig, ns, gpus=2)
    pod = attempt_pod(
        b,
        name="shape",
        labels=task_labels(IDENT),
        attempt=1,
        capacity="spot",
        command=["python", "-m", "train"],
        checkpoint_uri="s3://bucket/ckpt",
    )
    stored = api.create_namespaced_pod(ns, pod, dry_run="All")
    assert stored.metadata.annotations == {"airflow-spot/preemption-notice": ""}
    assert stored.spec.restart_policy == "Never"
    c = stored.spec.containers[0]
    env = {e.name: e.value for e in c.env}
    assert env["AIRFLOW_SPOT_CHECKPOINT_URI"] == "s3://bucket/ckpt"
    assert env["AIRFLOW_SPOT_CAPACITY"] == "spot"
    folder, file = os.path.split(env["AIRFLOW_SPOT_NOTICE_ANNOTATIONS"])
    (mount,) = [m for m in c.volume_mounts if m.mount_path == folder]
    assert mount.read_only is True
    (volume,) = [v for v in stored.spec.volumes if v.name == mount.name]
    items = [(i.path, i.field_ref.field_path) for i in volume.downward_api.items]
    assert items == [(file, "metadata.annotations")], volume
    assert c.resources.limits == {"nvidia.com/gpu": "2"}
    assert c.resources.requests == {"nvidia.com/gpu": "2"}  # the server's default


# -- pods that cannot be placed ---------------------------------------------------------------
def test_an_unschedulable_on_demand_pod_is_not_spot_unavailable(kube_cluster) -> None:
    """No node takes it and no autoscaler makes one: the on-demand attempt launches (not
    "waits for spot"), and past ``pending_timeout_s`` it is an infrastructure disruption (a
    capacity or quota problem), never "spot unavailable", which the operator would treat
    like a reclaim. Its pending pod is deleted all the same."""
    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    k.autoscale = False
    b = backend(kube_cluster.kubeconfig, ns, pending_timeout_s=2.0, delete_pods="never")
    h = b.launch(IDENT, 1, "on_demand", SLEEP, checkpoint_uri="/c")
    assert h.was_spot is False
    first = b.status(h)
    assert first.state is State.LAUNCHING, first
    st = until(lambda: (s := b.status(h)).terminal and s, 30, "no verdict")
    assert st.outcome is Outcome.INFRA_DISRUPTION and "unschedulable" in st.reason, st
    assert "Unschedulable" in str(
        api.read_namespaced_pod(h.pod, ns).status.conditions
    )  # the real scheduler's word
    b.carry_out(h, st)
    until(lambda: gone(api, ns, h.pod), 10, "the pending pod was not deleted")
    assert b.status(h).outcome is Outcome.INFRA_DISRUPTION


# -- events of other objects of the same name ---------------------------------------------------
def test_a_namesake_pods_preempted_event_is_not_read_for_this_attempt(kube_cluster) -> None:
    """A cleared task's attempt 1 reuses its pod name. The earlier pod of that name was
    preempted by the real scheduler for a higher-priority pod (its ``Preempted`` event
    stays). The new pod runs on spot and its node is drained: once it is gone (404) the
    attempt is a preemption, not "preempted by the scheduler", which only the earlier
    pod's event (another uid) says."""
    from kubernetes import client

    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    k.autoscale = False
    node = k.add_node("one-gpu-spot", SPOT, gpus=1)
    k.wait_ready(node)
    b = backend(kube_cluster.kubeconfig, ns)
    first = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    assert wait_running(b, first) == node
    earlier_uid = api.read_namespaced_pod(first.pod, ns).metadata.uid
    sched = client.SchedulingV1Api(api.api_client)
    with contextlib.suppress(client.ApiException):
        sched.create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name="urgent-test"), value=100000)
        )
    urgent = {
        "metadata": {"name": "urgent"},
        "spec": {
            "priorityClassName": "urgent-test",
            "nodeSelector": SPOT,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }

    def admitted() -> bool:  # the priority admission sees a new PriorityClass a moment late
        try:
            api.create_namespaced_pod(ns, urgent)
        except client.ApiException as e:
            if e.status != 403:
                raise
            return False
        return True

    until(admitted, 10, "the urgent pod was not admitted")
    until(lambda: gone(api, ns, first.pod), 60, "the scheduler did not preempt the pod")
    preempted = [
        e
        for e in api.list_namespaced_event(
            ns, field_selector=f"involvedObject.name={first.pod},reason=Preempted"
        ).items
    ]
    assert preempted and preempted[0].involved_object.uid == earlier_uid, preempted
    api.delete_namespaced_pod("urgent", ns, grace_period_seconds=0)
    until(lambda: gone(api, ns, "urgent"), 30, "the urgent pod stayed")

    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")  # the cleared task's attempt 1
    assert h.pod == first.pod
    assert wait_running(b, h) == node
    assert h.pod_uid and h.pod_uid != earlier_uid
    k.reclaim(node, "drain")
    until(lambda: gone(api, ns, h.pod), 30, "the drained pod stayed")
    st = wait_ended(b, h, 10)  # looked at only once the pod is gone: its 404
    assert st.outcome is Outcome.PREEMPTED, st
    assert "scheduler" not in st.reason, st


def test_the_first_interruption_notice_is_the_one_kept(kube_cluster) -> None:
    """node-problem-detector relays AKS's scheduled ``Preempt`` onto the node (the node's
    name as uid): the notice, relayed to the pod. A later spot warning on the same node
    (its real uid) leaves the recorded notice as it was."""
    api, ns = kube_cluster.api, kube_cluster.namespace
    b = backend(kube_cluster.kubeconfig, ns)
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    node = wait_running(b, h)
    made: list[str] = []
    try:
        msg = "Node will change into status 'Preempt' (Azure scheduled event)"
        made.append(event(api, "default", "Node", node, node, "VMEventScheduled", msg))
        st = until(lambda: (s := b.status(h)).due and s, 10, "no notice seen")
        assert st.state is State.PREEMPTING and st.evidence["notice"] == "scheduled event Preempt"
        assert st.due == ("relay_notice",)
        b.carry_out(h, st)
        assert h.notice_sent is True and b.status(h).due == ()
        uid = api.read_node(node).metadata.uid
        time.sleep(0.01)  # a later event: named after it
        made.append(event(api, "default", "Node", node, uid, "SpotInterrupted", "Spot warning"))
        names = [
            e.metadata.name
            for e in api.list_event_for_all_namespaces(
                field_selector=f"involvedObject.name={node}"
            ).items
            if e.metadata.name in made
        ]
        assert names == made  # the server lists them oldest first
        st = b.status(h)
        assert st.evidence["notice"] == "scheduled event Preempt", st
        ann = api.read_namespaced_pod(h.pod, ns).metadata.annotations
        assert ann["airflow-spot/preemption-notice"] == "scheduled event Preempt"
    finally:
        for name in made:
            with contextlib.suppress(Exception):
                api.delete_namespaced_event(name, "default")


def test_a_later_cloud_notice_replaces_karpenters_taint_as_the_one_kept(kube_cluster) -> None:
    """Karpenter's ``karpenter.sh/disrupted`` taint comes first (it alone may be a
    consolidation), then the cloud's own spot warning on the node: the recorded notice becomes
    the cloud's word, and the taint alone (the event expired) does not take it back, so a
    verdict read once the node is gone still has the cloud's evidence."""
    api, ns = kube_cluster.api, kube_cluster.namespace
    b = backend(kube_cluster.kubeconfig, ns)
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    node = wait_running(b, h)
    made: list[str] = []
    try:
        taints = list(api.read_node(node).spec.taints or [])
        disrupted = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
        api.patch_node(
            node,
            {
                "spec": {
                    "taints": [*map(api.api_client.sanitize_for_serialization, taints), disrupted]
                }
            },
        )
        st = until(lambda: (s := b.status(h)).due and s, 10, "no notice seen")
        assert st.evidence["notice"] == "node taint karpenter.sh/disrupted", st
        uid = api.read_node(node).metadata.uid
        made.append(event(api, "default", "Node", node, uid, "SpotInterrupted", "Spot warning"))
        st = until(
            lambda: (
                (s := b.status(h)).evidence["notice"] != "node taint karpenter.sh/disrupted" and s
            ),
            10,
            "the cloud's notice was not recorded",
        )
        assert st.evidence["notice"] == "event SpotInterrupted", st
        api.delete_namespaced_event(made.pop(), "default")  # as the event TTL would
        assert b.status(h).evidence["notice"] == "event SpotInterrupted"  # the taint alone
    finally:
        for name in made:
            with contextlib.suppress(Exception):
                api.delete_namespaced_event(name, "default")


# -- the notice relay -------------------------------------------------------------------------
def test_a_notice_for_a_pod_gone_since_the_look_is_dropped_and_a_refusal_is_named(
    kube_cluster, sa_kubeconfig
) -> None:
    """As the ServiceAccount of docker/rbac.yaml: a look finds the notice due, the pod is
    deleted before it is relayed (the real server answers 404): dropped, no error, and the
    next look has the verdict. With ``patch`` on pods taken away, the relay's 403 names the
    pod, the permission and docker/rbac.yaml."""
    cfg, docs = sa_kubeconfig
    api, k = kube_cluster.api, kube_cluster.kubelet
    b = backend(cfg, NS)
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    node = wait_running(b, h)
    k._notice(node)  # Karpenter's interruption warning, no eviction yet
    st = until(lambda: (s := b.status(h)).due and s, 20, "no notice seen")
    assert st.due == ("relay_notice",), st
    api.delete_namespaced_pod(h.pod, NS, grace_period_seconds=0)
    until(lambda: gone(api, NS, h.pod), 30, "the pod stayed")
    b.carry_out(h, st)  # the 404: dropped
    end = wait_ended(b, h, 10)
    assert end.outcome is Outcome.PREEMPTED, end

    without_patch_on_pods(api, docs)
    until(lambda: not allowed(b, "patch", "pods", NS), 10, "RBAC change not seen")
    h2 = b.launch(IDENT, 2, "spot", SLEEP, checkpoint_uri="/c")
    node2 = wait_running(b, h2)
    k._notice(node2)
    st = until(lambda: (s := b.status(h2)).due and s, 20, "no notice seen")
    with pytest.raises(BackendError, match=rf"notice to pod {h2.pod}: 403.*patch on pods.*rbac"):
        b.carry_out(h2, st)
    assert h2.notice_sent is False


# -- ended pods and their logs ----------------------------------------------------------------
def test_cancel_leaves_a_pod_that_failed_on_its_own_for_its_log(kube_cluster) -> None:
    """The pod failed before the cancel came: cancel gives its verdict and deletes nothing,
    so its log is still read through the real ``pods/log``; the release then deletes it."""
    api, ns = kube_cluster.api, kube_cluster.namespace
    b = backend(kube_cluster.kubeconfig, ns, gpus=0)
    cmd = ["sh", "-c", "echo step 10 loss 0.5; echo 'Traceback: loss is NaN'; exit 1"]
    h = b.launch(IDENT, 1, "on_demand", cmd, checkpoint_uri="/c")
    until(lambda: api.read_namespaced_pod(h.pod, ns).status.phase == "Failed", 30, "never failed")
    st = b.cancel(h, wait_s=5)
    assert st.outcome is Outcome.APP_FAILURE and st.exit_code == 1, st
    assert not gone(api, ns, h.pod)
    assert b.log_tail(h) == "step 10 loss 0.5\nTraceback: loss is NaN\n"
    b.release(h, st.outcome.value)
    until(lambda: gone(api, ns, h.pod), 10, "the released pod stayed")


def test_with_delete_pods_always_a_launch_removes_an_ended_leftover(kube_cluster) -> None:
    """``delete_pods="never"`` keeps ended pods through later launches (test_real_claims); with
    ``"always"`` the next launch removes an ended pod of the task the release did not."""
    api, ns = kube_cluster.api, kube_cluster.namespace
    b = backend(kube_cluster.kubeconfig, ns, gpus=0)
    h1 = b.launch(IDENT, 1, "on_demand", ["sh", "-c", "exit 3"], checkpoint_uri="/c")
    assert wait_ended(b, h1).outcome is Outcome.APP_FAILURE
    h2 = b.launch(IDENT, 2, "on_demand", SLEEP, checkpoint_uri="/c")
    assert gone(api, ns, h1.pod) and not gone(api, ns, h2.pod)


# -- make-before-break --------------------------------------------------------------------------
def test_a_held_pod_trains_nothing_until_released_then_resumes(
    kube_cluster, tmp_path: Path
) -> None:
    """On demand trains; a held spot pod is bound and started beside it, ready, training
    nothing. The on-demand attempt is cancelled: it checkpoints on SIGTERM and stops. Nothing
    is read or written until the release; then the spot attempt resumes from that very
    checkpoint and finishes."""
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store
    from airflow_spot.checkpoint.training import ENV, HOLD_ANNOTATION, NOTICE_ANNOTATION
    from airflow_spot.testing import train_command

    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    ckpt = tmp_path / "ckpt"
    steps = 400

    def latest() -> int:
        m = Checkpoints(open_store(str(ckpt))).latest_manifest()
        return m.step if m else 0

    def launch(attempt: int, capacity: str, **kw: Any):
        cmd = train_command(steps, step_seconds=0.02, save_every=5, seed=7)
        return b.launch(IDENT, attempt, capacity, cmd, checkpoint_uri=str(ckpt), **kw)

    def log(h) -> str:
        return (k.workdir / ns / str(h.pod) / "container.log").read_text()

    b = backend(kube_cluster.kubeconfig, ns, gpus=0)
    od = launch(1, "on_demand")
    wait_running(b, od)
    until(lambda: latest() >= 10, 30, "on-demand never saved")
    spot = launch(2, "spot", hold=True)
    pod = api.read_namespaced_pod(spot.pod, ns)
    ann = dict(pod.metadata.annotations)
    assert float(ann.pop("airflow-spot/launched-at")) <= time.time()
    assert ann == {NOTICE_ANNOTATION: "", HOLD_ANNOTATION: "wait"}
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env[ENV["hold"]] == env[ENV["notice_annotations"]]  # one downward-API file
    ready = until(lambda: (s := b.status(spot)).ready_at is not None and s, 60, "never ready")
    assert ready.state is State.LAUNCHING and ready.started_at is None, ready
    assert ready.granted_at is not None and ready.ready_at >= ready.granted_at - 1.0
    assert b.status(od).state is State.RUNNING  # the held launch kept the on-demand pod
    assert f"{ns}/{spot.pod}" in k.procs  # its container runs, held

    stopped = b.cancel(od, wait_s=20)  # on-demand checkpoints on SIGTERM and stops
    assert stopped.outcome is Outcome.CANCELLED, stopped
    saved = latest()
    assert f"checkpoint at step {saved} saved" in log(od)  # on SIGTERM: nothing lost
    time.sleep(1.0)  # held: nothing read, nothing written
    assert latest() == saved
    still = b.status(spot)
    assert still.started_at is None and still.ready_at is not None, still

    released_at = time.time()
    b.release_hold(spot)
    st = until(lambda: (s := b.status(spot)).started_at is not None and s, 20, "not released")
    assert st.started_at >= released_at - 1e-3 and st.state is State.RUNNING, st
    until(lambda: latest() > saved, 20, "the spot attempt saved nothing")
    text = log(spot)
    assert text.index("Released") < text.index("Resuming"), text
    assert f"(step {saved} of {steps})" in text  # resumed from the checkpoint saved on stopping
    end = wait_ended(b, spot, 40)
    assert end.outcome is Outcome.SUCCEEDED, end


# -- probes ---------------------------------------------------------------------------------------
def test_a_probe_refused_by_a_karpenter_ice_for_its_pool_costs_nothing(kube_cluster) -> None:
    """Two spot pools; spot cannot be had in zone a (no node is made for it). The probe for
    zone a is Unschedulable on the real scheduler; Karpenter's ICE naming zone a's zone
    answers it: down, nothing bound, no node made. Zone b's Ready spot node with a free GPU
    is up for zone b only. Dropped, the probe goes (dropping it twice is fine)."""
    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    k.spot_available = False
    zones = {"zone-a": "eu-west-3a", "zone-b": "eu-west-3b"}
    pools = tuple(KubePool(p, Placement({**SPOT, ZONE: z}), 1.0) for p, z in zones.items())
    b = backend(kube_cluster.kubeconfig, ns, pools=pools)
    spare = k.add_node("spot-zone-b", {**SPOT, ZONE: zones["zone-b"]})
    k.wait_ready(spare)
    p = b.probe(IDENT, pool="zone-a")
    assert set(p) == {"namespace", "name", "pool", "created_at"} and p["pool"] == "zone-a"

    def unschedulable() -> bool:
        pod = api.read_namespaced_pod(p["name"], ns)
        return any(c.reason == "Unschedulable" for c in pod.status.conditions or [])

    until(unschedulable, 30, "the probe was not marked Unschedulable")
    assert b.probe_signal(p, time.time()) is None  # refused by nobody yet: nothing known
    made = ice(api, zones["zone-a"])
    try:
        s = until(lambda: b.probe_signal(p, time.time()), 10, "the probe said nothing")
        assert (s.up, s.source, s.pool) == (False, "probe", "zone-a"), s
        assert "InsufficientCapacityError" in s.detail and "g4dn.xlarge" in s.detail, s
        got = {(x.source, x.pool, x.up) for x in b.spot_signals(time.time())}
    finally:
        api.delete_namespaced_event(made, "default")
    assert got == {("karpenter", "zone-a", False), ("node", "zone-b", True)}, got
    assert api.read_namespaced_pod(p["name"], ns).spec.node_name is None
    assert list(k.nodes) == [spare]  # nothing made for the probe: it costs nothing
    b.drop_probe(p)
    until(lambda: b.probe_signal(p, time.time()) is None and not probes(api, ns), 10)
    b.drop_probe(p)  # already gone: fine


def test_an_unschedulable_probe_is_down_after_60_s_with_no_scale_up(kube_cluster) -> None:
    """No spot node and no autoscaler: the real scheduler marks the probe Unschedulable.
    Before ``SETTLE_S`` (60 s) nothing is known (an autoscaler may still act); from then on,
    with no scale-up asked for, spot is down. A scale-up event on the probe (a node being
    made) keeps it unknown past 60 s."""
    k, api, ns = kube_cluster.kubelet, kube_cluster.api, kube_cluster.namespace
    k.autoscale = False
    b = backend(kube_cluster.kubeconfig, ns)
    p = b.probe(IDENT)

    def unschedulable():
        pod = api.read_namespaced_pod(p["name"], ns)
        conds = pod.status.conditions or []
        return pod if any(c.reason == "Unschedulable" for c in conds) else None

    pod = until(unschedulable, 30, "the probe was not marked Unschedulable")
    t0 = float(p["created_at"])
    assert b.probe_signal(p, time.time()) is None
    assert b.probe_signal(p, t0 + SETTLE_S - 1) is None
    late = b.probe_signal(p, t0 + SETTLE_S + 1)
    assert late is not None and (late.up, late.source) == (False, "probe"), late
    assert "no scale-up asked for" in late.detail, late
    made = event(
        api,
        ns,
        "Pod",
        p["name"],
        pod.metadata.uid,
        "TriggeredScaleUp",
        "pod triggered scale-up: [{eks-gpu-spot-2a 0->1 (max: 3)}]",
        type="Normal",
        component="cluster-autoscaler",
        obj={"namespace": ns, "apiVersion": "v1"},
    )
    try:
        assert b.probe_signal(p, t0 + SETTLE_S + 1) is None  # a node is coming
    finally:
        api.delete_namespaced_event(made, ns)
    b.drop_probe(p)


def test_a_worker_that_may_not_create_the_priority_class_is_told_once(
    kube_cluster, sa_kubeconfig
) -> None:
    """As the ServiceAccount of docker/rbac.yaml (no right to create PriorityClasses; an
    admin made it): one warning naming the permission, and each probe is still made; the
    second replaces the task's leftover first. An unknown pool is a ConfigError."""
    cfg, _ = sa_kubeconfig
    api = kube_cluster.api
    b = backend(cfg, NS)
    with warnings_of("airflow_spot.backends.kubernetes.cluster") as warned:
        first = b.probe(IDENT)
        second = b.probe(IDENT)
    hits = [w for w in warned if "priorityclasses" in w]
    assert len(hits) == 1 and "create priorityclasses (scheduling.k8s.io)" in hits[0], warned
    until(lambda: probes(api, NS) == {second["name"]}, 10, probes(api, NS))
    assert first["name"] != second["name"]
    with pytest.raises(ConfigError, match="backend.pools: no pool named 'mars'"):
        b.probe(IDENT, pool="mars")
    b.drop_probe(second)


# -- the operator -------------------------------------------------------------------------------
def _operator(cfg: str, ns: str, root: Path, command: list[str], **kw: Any):
    from airflow_spot.operators import SpotTrainingOperator

    return SpotTrainingOperator(
        task_id="train",
        command=command,
        checkpoint_uri=str(root / "ckpt"),
        expected_compute=timedelta(seconds=kw.pop("compute_s", 40)),
        total_steps=kw.pop("total_steps", 2000),
        deadline=timedelta(seconds=kw.pop("deadline_s", 300)),
        changeover=timedelta(seconds=1),
        policy="greedy",
        backend=backend(cfg, ns, gpus=0, spot_cooldown_s=0.5),
        decision_interval=timedelta(seconds=5),
        poll_interval=0.1,
        **kw,
    )


def test_exit_78_fails_the_task_at_once_with_a_config_error(kube_cluster, tmp_path: Path) -> None:
    """The training process stops with exit 78 (EX_CONFIG, a configuration error no relaunch
    can fix): the task fails at once with a ConfigError quoting its last log line, read
    through the real ``pods/log``; no second attempt is launched, failures left or not."""
    from airflow_spot.operators.spot_training import STATE_KEY
    from airflow_spot.testing import FileTaskStateStore, make_context

    script = (
        "import sys; print('resuming', flush=True); "
        "print('no AWS credentials for s3://bucket/ckpt', flush=True); sys.exit(78)"
    )
    op = _operator(
        kube_cluster.kubeconfig,
        kube_cluster.namespace,
        tmp_path,
        [sys.executable, "-c", script],
        deferrable=False,
        max_failures=3,
    )
    store = FileTaskStateStore(tmp_path / "state.json")
    with pytest.raises(ConfigError) as err:
        op.execute(make_context(store))
    msg = str(err.value)
    assert msg.startswith("command: the training process stopped on a configuration error"), msg
    assert "exit 78" in msg and "no AWS credentials for s3://bucket/ckpt" in msg, msg
    attempts = store.get(STATE_KEY)["attempts"]
    assert [(a["outcome"], a["exit_code"]) for a in attempts] == [("app_failure", 78)], attempts


class Adopted:
    """Try 1 launched attempt 1 (recorded); its spot node was drained; a worker launched
    attempt 2 and died before recording it; try 2 ran."""

    def __init__(self, cluster, root: Path) -> None:
        from airflow.sdk.exceptions import TaskDeferred

        from airflow_spot.jobstate import AttemptHandle
        from airflow_spot.operators.spot_training import STATE_KEY
        from airflow_spot.testing import FileTaskStateStore, make_context, train_command

        self.cluster, self.root = cluster, root
        self.api, self.ns = cluster.api, cluster.namespace
        self.cmd = train_command(2000, step_seconds=0.02)
        self.ckpt = str(root / "ckpt")
        self.ident = TaskIdentity("dag", "train", "run")
        self.store = FileTaskStateStore(root / "state.json")
        with pytest.raises(TaskDeferred):
            self.op().execute(make_context(self.store))
        st = self.store.get(STATE_KEY)
        self.b = b = self.op().backend
        h1 = AttemptHandle.from_dict(st["attempts"][0]["handle"])
        cluster.kubelet.reclaim(wait_running(b, h1), "drain")
        until(lambda: gone(self.api, self.ns, h1.pod), 30, "the drained pod stayed")
        self.h2 = b.launch(self.ident, 2, "spot", self.cmd, checkpoint_uri=self.ckpt)
        wait_running(b, self.h2)
        self.uid = self.api.read_namespaced_pod(self.h2.pod, self.ns).metadata.uid
        self.state = self.next_try(2)

    def op(self):
        kw = {"min_deferral": timedelta(0)}
        return _operator(self.cluster.kubeconfig, self.ns, self.root, self.cmd, **kw)

    def next_try(self, try_number: int) -> dict:
        from airflow.sdk.exceptions import TaskDeferred

        from airflow_spot.operators.spot_training import STATE_KEY
        from airflow_spot.testing import make_context

        with pytest.raises(TaskDeferred):
            self.op().execute(make_context(self.store, try_number=try_number))
        return self.store.get(STATE_KEY)

    def h2_untouched(self) -> bool:
        return self.api.read_namespaced_pod(self.h2.pod, self.ns).metadata.uid == self.uid


def test_an_attempt_pods_launch_time_is_found_to_the_microsecond(kube_cluster) -> None:
    """A try adopts only the unrecorded attempts launched since its job started, and a job
    launches its first attempt within its first second: the launch time it finds is the
    launch's own (an annotation), not the whole second of ``creationTimestamp`` (before
    which a first attempt whose worker died at once was never adopted)."""
    b = backend(kube_cluster.kubeconfig, kube_cluster.namespace)
    t0 = time.time()
    h = b.launch(IDENT, 1, "spot", SLEEP, checkpoint_uri="/c")
    t1 = time.time()
    found = b.find_attempts(IDENT)
    assert [f.pod for f in found] == [h.pod]
    launched = found[0].launched_at
    # the handle's launch is the pod's own stamp, to the bit: adoption sees what the launch saw
    assert t0 <= launched == h.launched_at <= t1, (t0, launched, h.launched_at, t1)
    assert launched % 1 != 0, launched  # not a whole second
    created = b.api.core.read_namespaced_pod(
        h.pod, kube_cluster.namespace
    ).metadata.creation_timestamp
    assert created.microsecond == 0  # what the API server stores: whole seconds
    b.cancel(h, wait_s=30)


def test_an_attempt_pod_no_try_recorded_is_adopted(kube_cluster, tmp_path: Path) -> None:
    """Try 2 closes attempt 1 (preempted), finds the pod of attempt 2, which no try recorded,
    by its labels, records it and re-attaches to it: the very pod, no new launch."""
    a = Adopted(kube_cluster, tmp_path)
    st = a.state
    assert [x["attempt"] for x in st["attempts"]] == [1, 2], st["attempts"]
    assert st["attempts"][0]["outcome"] == "preempted", st["attempts"][0]
    assert st["current"] == 1 and st["attempts"][1]["handle"]["pod"] == a.h2.pod
    assert a.h2_untouched()  # re-attached, not relaunched
    a.b.cancel(a.h2, wait_s=30)


def test_an_unrecorded_attempt_beside_a_training_one_is_stopped(
    kube_cluster, tmp_path: Path
) -> None:
    """After try 2 re-attached to attempt 2, another dying worker launched a held attempt 3
    beside it: try 3 records attempt 3 and stops it, since attempt 2 trains, and attempt 2
    trains on, still the current attempt (at most one attempt trains)."""
    a = Adopted(kube_cluster, tmp_path)
    h3 = a.b.launch(
        replace(a.ident, try_number=2), 3, "spot", a.cmd, checkpoint_uri=a.ckpt, hold=True
    )
    st = a.next_try(3)
    assert [x["attempt"] for x in st["attempts"]][:3] == [1, 2, 3], st["attempts"]
    assert st["attempts"][2]["outcome"] == "cancelled", st["attempts"][2]
    assert "recorded by the next try" in st["attempts"][2]["reason"]
    until(lambda: gone(a.api, a.ns, h3.pod), 30, "the unrecorded attempt 3 was not stopped")
    assert st["current"] == 1 and len(st["attempts"]) == 3, st["attempts"]
    assert a.h2_untouched()
