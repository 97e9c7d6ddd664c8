"""The Kubernetes backend: attempts as pods on spot or on-demand node pools.

Pods are created and read through the ``apache-airflow-providers-cncf-kubernetes``
``KubernetesHook`` (connection, kubeconfig or in-cluster config, as users already configure
it), every call behind one object (:class:`~.api.KubeApi`). What happened to a pod is judged
by the pure :func:`.verdict.judge` over the pod, its node and their events. While a pod runs,
its node name and capacity are recorded in the attempt's handle, so that a verdict is still
possible after the node is gone. A node that shows an interruption warning gets the pod's
notice annotation set, so the container checkpoints at once. At most one attempt pod exists
per task instance: a launch first removes any leftover pod of the task that is not the live
attempt. What the cluster shows of spot, and probes, are :mod:`.seeing`'s. With ``nodes`` N >
1 each attempt is a gang of N ranks, launched and judged as one (:mod:`.gang`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_spot.backends.base import AttemptStatus, Outcome, State, TaskIdentity, look
from airflow_spot.backends.kubernetes.connection import reaching_server
from airflow_spot.backends.kubernetes.fields import (
    KubePool,
    check_backend_fields,
    settings_from,
    stored_settings,
)
from airflow_spot.backends.kubernetes.gang import check_gang_fields, for_gangs
from airflow_spot.backends.kubernetes.placement import Placement, placement_for
from airflow_spot.backends.kubernetes.podread import (
    failed_init,
    found_attempt,
    launched_attempt,
    same_object,
)
from airflow_spot.backends.kubernetes.probe import PROBE_IMAGE, is_probe
from airflow_spot.backends.kubernetes.seeing import SeesSpotOnCluster
from airflow_spot.backends.kubernetes.verdict import (
    GIVE_UP,
    OUTCOMES,
    RELAY_NOTICE,
    identities,
    judge,
)
from airflow_spot.backends.kubernetes.vocabulary import (
    HOLD_ANNOTATION,
    LAUNCHED_ANNOTATION,
    LEASE_ANNOTATION,
    NOTICE_ANNOTATION,
    RELEASED_ANNOTATION,
)
from airflow_spot.exceptions import BackendError, ConfigError
from airflow_spot.jobstate import AttemptHandle

if TYPE_CHECKING:  # both import the Kubernetes client: imported when first used
    from airflow_spot.backends.kubernetes.api import KubeApi
    from airflow_spot.backends.kubernetes.cluster import ClusterView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubernetesBackend(SeesSpotOnCluster):
    """Run attempts as pods.

    :param image: the training image.
    :param namespace: where pods go.
    :param preset: ``"eks"``, ``"karpenter"``, ``"gke"``, ``"aks"``, or a custom
        ``{"spot": Placement(...), "on_demand": Placement(...)}``.
    :param kubernetes_conn_id: an Airflow Kubernetes connection (else ``config_file`` / in-cluster).
    :param config_file: a kubeconfig path.
    :param in_cluster: use the in-cluster service account.
    :param gpus: ``nvidia.com/gpu`` limit of the training container.
    :param resources: ``{"limits": {...}, "requests": {...}}``.
    :param env: extra environment of the container.
    :param env_from_secrets: Secret names exposed as environment.
    :param service_account: the pod's service account.
    :param mount_service_account_token: mount its token (off by default).
    :param pod_template: a pod (API JSON dict, or the path of a YAML/JSON file on the worker)
        the attempt pod is built on: its resources, node selector, tolerations and security
        context are kept and merged with ours (ours win on the same key).
    :param allow_privileged: let the pod template ask for its node (privileged, root,
        escalation, added capabilities, hostPath, host ports or namespaces); refused by default.
    :param delete_pods: ``"always"`` (default), ``"on_success"`` or ``"never"``: what to do with
        an attempt's pod once it ended.
    :param pending_timeout_s: a spot pod unschedulable this long means spot is unavailable.
    :param spot_cooldown_s: after a preemption or unavailable spot, how long spot counts as down.
    :param grace_period_s: termination grace when a pod is cancelled.
    :param pools: several spot node pools; each spot launch goes to the cheapest one not cooling
        down after a preemption or unschedulable spot (``spot_cooldown_s``). On-demand pods use
        the preset.
    :param nodes: ranks per attempt: above 1, each attempt is a gang (:mod:`.gang`).
    :param gang_timeout_s: a gang not on all its nodes this long is deleted (spot unavailable).
    :param gang_settle_s: how long a rank's failure waits for a reclaim that would explain it.
    :param capacity_check: how a spot gang's N nodes are asked for before its gates lift:
        ``"placeholders"`` (N placeholder pods), ``"atomic-scale-up"`` (a
        best-effort-atomic-scale-up ProvisioningRequest: cluster-autoscaler scales up all N at
        once) or ``"provisioning-request"`` (a check-capacity ProvisioningRequest: it sees only
        nodes already in the cluster and never scales up, so on spot nodes that scale from
        zero the gang always falls back to on-demand).
    """

    image: str
    namespace: str = "default"
    preset: str | dict[str, Placement] = "karpenter"
    kubernetes_conn_id: str | None = None
    config_file: str | None = None
    in_cluster: bool | None = None
    gpus: int = 0
    resources: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    env_from_secrets: tuple[str, ...] = ()
    service_account: str | None = None
    mount_service_account_token: bool = False
    pod_template: dict[str, Any] | str | None = None
    allow_privileged: bool = False
    delete_pods: str = "always"
    pending_timeout_s: float = 600.0
    spot_cooldown_s: float = 900.0
    grace_period_s: int = 30
    pools: tuple[KubePool, ...] = ()
    nodes: int = 1
    gang_timeout_s: float = 600.0
    gang_settle_s: float = 60.0
    capacity_check: str = "placeholders"

    kind = "kubernetes"
    runs_on_worker = False
    time_scale = 1.0
    # a pod's grace is its node's, and pods report no save times
    notice_to_kill_s: ClassVar[float | None] = None
    # the probe's container (a pause image; set it on a subclass to use a mirror)
    probe_image: ClassVar[str] = PROBE_IMAGE

    @property
    def node_pools(self) -> tuple[KubePool, ...]:
        return self.pools

    def __post_init__(self) -> None:
        check_backend_fields(self)
        check_gang_fields(self)
        if isinstance(self.pod_template, Path):  # kept as text: the backend is stored as JSON
            object.__setattr__(self, "pod_template", str(self.pod_template))

    def placement(self, capacity: str, pool: str) -> Placement:
        """Where a pod on ``capacity`` goes (``pool``: a spot pool's name, "" for the preset's)."""
        if capacity == "spot" and pool:
            for p in self.pools:
                if p.name == pool:
                    return p.placement
            raise ConfigError("backend.pools", f"no pool named {pool!r}")
        return placement_for(self.preset, capacity)

    # -- configuration ----------------------------------------------------------------------
    def market_spec(self, epoch: float) -> None:  # noqa: ARG002 - the real market is not replayed
        return None

    def to_dict(self) -> dict[str, Any]:
        return stored_settings(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KubernetesBackend:
        return cls(**settings_from(d))

    @cached_property
    def api(self) -> KubeApi:
        """The API calls, through this backend's connection (built on first use)."""
        from airflow_spot.backends.kubernetes.api import KubeApi

        return KubeApi.connect(self)

    # -- attempts ---------------------------------------------------------------------------
    @reaching_server
    @for_gangs
    def launch(
        self,
        ident: TaskIdentity,
        attempt: int,
        capacity: str,
        command: list[str],
        *,
        checkpoint_uri: str,
        changeover_wall_s: float = 0.0,
        market: Any = None,
        env: dict[str, str] | None = None,
        pool: str = "",  # noqa: ARG002
        hold: bool = False,
        lease_until: float | None = None,
    ) -> AttemptHandle:
        """Create the attempt's pod (after removing any leftover pod of this task, a probe's
        included; held, the running pods of other attempts are kept). ``hold``: a make-before-break return: once the pod is bound and its
        container started, :meth:`status` reports ``ready_at`` and the container waits
        (``TrainingSession``, on the pod's ``airflow-spot/hold`` annotation) until
        :meth:`release_hold`."""
        from airflow_spot.backends.kubernetes.pods import attempt_pod, pod_name, task_labels

        task = ident
        name = pod_name(task, attempt)
        # built first: a template that is not a pod fails before anything is deleted
        pod = attempt_pod(
            self,
            name=name,
            labels=task_labels(task),
            try_number=task.try_number,
            attempt=attempt,
            capacity=capacity,
            command=command,
            checkpoint_uri=checkpoint_uri,
            env=env,
            pool=pool,
            hold=hold,
        )
        self._remove_leftovers(task, name, attempt, hold)
        # the launch time to the microsecond (creationTimestamp has whole seconds): a try that
        # adopts an unrecorded attempt tells this job's from an earlier one's by it
        stamp = repr(time.time())
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), LAUNCHED_ANNOTATION: stamp}
        if lease_until is not None:  # the container reads it through the downward API
            pod.metadata.annotations[LEASE_ANNOTATION] = repr(lease_until)
        self.api.create_pod(pod, name, stamp)
        # the handle's launch is the pod's own stamp (adoption reads the same, to the bit)
        return launched_attempt(name, self.namespace, attempt, capacity, float(stamp))

    def _remove_leftovers(self, task: TaskIdentity, name: str, attempt: int, hold: bool) -> None:
        """Delete the task's pods a launch of ``name`` must not meet (see :meth:`launch`)."""
        for old in self.api.pods(_selector(task)):
            ended = old.status is not None and old.status.phase in ("Succeeded", "Failed")
            if ended and old.metadata.name != name and self.delete_pods != "always":
                continue  # an ended pod kept for inspection (delete_pods) trains nothing
            if hold and not ended and old.metadata.name != name and not is_probe(old):
                continue  # make-before-break: the attempt it replaces trains on until then
            log.warning(
                "Deleting leftover pod %s of this task before attempt %d: at most one attempt pod at a time.",
                old.metadata.name,
                attempt,
            )
            self.api.delete_pod(old.metadata.name, grace=0)
            if old.metadata.name == name:  # its name is the new pod's: wait until it is gone
                self.api.wait_gone(name, 30.0)

    @reaching_server
    @for_gangs
    def find_attempts(self, ident: TaskIdentity) -> list[AttemptHandle]:
        """Every attempt pod of this task instance (probes excluded), by attempt number: the
        next try adopts those no record holds."""
        out = [
            found_attempt(p, self.namespace)
            for p in self.api.pods(_selector(ident))
            if not is_probe(p)
        ]
        return sorted((h for h in out if h is not None), key=lambda h: h.attempt or 0)

    @reaching_server
    @for_gangs
    def renew_lease(self, handle: AttemptHandle, until: float) -> None:
        """Move the pod's lease annotation to wall time ``until`` (the container, through the
        downward API, checkpoints and stops once it is past). A pod gone is left to
        :meth:`status`."""
        name = _pod(handle)
        self.api.annotate(
            name, {LEASE_ANNOTATION: repr(until)}, f"renewing the lease of pod {name}"
        )

    @reaching_server
    @for_gangs
    def release_hold(self, handle: AttemptHandle) -> None:
        """Let a held pod (``launch(hold=True)``) train: the attempt it replaces has
        checkpointed and stopped. Its annotation turns ``go`` (the container sees it through
        the downward API) and the release time is recorded on it. A pod gone meanwhile is
        left to :meth:`status` (its verdict)."""
        name = _pod(handle)
        released = {HOLD_ANNOTATION: "go", RELEASED_ANNOTATION: repr(time.time())}
        if not self.api.annotate(name, released, f"releasing pod {name}"):
            log.warning("Pod %s is gone before its hold was released.", name)

    @reaching_server
    @for_gangs
    def status(self, handle: AttemptHandle) -> AttemptStatus:
        """Read pod, node and events and judge them (:func:`.verdict.judge`). Records what it
        saw in ``handle`` (the pod's node, capacity and notice, kept for a verdict after the
        node is gone); changes nothing in the cluster: what is due there is in ``due``, for
        :meth:`carry_out`."""
        pod = self.api.read_pod(_pod(handle))
        node_name = (pod.spec.node_name if pod is not None and pod.spec else None) or handle.node
        node = self.api.read_node(node_name) if node_name else None
        _record(handle, identities(handle, pod, node))  # first: they tell the events apart
        events = self._events(handle, node_name)
        seen = judge(
            handle, pod, node, events, time.time(), pending_timeout_s=self.pending_timeout_s
        )
        _record(handle, seen.record)
        if seen.default_used:
            log.warning(
                "Pod %s: no known signal (%s); treating it as an infrastructure disruption.",
                _pod(handle),
                seen.status.reason,
            )
        return seen.status

    def _events(self, handle: AttemptHandle, node_name: str | None) -> list[Any]:
        """Events of this pod and its node. Names are reused (a cleared task's attempt 1, a
        recreated GKE VM), and events outlive their object by an hour: an event of another
        object with the same name (other uid, or from before this one existed) is left out."""
        out = [
            e
            for e in self.api.pod_events(_pod(handle))
            if same_object(e, handle.pod_uid, handle.launched_at)
        ]
        if node_name:
            out += [
                e
                for e in self.api.node_events(node_name)
                if same_object(e, handle.node_uid, handle.node_created, alias=node_name)
            ]
        return out

    @reaching_server
    @for_gangs
    def carry_out(self, handle: AttemptHandle, status: AttemptStatus) -> None:
        """Do what ``status`` found due: relay the node's reclaim notice to the pod (so the
        container checkpoints now), or delete a pod that will never run (its verdict is kept
        in the handle: the 404 that follows is ours, not a reclaim)."""
        if RELAY_NOTICE in status.due and not handle.notice_sent:
            self._relay_notice(_pod(handle), str(handle.notice))
            handle.notice_sent = True
        if GIVE_UP in status.due and not handle.gave_up:
            log.warning("Pod %s: %s; deleting it.", _pod(handle), status.reason)
            outcome = status.outcome.value if status.outcome else ""
            verdict = next(v for v, o in OUTCOMES.items() if o.value == outcome)
            handle.gave_up = [verdict.value, status.reason, status.evidence["signals"]]
            self.api.delete_pod(_pod(handle), grace=0)

    def _relay_notice(self, pod_name: str, notice: str) -> None:
        log.warning(
            "Node of pod %s shows an interruption warning (%s): setting %s so the container checkpoints now.",
            pod_name,
            notice,
            NOTICE_ANNOTATION,
        )
        doing = f"relaying the interruption notice to pod {pod_name}"
        if not self.api.annotate(pod_name, {NOTICE_ANNOTATION: notice}, doing, explain=True):
            # evicted or deleted since the look: its verdict comes next
            log.warning("Pod %s is gone before the notice reached it.", pod_name)

    def progress(self, handle: AttemptHandle) -> dict[str, Any] | None:  # noqa: ARG002
        return None  # measured from checkpoints by the controller

    @reaching_server
    @for_gangs
    def cancel(self, handle: AttemptHandle, wait_s: float = 60.0) -> AttemptStatus:
        """Delete the pod and wait until it is gone (even if its status cannot be read). A pod
        that already ended is left for the caller's :meth:`release` (after its log is read)."""
        try:
            st: AttemptStatus | None = look(self, handle)
        except Exception as e:  # noqa: BLE001 - a pod we cannot read must still go
            log.warning("Pod %s: cannot read its status (%s); deleting it anyway.", _pod(handle), e)
            st = None
        if st is not None and st.terminal:
            return st  # ended on its own: the caller reads its log, then cleans up
        self.api.delete_pod(_pod(handle), grace=self.grace_period_s)
        self.api.wait_gone(_pod(handle), wait_s)
        return AttemptStatus(
            State.ENDED,
            handle.capacity or "",
            int(handle.attempt or 0),
            float(handle.launched_at or 0),
            started_at=st.started_at if st else None,
            granted_at=st.granted_at if st else None,
            ended_at=time.time(),
            outcome=Outcome.CANCELLED,
            reason="pod deleted by the controller",
        )

    @for_gangs
    def log_tail(self, handle: AttemptHandle, lines: int = 15) -> str:
        try:
            return self.api.pod_log(_pod(handle), self._failed_container(_pod(handle)), lines)
        except Exception as e:  # noqa: BLE001 - logs are best effort (the pod may be gone)
            return f"(no log: {type(e).__name__})"

    def _failed_container(self, pod_name: str) -> str:
        """The init container that failed, if one did (``train`` never started then)."""
        failed = failed_init(self.api.read_pod(pod_name))
        return failed.name if failed is not None else "train"

    @reaching_server
    @for_gangs
    def release(self, handle: AttemptHandle, outcome: str) -> None:
        """Delete an ended attempt's pod per ``delete_pods``."""
        if self.delete_pods == "always" or (
            self.delete_pods == "on_success" and outcome == Outcome.SUCCEEDED.value
        ):
            self.api.delete_pod(_pod(handle), grace=0)

    # -- seeing spot the way the cluster shows it ------------------------------------------
    @cached_property
    def cluster(self) -> ClusterView:
        """One per backend object: it remembers the sources a 403 closed."""
        from airflow_spot.backends.kubernetes.cluster import ClusterView

        return ClusterView(self.api)


def _pod(handle: AttemptHandle) -> str:
    """The pod of a Kubernetes attempt's handle."""
    if handle.pod is None:
        raise BackendError(f"not a Kubernetes attempt's handle: {handle.to_dict()}")
    return handle.pod


def _record(handle: AttemptHandle, fields: dict[str, Any]) -> None:
    """Write what a look saw into the handle (the operator stores it, a watcher carries it)."""
    for name, value in fields.items():
        setattr(handle, name, value)


def _selector(task: TaskIdentity) -> str:
    """The label selector of the task's pods (its attempts and probes)."""
    from airflow_spot.backends.kubernetes.pods import label_selector, task_labels

    return label_selector(task_labels(task))
