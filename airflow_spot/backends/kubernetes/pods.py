"""Build attempt pods with the Kubernetes models and the cncf-kubernetes provider's reconcile.

Labels identify DAG, task, run, try and attempt; the notice annotation is exposed to the
container through a downward-API volume that the checkpoint helper watches. Secure defaults:
non-root, no privilege escalation, no service-account token unless asked.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import TYPE_CHECKING, Any

from kubernetes.client import models as k8s

from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.backends.kubernetes.template import check_resources, load_pod_template
from airflow_spot.backends.kubernetes.vocabulary import HOLD_ANNOTATION, NOTICE_ANNOTATION
from airflow_spot.checkpoint.training import ENV
from airflow_spot.exceptions import ConfigError

if TYPE_CHECKING:
    from airflow_spot.backends.base import TaskIdentity

LABEL_PREFIX = "airflow-spot"
PODINFO_DIR = "/etc/airflow-spot/podinfo"
MANAGED_BY = {"app.kubernetes.io/managed-by": "airflow-spot"}


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars, alphanumerics, '-', '_', '.', alphanumeric at both ends).

    A value that had to be changed keeps a hash of the original, so two run ids that differ
    only in characters a label cannot hold ('manual__...T00:00:00+00:00' and '..._00_00')
    never share a label: the leftover-pod cleanup selects by these labels.
    """
    text = str(text)
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", text).strip("_.-")
    if clean == text and len(clean) <= 63:
        return clean
    return (clean[:52].rstrip("_.-") + "-" + hashlib.sha1(text.encode()).hexdigest()[:10]).lstrip(
        "-"
    )


def task_labels(task: TaskIdentity) -> dict[str, str]:
    """Labels shared by every attempt pod of one task instance (used to find them again)."""
    return {
        **MANAGED_BY,
        f"{LABEL_PREFIX}/dag-id": label_value(task.dag_id),
        f"{LABEL_PREFIX}/task-id": label_value(task.task_id),
        f"{LABEL_PREFIX}/run-id": label_value(task.run_id),
        # "-1" is no valid label value (it must start with an alphanumeric): the real API
        # server refuses the pod, and the selector, of a task that is not mapped
        f"{LABEL_PREFIX}/map-index": str(task.map_index) if task.map_index >= 0 else "none",
    }


def label_selector(labels: dict[str, str]) -> str:
    """The selector of the pods that carry all of ``labels``."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def pod_name(task: TaskIdentity, attempt: int) -> str:
    """Unique per task instance (mapped ones included) and attempt; a DNS-1123 name."""
    dag_id, task_id, map_index = task.dag_id, task.task_id, task.map_index
    key = f"{dag_id}/{task_id}/{task.run_id}" + (f"/{map_index}" if map_index >= 0 else "")
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9-]", "-", f"{dag_id}-{task_id}".lower()).strip("-")[:40].strip("-")
    return f"{base or 'spot'}-{digest}-a{attempt}"  # a DNS-1123 name starts with [a-z0-9]


def build_pod(
    *,
    name: str,
    namespace: str,
    image: str,
    command: list[str],
    capacity: str,
    attempt: int,
    try_number: int,
    labels: dict[str, str],
    placement: Placement,
    checkpoint_uri: str,
    env: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    gpus: int = 0,
    service_account: str | None = None,
    mount_token: bool = False,
    volumes: list[k8s.V1Volume] | None = None,
    volume_mounts: list[k8s.V1VolumeMount] | None = None,
    env_from_secrets: list[str] | None = None,
    pod_template: k8s.V1Pod | None = None,
    hold: bool = False,
) -> k8s.V1Pod:
    """One attempt's pod on ``pod_template`` (optional); ``hold``: held (``_metadata``).

    The provider's reconcile replaces a template field wherever ours is set, and merges
    containers by position; so the template is prepared first. Its training container is the
    one named ``train`` or ``base`` (or its only container if that names no image of its own);
    any other container is a sidecar and stays one. The template's resources, node selector,
    tolerations and security contexts are kept and ours added: a resource we set replaces the
    template's limit and request of that resource; a security setting the template states
    wins, and our non-root / no-escalation defaults are left out where the template asks for
    root, privilege or CAP_SYS_ADMIN (the API server would refuse both at once). A placement's
    affinity replaces the template's."""
    pod_template = _with_main_first(pod_template)
    t_spec = pod_template.spec if pod_template is not None else None
    t_main = t_spec.containers[0] if t_spec is not None else None
    merged = _merged_resources(resources, gpus, t_main)
    if t_main is not None:
        t_main.resources = None  # merged above: the reconcile must not bring it back
    wants_root = _states_root(t_spec)
    container = k8s.V1Container(
        name="train",
        image=image,
        command=command,
        env=_env(env, checkpoint_uri=checkpoint_uri, capacity=capacity, attempt=attempt, hold=hold),
        env_from=_env_from(env_from_secrets),
        resources=merged,
        volume_mounts=[_podinfo_mount(), *(volume_mounts or [])],
        security_context=_container_security(t_main, wants_root),
    )
    pod = k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=_metadata(name, namespace, labels, attempt, try_number, capacity, hold),
        spec=_pod_spec(
            container, placement, t_spec, volumes, service_account, mount_token, wants_root
        ),
    )
    return _reconciled(pod_template, pod)


