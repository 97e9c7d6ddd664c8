"""A gang's manifests: one indexed Job and a headless Service per attempt (pure: API JSON).

A JobSet would give the same shape with restart policies we do not want (the operator, not
the controller, decides where the next attempt runs), and its controller is one more
component to install; an indexed Job is core Kubernetes. The attempt pod the backend would
launch for one node (:func:`~.pods.attempt_pod`) becomes the Job's pod template:

* ``completionMode: Indexed``, ``completions`` = ``parallelism`` = N, ``backoffLimit: 0``, and a
  ``podFailurePolicy`` that fails the Job at the first failed rank (a ``DisruptionTarget``
  first, then any non-zero exit), so the Job controller stops every other rank at once and
  never replaces one: the next attempt is the operator's decision;
* each rank's ``RANK`` is its completion index (the downward API), beside ``WORLD_SIZE``,
  ``LOCAL_RANK`` (0: one rank a node), ``MASTER_ADDR`` and ``MASTER_PORT``: rank 0 hosts the
  rendezvous at ``<job>-0.<service>``, its stable name under the headless Service (the Job
  controller gives each pod the hostname ``<job>-<index>``; the pods' ``subdomain`` is the
  Service), whose records exist before the pods are Ready (``publishNotReadyAddresses``);
* ``karpenter.sh/do-not-disrupt: "true"``: consolidation and drift never take a node of a
  running gang (a spot reclaim still does);
* a spot gang's pods carry the scheduling gate :data:`GATE`: they wait, holding nothing,
  until N placeholders are placed (:mod:`.gating`);
* ``terminationMessagePolicy: FallbackToLogsOnError``: a failed rank's last log lines are in
  its status, where the verdict tells a crash from a collective error (:mod:`.gang_verdict`).

The rendezvous port is drawn per attempt (:func:`rendezvous_port`): pods that share a host's
network (``hostNetwork``, the test cluster) never meet the previous attempt's gang on it.
"""

from __future__ import annotations

import copy
import zlib
from typing import Any

from airflow_spot.backends.kubernetes.probe import DO_NOT_DISRUPT

GATE = "airflow-spot/gang-capacity"  # the scheduling gate of a spot gang's pods
INDEX = "batch.kubernetes.io/job-completion-index"  # each rank's index (annotation and label)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods
PORT_BASE, PORT_SPAN = 29500, 1000  # rendezvous ports: 29500-30499
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def service_name(job: str) -> str:
    """The headless Service of a Job: its name, made a DNS-1035 label (a letter first)."""
    return job if job[:1].isalpha() else f"g{job}"[:63].rstrip("-")


def rank_host(job: str, rank: int) -> str:
    """Rank ``rank``'s stable DNS name in its namespace (the search path completes it)."""
    return f"{job}-{rank}.{service_name(job)}"


def rendezvous_port(task_key: str, attempt: int) -> int:
    """The attempt's rendezvous port, in 29500-30499: drawn from the task, then one up per
    attempt (an attempt's gang never meets the one before it on a shared host)."""
    return PORT_BASE + (zlib.crc32(task_key.encode()) + attempt) % PORT_SPAN


def rank_env(job: str, nodes: int, port: int) -> list[dict[str, Any]]:
    """The variables that make a pod rank ``JOB_COMPLETION_INDEX`` of ``nodes``."""
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}
    return [
        {"name": "RANK", "valueFrom": index},
        {"name": "WORLD_SIZE", "value": str(nodes)},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "MASTER_ADDR", "value": rank_host(job, 0)},
        {"name": "MASTER_PORT", "value": str(port)},
    ]


def pod_failure_policy() -> dict[str, Any]:
    """Fail the Job at the first failed rank, naming the cause: a disruption first."""
    return {
        "rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "train", "operator": "NotIn", "values": [0]},
            },
        ]
    }


def build_job(
    pod: dict[str, Any], *, name: str, nodes: int, port: int, gated: bool
) -> dict[str, Any]:
    """The gang's indexed Job, its template the attempt pod ``pod`` (API JSON) made a rank."""
    meta = pod.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    annotations = {**(meta.get("annotations") or {}), DO_NOT_DISRUPT: "true"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels, "annotations": dict(annotations)},
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,
            "podFailurePolicy": pod_failure_policy(),
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": _rank_spec(pod.get("spec") or {}, name, nodes, port, gated),
            },
        },
    }


def _rank_spec(
    spec: dict[str, Any], job: str, nodes: int, port: int, gated: bool
) -> dict[str, Any]:
    """The pod spec of every rank: the training container told its rank, the subdomain of the
    headless Service, and the gate (a spot gang)."""
    spec = copy.deepcopy(spec)
    containers = spec.get("containers") or []
    train = next((c for c in containers if c.get("name") == "train"), containers[0])
    ours = {e["name"] for e in rank_env(job, nodes, port)}
    train["env"] = [e for e in train.get("env") or [] if e.get("name") not in ours]
    train["env"] += rank_env(job, nodes, port)
    train.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    spec["subdomain"] = service_name(job)
    spec["restartPolicy"] = "Never"
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return spec


def build_service(job: str, job_uid: str, port: int, labels: dict[str, str]) -> dict[str, Any]:
    """The headless Service that names the gang's pods (deleted with its Job)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job),
            "labels": dict(labels),
            "ownerReferences": [owner(job, job_uid)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_NAME_LABEL: job},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port}],
        },
    }


def owner(job: str, job_uid: str) -> dict[str, Any]:
    """An owner reference to the gang's Job: the garbage collector deletes what it owns."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid}
