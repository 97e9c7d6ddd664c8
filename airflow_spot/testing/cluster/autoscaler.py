"""cluster-autoscaler's status, as it writes it, for tests on a cluster where no autoscaler
runs: a test creates the ConfigMap on the (real) API server and reads the backend's signals."""

from __future__ import annotations

import datetime
import time


def autoscaler_status(group: str, backoff: bool, at: float | None = None) -> dict:
    """A ``kube-system/cluster-autoscaler-status`` ConfigMap as cluster-autoscaler >= 1.30
    writes it (YAML status; ``last-updated`` in Go's time format), with one node group."""
    t = datetime.datetime.fromtimestamp(time.time() if at is None else at, datetime.UTC)
    go_time = t.strftime("%Y-%m-%d %H:%M:%S.%f000 +0000 UTC")
    iso = t.strftime("%Y-%m-%dT%H:%M:%SZ")
    scale_up = (
        """    status: Backoff
    backoffInfo:
      errorCode: placeholder-cannot-be-fulfilled
      errorMessage: AWS cannot provision any more instances for this node group
"""
        if backoff
        else "    status: NoActivity\n    backoffInfo: {}\n"
    )
    status = f"""autoscalerStatus: Running
clusterWide:
  health:
    lastProbeTime: "{iso}"
    lastTransitionTime: "{iso}"
    nodeCounts:
      longUnregistered: 0
      registered: {{notStarted: 0, ready: 1, total: 1, unready: {{resourceUnready: 0, total: 0}}}}
      unregistered: 0
    status: Healthy
  scaleUp:
    lastProbeTime: "{iso}"
    lastTransitionTime: "{iso}"
    status: {"Backoff" if backoff else "NoActivity"}
nodeGroups:
- health:
    cloudProviderTarget: 0
    lastProbeTime: "{iso}"
    lastTransitionTime: "{iso}"
    maxSize: 8
    minSize: 0
    status: Healthy
  name: {group}
  scaleDown:
    lastProbeTime: "{iso}"
    lastTransitionTime: "{iso}"
    status: NoCandidates
  scaleUp:
{scale_up}    lastProbeTime: "{iso}"
    lastTransitionTime: "{iso}"
time: {go_time}
"""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "cluster-autoscaler-status",
            "namespace": "kube-system",
            "annotations": {"cluster-autoscaler.kubernetes.io/last-updated": go_time},
        },
        "data": {"status": status},
    }