def attempt_pod(
    backend: Any,
    *,
    name: str,
    labels: dict[str, str],
    try_number: int = 1,
    attempt: int,
    capacity: str,
    command: list[str],
    checkpoint_uri: str,
    env: dict[str, str] | None = None,
    pool: str = "",
    hold: bool = False,
) -> k8s.V1Pod:
    """The attempt pod as ``backend`` (a ``KubernetesBackend``) launches it: :func:`build_pod`
    with the backend's image, resources, placement (for ``capacity`` and ``pool``) and pod
    template."""
    template = load_pod_template(backend.pod_template, backend.allow_privileged)
    try:
        return build_pod(
            name=name,
            namespace=backend.namespace,
            image=backend.image,
            command=command,
            capacity=capacity,
            attempt=attempt,
            try_number=try_number,
            labels=labels,
            placement=backend.placement(capacity, pool),
            checkpoint_uri=checkpoint_uri,
            env={**backend.env, **(env or {})},
            resources=backend.resources,
            gpus=backend.gpus,
            service_account=backend.service_account,
            mount_token=backend.mount_service_account_token,
            env_from_secrets=list(backend.env_from_secrets),
            pod_template=template,
            hold=hold,
        )
    except (ValueError, TypeError) as e:
        if template is None:
            raise
        # the provider's reconcile on a template the parse-time check let through
        raise ConfigError("backend.pod_template", f"cannot build the attempt pod on it: {e}") from e


def spot_pods(backend: Any, pool: str | None = None) -> list[tuple[str, k8s.V1Pod]]:
    """(pool, the spot pod a launch would create there) for ``pool``, else for each spot pool
    (``""``: the preset's spot placement when there are no pools)."""
    names = [p.name for p in backend.pools] or [""]
    return [
        (
            name,
            attempt_pod(
                backend,
                name="spot-placement",
                labels={},
                attempt=0,
                capacity="spot",
                command=["/pause"],
                checkpoint_uri="",
                pool=name,
            ),
        )
        for name in (names if pool is None else [pool])
    ]


def _merged_resources(
    resources: dict[str, Any] | None, gpus: int, t_main: k8s.V1Container | None
) -> k8s.V1ResourceRequirements | None:
    """Ours and the template training container's (checked): a resource we set replaces the
    template's limit and request of that resource; None when neither sets any."""
    ours_limits = {k: str(v) for k, v in ((resources or {}).get("limits") or {}).items()}
    if gpus:
        ours_limits["nvidia.com/gpu"] = str(gpus)
    ours_requests = {k: str(v) for k, v in ((resources or {}).get("requests") or {}).items()}
    ours = set(ours_limits) | set(ours_requests)
    t_res = t_main.resources if t_main is not None and t_main.resources else None
    limits = {
        **{k: v for k, v in ((t_res.limits if t_res else None) or {}).items() if k not in ours},
        **ours_limits,
    }
    requests = {
        **{k: v for k, v in ((t_res.requests if t_res else None) or {}).items() if k not in ours},
        **ours_requests,
    }
    check_resources(limits, requests)
    if not (limits or requests):
        return None
    return k8s.V1ResourceRequirements(limits=limits or None, requests=requests or None)


def _container_security(t_main: k8s.V1Container | None, wants_root: bool) -> k8s.V1SecurityContext:
    """The training container's: what the template states, over our defaults (no escalation,
    non-root, no capabilities) less those the template's root, privilege or CAP_SYS_ADMIN
    contradict (the API server would refuse both at once)."""
    t_csc = t_main.security_context if t_main is not None else None
    privileged = t_csc is not None and (
        bool(t_csc.privileged)
        or any(
            c.upper().removeprefix("CAP_") == "SYS_ADMIN"
            for c in ((t_csc.capabilities.add or []) if t_csc.capabilities else [])
        )
    )
    return _stated_first(
        t_csc,
        k8s.V1SecurityContext(
            allow_privilege_escalation=None if privileged else False,
            run_as_non_root=None if wants_root else True,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )


def _env(
    env: dict[str, str] | None,
    *,
    checkpoint_uri: str,
    capacity: str,
    attempt: int,
    hold: bool = False,
) -> list[k8s.V1EnvVar]:
    """The user's variables, then ours (ours win): checkpoint URI, capacity, attempt and the
    notice annotations' file (and, held, the same file as the hold's)."""
    env_vars = {
        **(env or {}),
        ENV["checkpoint_uri"]: checkpoint_uri,
        ENV["capacity"]: capacity,
        ENV["attempt"]: str(attempt),
        ENV["notice_annotations"]: f"{PODINFO_DIR}/annotations",
    }
    if hold:
        env_vars[ENV["hold"]] = f"{PODINFO_DIR}/annotations"
    elif ENV["hold"] in env_vars:  # only ours may hold a pod
        del env_vars[ENV["hold"]]
    return [k8s.V1EnvVar(name=k, value=v) for k, v in env_vars.items()]


def _env_from(secrets: list[str] | None) -> list[k8s.V1EnvFromSource] | None:
    """Every key of each named secret as a variable; None when there are none."""
    return [
        k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=s)) for s in secrets or []
    ] or None


