"""The Kubernetes backend: attempts as pods on spot or on-demand node pools.

Pods are created and read through the ``apache-airflow-providers-cncf-kubernetes``
``KubernetesHook`` (connection, kubeconfig or in-cluster config, as users already configure
it). What happened to a pod is decided by the pure :func:`.classify.classify` over the pod, its
node and their events. While a pod runs, its node name and capacity are recorded in the
attempt's handle, so that a verdict is still possible after the node is gone. A node that
shows an interruption warning gets the pod's notice annotation set, so the container
checkpoints at once. At most one attempt pod exists per task instance: a launch first removes
any leftover pod of the task that is not the live attempt.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from airflow_spot.backends.base import (
    AttemptStatus,
    Outcome,
    State,
    look,
)
from airflow_spot.backends.kubernetes.classify import (
    Classification,
    Verdict,
    classify,
    container_start_error,
    interruption_notice,
    is_cloud_notice,
    node_is_spot,
)
from airflow_spot.backends.kubernetes.cluster import ClusterView
from airflow_spot.backends.kubernetes.connection import reaching_server, settings_error
from airflow_spot.backends.kubernetes.fields import KubePool, check_backend_fields
from airflow_spot.backends.kubernetes.placement import Placement, placement_for
from airflow_spot.backends.kubernetes.podread import (
    LAUNCHED_ANNOTATION,
    RELEASED_ANNOTATION,
    api_message,
    event_kind,
    failed_init,
    hold_state,
    pod_exit_code,
    pod_launched_at,
    pod_times,
    same_object,
    wall_time,
)
from airflow_spot.backends.kubernetes.probe import PROBE_IMAGE
from airflow_spot.backends.kubernetes.retry import created_by_us
from airflow_spot.backends.kubernetes.retry import install as install_retries
from airflow_spot.backends.kubernetes.template import load_pod_template
from airflow_spot.backends.signals import SpotSignal
from airflow_spot.checkpoint.training import (
    HOLD_ANNOTATION,
    LEASE_ANNOTATION,
    NOTICE_ANNOTATION,
)
from airflow_spot.exceptions import BackendError, ConfigError
from airflow_spot.jobstate import AttemptHandle

log = logging.getLogger(__name__)
RBAC_HINT = (
    " (the worker's service account needs get on nodes and list on events in all namespaces:"
    " the verdict reads the node's labels, taints and events; see docker/rbac.yaml)"
)
RELAY_NOTICE = "relay_notice"  # what a status may find due (see carry_out)
GIVE_UP = "give_up"
OUTCOMES = {
    Verdict.SUCCEEDED: Outcome.SUCCEEDED,
    Verdict.PREEMPTED: Outcome.PREEMPTED,
    Verdict.SPOT_UNAVAILABLE: Outcome.SPOT_UNAVAILABLE,
    Verdict.INFRA_DISRUPTION: Outcome.INFRA_DISRUPTION,
    Verdict.OOM_KILLED: Outcome.OOM_KILLED,
    Verdict.APP_FAILURE: Outcome.APP_FAILURE,
}


@dataclass(frozen=True)
class KubernetesBackend:
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
    :param delete_pods: ``"always"`` (default), ``"on_success"`` or ``"never"``: what to do with
        an attempt's pod once it ended.
    :param pending_timeout_s: a spot pod unschedulable this long means spot is unavailable.
    :param spot_cooldown_s: after a preemption or unavailable spot, how long spot counts as down.
    :param grace_period_s: termination grace when a pod is cancelled.
    :param pools: several spot node pools; each spot launch goes to the cheapest one not cooling
        down after a preemption or unschedulable spot (``spot_cooldown_s``). On-demand pods use
        the preset.
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
    delete_pods: str = "always"
    pending_timeout_s: float = 600.0
    spot_cooldown_s: float = 900.0
    grace_period_s: int = 30
    pools: tuple[KubePool, ...] = ()

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
        if isinstance(self.pod_template, Path):  # kept as text: the backend is stored as JSON
            object.__setattr__(self, "pod_template", str(self.pod_template))

    def _placement(self, capacity: str, pool: str) -> Placement:
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
        d = asdict(self)
        if isinstance(self.preset, dict):
            d["preset"] = {k: asdict(v) for k, v in self.preset.items()}
        d["pools"] = [{**asdict(p), "placement": asdict(p.placement)} for p in self.pools]
        d["kind"] = "kubernetes"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KubernetesBackend:
        d = {k: v for k, v in d.items() if k != "kind"}
        if isinstance(d.get("preset"), dict):
            d["preset"] = {
                k: Placement(v["node_selector"], tuple(v["tolerations"]), v["affinity"])
                for k, v in d["preset"].items()
            }
        d["env_from_secrets"] = tuple(d.get("env_from_secrets") or ())
        d["pools"] = tuple(
            KubePool(
                p["name"], _placement_from(p["placement"]), p.get("spot_price"), p.get("price_from")
            )
            for p in d.get("pools") or ()
        )
        return cls(**d)

    @cached_property
    def api(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        hook = KubernetesHook(
            conn_id=self.kubernetes_conn_id,
            config_file=self.config_file,
            in_cluster=self.in_cluster,
        )
        try:
            client = hook.core_v1_client
        except Exception as e:
            error = settings_error(self, e)  # the setting named, not the client's traceback
            if error is None:
                raise
            raise error from e
        install_retries(client.api_client)  # transient API failures, retried (retry.py)
        return client

    # -- attempts ---------------------------------------------------------------------------
    @reaching_server
    def launch(
        self,
        ident: dict[str, Any],
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
        from airflow_spot.backends.kubernetes.pods import pod_name, task_labels

        labels = task_labels(
            ident["dag_id"], ident["task_id"], ident["run_id"], int(ident.get("map_index", -1))
        )
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        name = pod_name(
            ident["dag_id"],
            ident["task_id"],
            attempt,
            ident["run_id"],
            int(ident.get("map_index", -1)),
        )
        # built first: a template that is not a pod fails before anything is deleted
        pod = self._build_pod(
            name=name,
            labels=labels,
            ident=ident,
            attempt=attempt,
            capacity=capacity,
            command=command,
            checkpoint_uri=checkpoint_uri,
            env=env,
            pool=pool,
            hold=hold,
        )
        for old in self.api.list_namespaced_pod(self.namespace, label_selector=selector).items:
            ended = old.status is not None and old.status.phase in ("Succeeded", "Failed")
            if ended and old.metadata.name != name and self.delete_pods != "always":
                continue  # an ended pod kept for inspection (delete_pods) trains nothing
            if hold and not ended and old.metadata.name != name and not _is_probe(old):
                continue  # make-before-break: the attempt it replaces trains on until then
            log.warning(
                "Deleting leftover pod %s of this task before attempt %d: at most one attempt pod at a time.",
                old.metadata.name,
                attempt,
            )
            self._delete(old.metadata.name, grace=0)
            if old.metadata.name == name:  # its name is the new pod's: wait until it is gone
                self._wait_gone(name, 30.0)
        from kubernetes.client.exceptions import ApiException

        # the launch time to the microsecond (creationTimestamp has whole seconds): a try that
        # adopts an unrecorded attempt tells this job's from an earlier one's by it
        stamp = repr(time.time())
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), LAUNCHED_ANNOTATION: stamp}
        if lease_until is not None:  # the container reads it through the downward API
            pod.metadata.annotations[LEASE_ANNOTATION] = repr(lease_until)
        try:
            self.api.create_namespaced_pod(self.namespace, pod)
        except ApiException as e:
            if e.status == 409 and created_by_us(
                self._read_pod(name), name, LAUNCHED_ANNOTATION, stamp
            ):
                log.info("Pod %s was created; its answer was lost and the retry met it.", name)
            else:
                raise BackendError(
                    f"could not create pod {name}: {e.status} {e.reason}{api_message(e)}"
                ) from e
        now = time.time()
        return AttemptHandle(
            launched_at=now,
            kind="kubernetes",
            attempt=attempt,
            capacity=capacity,
            namespace=self.namespace,
            pod=name,
            # an on-demand pod that cannot schedule is not "spot unavailable"
            was_spot=capacity == "spot",
            was_running=False,
            notice_sent=False,
            pending_since=now,
        )

    @reaching_server
    def find_attempts(self, ident: dict[str, Any]) -> list[AttemptHandle]:
        """Every attempt pod of this task instance (probes excluded), by attempt number: the
        next try adopts those no record holds."""
        from airflow_spot.backends.kubernetes.pods import task_labels

        labels = task_labels(
            ident["dag_id"], ident["task_id"], ident["run_id"], int(ident.get("map_index", -1))
        )
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        out = []
        for p in self.api.list_namespaced_pod(self.namespace, label_selector=selector).items:
            lab = p.metadata.labels or {}
            if _is_probe(p) or not str(lab.get("airflow-spot/attempt", "")).isdigit():
                continue
            created = pod_launched_at(p)
            cap = lab.get("airflow-spot/capacity", "")
            out.append(
                AttemptHandle(
                    launched_at=created,
                    kind="kubernetes",
                    attempt=int(lab["airflow-spot/attempt"]),
                    capacity=cap,
                    namespace=self.namespace,
                    pod=p.metadata.name,
                    was_spot=cap == "spot",
                    was_running=False,
                    notice_sent=False,
                    pending_since=created,
                )
            )
        return sorted(out, key=lambda h: h.attempt or 0)

    @reaching_server
    def renew_lease(self, handle: AttemptHandle, until: float) -> None:
        """Move the pod's lease annotation to wall time ``until`` (the container, through the
        downward API, checkpoints and stops once it is past). A pod gone is left to
        :meth:`status`."""
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"annotations": {LEASE_ANNOTATION: repr(until)}}}
        try:
            self.api.patch_namespaced_pod(_pod(handle), self.namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise BackendError(
                    f"renewing the lease of pod {_pod(handle)}: {e.status} {e.reason}"
                ) from e

    @reaching_server
    def release_hold(self, handle: AttemptHandle) -> None:
        """Let a held pod (``launch(hold=True)``) train: the attempt it replaces has
        checkpointed and stopped. Its annotation turns ``go`` (the container sees it through
        the downward API) and the release time is recorded on it. A pod gone meanwhile is
        left to :meth:`status` (its verdict)."""
        from kubernetes.client.exceptions import ApiException

        name = _pod(handle)
        body = {
            "metadata": {
                "annotations": {HOLD_ANNOTATION: "go", RELEASED_ANNOTATION: repr(time.time())}
            }
        }
        try:
            self.api.patch_namespaced_pod(name, self.namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise BackendError(f"releasing pod {name}: {e.status} {e.reason}") from e
            log.warning("Pod %s is gone before its hold was released.", name)

    @reaching_server
    def status(self, handle: AttemptHandle) -> AttemptStatus:
        """Read pod, node and events and classify. Records what it saw in ``handle`` (the
        pod's node, capacity and notice, kept for a verdict after the node is gone); changes
        nothing in the cluster: what is due there is in ``due``, for :meth:`carry_out`."""
        pod = self._read_pod(_pod(handle))
        node_name = (pod.spec.node_name if pod is not None and pod.spec else None) or handle.node
        node = self._read_node(node_name) if node_name else None
        if pod is not None and pod.metadata is not None and pod.metadata.uid:
            handle.pod_uid = pod.metadata.uid
        if node is not None and node.metadata is not None and handle.node_uid is None:
            handle.node_uid = node.metadata.uid  # the node the pod ran on, not a namesake
            handle.node_created = wall_time(node.metadata.creation_timestamp)
        events = self._events(handle, node_name)
        if pod is not None and node is not None:
            handle.node = node_name
            spot = node_is_spot(node)
            if spot is not None:
                handle.was_spot = spot
        phase = pod.status.phase if pod is not None and pod.status else None
        if phase == "Running":
            handle.was_running = True
        if phase != "Pending":
            handle.pending_since = None
        notice = (
            interruption_notice(node, [e for e in events if event_kind(e) != "Pod"])
            if node is not None
            else None
        )
        if notice:
            # kept: the node (and its taints) may be gone at the verdict. The first one stays,
            # unless a later look shows the cloud's own word where the first was not (a drain's
            # karpenter.sh/disrupted taint alone reads as a consolidation at the verdict)
            if handle.notice is None or (
                is_cloud_notice(notice) and not is_cloud_notice(handle.notice)
            ):
                handle.notice = notice
            if handle.notice_at is None:
                handle.notice_at = time.time()
        due: list[str] = []
        if notice and pod is not None and phase == "Running" and not handle.notice_sent:
            due.append(RELAY_NOTICE)
        pending_for = time.time() - handle.pending_since if handle.pending_since else 0.0
        if phase == "Pending" and container_start_error(pod):
            if handle.start_error_since is None:
                handle.start_error_since = time.time()
        else:
            handle.start_error_since = None
        start_error_for = (
            time.time() - handle.start_error_since if handle.start_error_since is not None else 0.0
        )
        granted, started, finished = pod_times(pod)
        notice_age = (finished or time.time()) - handle.notice_at if handle.notice_at else None
        gave_up = handle.gave_up  # we deleted it: the 404 now is ours, not a reclaim
        verdict = (
            Classification(Verdict(gave_up[0]), gave_up[1], tuple(gave_up[2]))
            if pod is None and gave_up
            else classify(
                pod,
                node,
                events,
                was_spot=handle.was_spot,
                was_running=bool(handle.was_running),
                pending_for_s=pending_for,
                pending_timeout_s=self.pending_timeout_s,
                notice=handle.notice,
                notice_age_s=notice_age,
                start_error_for_s=start_error_for,
            )
        )
        if verdict.terminal and phase == "Pending":
            # it never ran but still holds (or waits for) a node: with delete_pods="never" it
            # would start later and train beside the next attempt
            due.append(GIVE_UP)
        if verdict.default_used:
            log.warning(
                "Pod %s: no known signal (%s); treating it as an infrastructure disruption.",
                _pod(handle),
                verdict.reason,
            )
        held, started = hold_state(pod, started)
        base: dict[str, Any] = dict(
            capacity=handle.capacity or "",
            attempt=int(handle.attempt or 0),
            launched_at=float(handle.launched_at or 0),
            granted_at=granted,
            started_at=None if held else started,
            # ready to take over: held, its container started, no reclaim notice on its node
            ready_at=started if held and not handle.notice else None,
            heartbeat=time.time(),
            due=tuple(due),
            evidence={
                "node": handle.node,
                "spot_node": handle.was_spot,
                "signals": list(verdict.evidence),
                "notice": handle.notice,
            },
        )
        if verdict.verdict is Verdict.RUNNING:
            running = State.LAUNCHING if held else State.RUNNING  # held: its changeover
            return AttemptStatus(State.PREEMPTING if handle.notice_sent or due else running, **base)
        if verdict.verdict is Verdict.PENDING:
            return AttemptStatus(
                State.WAITING if handle.capacity == "spot" else State.LAUNCHING, **base
            )
        exit_code = pod_exit_code(pod)
        return AttemptStatus(
            State.ENDED,
            ended_at=finished or time.time(),
            outcome=OUTCOMES[verdict.verdict],
            reason=verdict.reason,
            exit_code=exit_code,
            **base,
        )

    @reaching_server
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
            self._delete(_pod(handle), grace=0)

    def progress(self, handle: AttemptHandle) -> dict[str, Any] | None:  # noqa: ARG002
        return None  # measured from checkpoints by the controller

    @reaching_server
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
        self._delete(_pod(handle), grace=self.grace_period_s)
        self._wait_gone(_pod(handle), wait_s)
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

    def log_tail(self, handle: AttemptHandle, lines: int = 15) -> str:
        try:
            # raw bytes: kubernetes-client 36 returns str(b'...') when it decodes the log itself
            resp = self.api.read_namespaced_pod_log(
                _pod(handle),
                self.namespace,
                container=self._failed_container(_pod(handle)),
                tail_lines=lines,
                _preload_content=False,
            )
            return resp.data.decode("utf-8", errors="replace")
        except Exception as e:  # noqa: BLE001 - logs are best effort (the pod may be gone)
            return f"(no log: {type(e).__name__})"

    def _failed_container(self, pod_name: str) -> str:
        """The init container that failed, if one did (``train`` never started then)."""
        failed = failed_init(self._read_pod(pod_name))
        return failed.name if failed is not None else "train"

    @reaching_server
    def release(self, handle: AttemptHandle, outcome: str) -> None:
        """Delete an ended attempt's pod per ``delete_pods``."""
        if self.delete_pods == "always" or (
            self.delete_pods == "on_success" and outcome == Outcome.SUCCEEDED.value
        ):
            self._delete(_pod(handle), grace=0)

    def _build_pod(
        self,
        *,
        name: str,
        labels: dict[str, str],
        ident: dict[str, Any],
        attempt: int,
        capacity: str,
        command: list[str],
        checkpoint_uri: str,
        env: dict[str, str] | None = None,
        pool: str = "",
        hold: bool = False,
    ) -> Any:
        """The attempt pod (a ``V1Pod``) as :meth:`launch` creates it, on the pod template."""
        from airflow_spot.backends.kubernetes.pods import build_pod

        template = load_pod_template(self.pod_template)
        try:
            return build_pod(
                name=name,
                namespace=self.namespace,
                image=self.image,
                command=command,
                capacity=capacity,
                attempt=attempt,
                try_number=int(ident.get("try_number", 1)),
                labels=labels,
                placement=self._placement(capacity, pool),
                checkpoint_uri=checkpoint_uri,
                env={**self.env, **(env or {})},
                resources=self.resources,
                gpus=self.gpus,
                service_account=self.service_account,
                mount_token=self.mount_service_account_token,
                env_from_secrets=list(self.env_from_secrets),
                pod_template=template,
                hold=hold,
            )
        except (ValueError, TypeError) as e:
            if template is None:
                raise
            # the provider's reconcile on a template the parse-time check let through
            raise ConfigError(
                "backend.pod_template", f"cannot build the attempt pod on it: {e}"
            ) from e

    # -- seeing spot the way the cluster shows it ------------------------------------------
    @cached_property
    def _cluster(self) -> ClusterView:
        """One per backend object: it remembers the sources a 403 closed."""
        return ClusterView(self.api, self.namespace)

    def _spot_placements(self, pool: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(pool, the spot pod a launch would create there, as API JSON) for each spot pool
        (``""``: the preset's spot placement when there are no pools)."""
        names = [p.name for p in self.pools] or [""]
        out = []
        for name in names if pool is None else [pool]:
            pod = self._build_pod(
                name="spot-placement",
                labels={},
                ident={},
                attempt=0,
                capacity="spot",
                command=["/pause"],
                checkpoint_uri="",
                pool=name,
            )
            out.append((name, self.api.api_client.sanitize_for_serialization(pod)))
        return out

    def spot_signals(self, now: float) -> list[SpotSignal]:
        """What the cluster shows about spot now, launching nothing: Karpenter ICE events of
        the last 3 min and autoscaler backoffs (down), Ready spot nodes of a pool with the
        job's GPUs free (up). A quiet cluster shows nothing (unknown, not up). A source the
        worker may not read (403) is warned about once and left out from then on."""
        return self._cluster.signals(self._spot_placements(), now)

    @reaching_server
    def probe(self, ident: dict[str, Any], pool: str = "") -> dict[str, Any]:
        """Start a probe pod for spot in ``pool`` (after deleting this task's leftover probe of
        that pool); returns its handle ``{namespace, name, pool, created_at}`` (JSON-able)."""
        from kubernetes.client.exceptions import ApiException

        from airflow_spot.backends.kubernetes.pods import pod_name, task_labels
        from airflow_spot.backends.kubernetes.probe import POOL_LABEL, build_probe

        self._placement("spot", pool)  # an unknown pool is a ConfigError now
        mi = int(ident.get("map_index", -1))
        labels = task_labels(ident["dag_id"], ident["task_id"], ident["run_id"], mi)
        view = self._cluster
        view.ensure_priority_class()
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        view.drop_probes(f"{selector},{POOL_LABEL}={pool}")
        created = time.time()
        stem = pod_name(ident["dag_id"], ident["task_id"], 0, ident["run_id"], mi)[: -len("-a0")]
        suffix = hashlib.sha1(f"{pool}/{created}".encode()).hexdigest()[:6]
        name = f"{stem}-probe-{suffix}"
        training = self._build_pod(
            name=name,
            labels=labels,
            ident=ident,
            attempt=0,
            capacity="spot",
            command=["/pause"],
            checkpoint_uri="",
            pool=pool,
        )
        body = build_probe(
            self.api.api_client.sanitize_for_serialization(training),
            name=name,
            labels=labels,
            pool=pool,
            image=self.probe_image,
        )
        try:
            self.api.create_namespaced_pod(self.namespace, body)
        except ApiException as e:
            if e.status != 409:  # 409: the name is this probe's alone, a retry met what it made
                raise BackendError(
                    f"could not create probe pod {name}: {e.status} {e.reason} (a probe needs "
                    f"the PriorityClass {body['spec']['priorityClassName']!r}: let the worker "
                    "create priorityclasses, or create it once from probe.build_priority_class())"
                ) from e
        return {"namespace": self.namespace, "name": name, "pool": pool, "created_at": created}

    def probe_signal(self, probe: dict[str, Any], now: float) -> SpotSignal | None:
        """What the probe shows now: bound, up; refused (backoff, an ICE for its pool, or
        unschedulable with no scale-up asked for), down; else None (nothing known yet)."""
        from airflow_spot.backends.kubernetes.probe import read_probe

        pod, events = self._cluster.pod_and_events(probe["namespace"], probe["name"])
        if pod is None:
            return None
        pool = str(probe.get("pool") or "")
        bound = pod.spec is not None and pod.spec.node_name
        refusals = [] if bound else self._cluster.karpenter(self._spot_placements(pool), now)
        return read_probe(
            pod,
            events,
            pool=pool,
            created_at=float(probe["created_at"]),
            now=now,
            refusals=refusals,
        )

    @reaching_server
    def drop_probe(self, probe: dict[str, Any]) -> None:
        """Delete the probe at once (grace 0), so a node made for it goes back; gone is fine."""
        self._cluster.delete_pod(probe["namespace"], probe["name"])

    # -- API helpers ------------------------------------------------------------------------
    def _read_pod(self, name: str):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise BackendError(f"reading pod {name}: {e.status} {e.reason}") from e

    def _wait_gone(self, name: str, wait_s: float) -> None:
        """Wait (at most ``wait_s``) until the pod is gone; a failed read means not yet."""
        until = time.time() + wait_s
        while time.time() < until:
            try:
                if self._read_pod(name) is None:
                    return
            except BackendError:
                pass
            time.sleep(0.2)

    def _read_node(self, name: str):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return None
            hint = RBAC_HINT if e.status == 403 else ""
            raise BackendError(f"reading node {name}: {e.status} {e.reason}{hint}") from e

    def _events(self, handle: AttemptHandle, node_name: str | None) -> list[Any]:
        """Events of this pod and its node. Names are reused (a cleared task's attempt 1, a
        recreated GKE VM), and events outlive their object by an hour: an event of another
        object with the same name (other uid, or from before this one existed) is left out."""
        out = [
            e
            for e in self.api.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={_pod(handle)}"
            ).items
            if same_object(e, handle.pod_uid, handle.launched_at)
        ]
        if node_name:
            from kubernetes.client.exceptions import ApiException

            try:
                node_events = self.api.list_event_for_all_namespaces(
                    field_selector=f"involvedObject.name={node_name}"
                ).items
            except ApiException as e:
                raise BackendError(
                    f"listing events of node {node_name}: {e.status} {e.reason}"
                    + (RBAC_HINT if e.status == 403 else "")
                ) from e
            out += [
                e
                for e in node_events
                if same_object(e, handle.node_uid, handle.node_created, alias=node_name)
            ]
        return out

    def _relay_notice(self, pod_name: str, notice: str) -> None:
        log.warning(
            "Node of pod %s shows an interruption warning (%s): setting %s so the container checkpoints now.",
            pod_name,
            notice,
            NOTICE_ANNOTATION,
        )
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.patch_namespaced_pod(
                pod_name,
                self.namespace,
                {"metadata": {"annotations": {NOTICE_ANNOTATION: notice}}},
            )
        except ApiException as e:
            if e.status == 404:  # evicted or deleted since the look: its verdict comes next
                log.warning("Pod %s is gone before the notice reached it.", pod_name)
                return
            raise BackendError(
                f"relaying the interruption notice to pod {pod_name}: {e.status} {e.reason}"
                + (
                    " (the worker's service account needs patch on pods in its namespace; see"
                    " docker/rbac.yaml)"
                    if e.status == 403
                    else ""
                )
                + api_message(e)
            ) from e

    def _delete(self, name: str, grace: int) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)
        except ApiException as e:
            if e.status != 404:
                raise BackendError(f"deleting pod {name}: {e.status} {e.reason}") from e


def _pod(handle: AttemptHandle) -> str:
    """The pod of a Kubernetes attempt's handle."""
    if handle.pod is None:
        raise BackendError(f"not a Kubernetes attempt's handle: {handle.to_dict()}")
    return handle.pod


def _is_probe(pod: Any) -> bool:
    from airflow_spot.backends.kubernetes.probe import PROBE_LABEL

    labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
    return labels.get(PROBE_LABEL) == "true"


def _placement_from(d: dict[str, Any]) -> Placement:
    return Placement(
        d.get("node_selector") or {}, tuple(d.get("tolerations") or ()), d.get("affinity")
    )