def _podinfo_mount() -> k8s.V1VolumeMount:
    return k8s.V1VolumeMount(name="airflow-spot-podinfo", mount_path=PODINFO_DIR, read_only=True)


def _podinfo_volume() -> k8s.V1Volume:
    """The pod's annotations (the notice among them) as a file, through the downward API."""
    return k8s.V1Volume(
        name="airflow-spot-podinfo",
        downward_api=k8s.V1DownwardAPIVolumeSource(
            items=[
                k8s.V1DownwardAPIVolumeFile(
                    path="annotations",
                    field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.annotations"),
                )
            ]
        ),
    )


def _metadata(
    name: str,
    namespace: str,
    labels: dict[str, str],
    attempt: int,
    try_number: int,
    capacity: str,
    hold: bool = False,
) -> k8s.V1ObjectMeta:
    """Name, the task's labels with the attempt's, the (empty) notice annotation and, held, the
    hold annotation (``wait``)."""
    return k8s.V1ObjectMeta(
        name=name,
        namespace=namespace,
        labels={
            **labels,
            f"{LABEL_PREFIX}/attempt": str(attempt),
            f"{LABEL_PREFIX}/try-number": str(try_number),
            f"{LABEL_PREFIX}/capacity": capacity,
        },
        annotations={NOTICE_ANNOTATION: "", **({HOLD_ANNOTATION: "wait"} if hold else {})},
    )


def _pod_spec(
    container: k8s.V1Container,
    placement: Placement,
    t_spec: k8s.V1PodSpec | None,
    volumes: list[k8s.V1Volume] | None,
    service_account: str | None,
    mount_token: bool,
    wants_root: bool,
) -> k8s.V1PodSpec:
    """The spec: the template's node selector and tolerations with the placement's added (its
    affinity replaces the template's), and the pod security context the template states over
    our non-root defaults."""
    tolerations = [
        *((t_spec.tolerations if t_spec else None) or []),
        *(k8s.V1Toleration(**_snake(t)) for t in placement.tolerations),
    ]
    return k8s.V1PodSpec(
        restart_policy="Never",
        containers=[container],
        volumes=[_podinfo_volume(), *(volumes or [])],
        node_selector={
            **((t_spec.node_selector if t_spec else None) or {}),
            **placement.node_selector,
        }
        or None,
        tolerations=tolerations or None,
        affinity=_affinity(placement.affinity),
        service_account_name=service_account,
        automount_service_account_token=mount_token,
        security_context=_stated_first(
            t_spec.security_context if t_spec else None,
            k8s.V1PodSecurityContext(
                run_as_non_root=None if wants_root else True,
                run_as_user=None if wants_root else 1000,
                run_as_group=None if wants_root else 1000,
                fs_group=1000,
            ),
        ),
    )


def _reconciled(template: k8s.V1Pod | None, pod: k8s.V1Pod) -> k8s.V1Pod:
    """``pod`` reconciled onto the prepared template by the provider, if there is one."""
    if template is None:
        return pod
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    return PodGenerator.reconcile_pods(template, pod)


def _with_main_first(template: k8s.V1Pod | None) -> k8s.V1Pod | None:
    """A copy of the template whose first container is the training one (an empty one named
    ``train`` when the template has only sidecars): the reconcile merges by position."""
    if template is None:
        return None
    template = copy.deepcopy(template)
    template.spec = template.spec or k8s.V1PodSpec(containers=[])
    containers = list(template.spec.containers or [])
    main = next((c for c in containers if c.name in ("train", "base")), None)
    if main is None and len(containers) == 1 and not containers[0].image:
        main = containers[0]
    if main is None:
        main = k8s.V1Container(name="train")
    else:
        containers.remove(main)
    template.spec.containers = [main, *containers]
    return template


def _states_root(spec: k8s.V1PodSpec | None) -> bool:
    """The template asks to run the training container as root (uid 0)."""
    if spec is None:
        return False
    pod_sc, main_sc = spec.security_context, spec.containers[0].security_context
    uid = main_sc.run_as_user if main_sc is not None else None
    if uid is None and pod_sc is not None:
        uid = pod_sc.run_as_user
    return uid == 0


def _stated_first(stated: Any, defaults: Any) -> Any:
    """``defaults`` with every field the template states (not None) taken from the template."""
    if stated is None:
        return defaults
    for attr in stated.attribute_map:
        value = getattr(stated, attr)
        if value is not None:
            setattr(defaults, attr, value)
    return defaults


def _snake(d: dict[str, Any]) -> dict[str, Any]:
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in d.items()}


def _affinity(raw: dict[str, Any] | None) -> k8s.V1Affinity | None:
    if not raw:
        return None
    from kubernetes.client import ApiClient

    class _Resp:  # ApiClient.deserialize reads .data
        def __init__(self, data: str) -> None:
            self.data = data

    import json

    return ApiClient().deserialize(_Resp(json.dumps(raw)), "V1Affinity")
