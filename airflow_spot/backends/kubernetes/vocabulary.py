"""The words of a cluster that the Kubernetes backend reads and writes: capacity labels, taints,
event and status reasons, exit codes, and the annotations on an attempt's pod.

Pure constants. A new signal is one constant here and one rule in :mod:`.classify`. The
signals and their sources are in ``../shared/research/anchors.md`` section 2:

* pod condition ``DisruptionTarget`` (K8s >= 1.26) and its reasons ``TerminationByKubelet``,
  ``DeletionByPodGC``, ``DeletionByTaintManager``, ``EvictionByEvictionAPI``,
  ``PreemptionByScheduler`` [K7, K8];
* the kubelet's graceful node shutdown: ``status.reason`` ``Terminated`` (older: ``Shutdown``,
  ``NodeShutdown``) and its messages [K7, F4];
* a pod that vanished (404) or whose node vanished, after running on a spot node [F5, S4];
* Karpenter events ``SpotInterrupted``, ``TerminatingOnInterruption``, ... and taint
  ``karpenter.sh/disrupted`` [KP1, KP2]; Karpenter's own word on a drain (seen from the real
  Karpenter v1.14.1 in ``tests/backends/kubernetes/real/test_real_karpenter.py``): its
  consolidation says ``DisruptionTerminating`` "Disrupting Node: Underutilized" on the node and
  ``Evicted`` "Evicted pod: Underutilized" on the pod, a NodeClaim deleted from outside its
  disruption controller (an interruption) "Evicted pod: Forceful Termination"; AWS Node Termination Handler taint
  ``aws-node-termination-handler/spot-itn`` and events ``SpotInterruption`` ... [N1];
  GKE labels ``cloud.google.com/gke-spot`` / ``gke-preemptible`` and taint
  ``cloud.google.com/impending-node-termination`` [G1, I12]; AKS label/taint
  ``kubernetes.azure.com/scalesetpriority=spot`` and "Preempt" scheduled events [Z1, Z2];
* ``OOMKilled`` and non-zero exits on healthy capacity (application failures).
"""

from __future__ import annotations

# the annotations the training container reads are defined beside it (checkpoint/), and named
# here for the backend ("X as X": a re-export)
from airflow_spot.checkpoint.training import HOLD_ANNOTATION as HOLD_ANNOTATION
from airflow_spot.checkpoint.training import LEASE_ANNOTATION as LEASE_ANNOTATION
from airflow_spot.checkpoint.training import NOTICE_ANNOTATION as NOTICE_ANNOTATION
from airflow_spot.checkpoint.training import PREEMPTED_EXIT
from airflow_spot.checkpoint.training import STORAGE_EXIT as STORAGE_EXIT

# -- annotations on an attempt's pod ----------------------------------------------------------
LAUNCHED_ANNOTATION = "airflow-spot/launched-at"  # wall time of the launch, to the microsecond
# when a held pod was released (wall time): training began then, not at the container's start
RELEASED_ANNOTATION = "airflow-spot/hold-released-at"
LEASE_EXIT = PREEMPTED_EXIT  # the helper's exit after saving, past its lease

# -- capacity: labels, taints, events ----------------------------------------------------------
SPOT_LABELS: dict[str, tuple[str, ...]] = {
    "eks.amazonaws.com/capacityType": ("SPOT",),
    "karpenter.sh/capacity-type": ("spot",),
    "cloud.google.com/gke-spot": ("true",),
    "cloud.google.com/gke-preemptible": ("true",),
    "kubernetes.azure.com/scalesetpriority": ("spot",),
}
SHUTDOWN_REASONS = {"Terminated", "Shutdown", "NodeShutdown"}
SHUTDOWN_MESSAGES = (
    "Pod was terminated in response to imminent node shutdown.",
    "Pod Node is in progress of shutting down, not admitting any new pods",
    "Pod was rejected as the node is shutting down.",
)
SPOT_EVENT_REASONS = {"SpotInterrupted", "TerminatingOnInterruption", "SpotInterruption"}
NODE_LOSS_EVENT_REASONS = {
    "NodeNotReady",
    "DeletingNode",
    "TaintManagerEviction",
    "InstanceTerminating",
    "InstanceStopping",
    "RemovingNode",
}
SPOT_TAINTS = {
    "aws-node-termination-handler/spot-itn",
    "cloud.google.com/impending-node-termination",
}
# A container that cannot start: these keep a scheduled pod Pending for ever. The image or its
# config is wrong (or the registry is down): fail the attempt after a bound, at once if the
# name itself is invalid.
CONTAINER_START_ERRORS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}
CONTAINER_START_FATAL = {"InvalidImageName", "ErrImageNeverPull"}
# Exit codes of a container stopped by a signal (SIGINT, SIGKILL, SIGTERM): after a relayed
# reclaim notice these are the checkpoint helper exiting or the eviction, not the user's code.
SIGNAL_EXITS = {130, 137, 143}
NOTICE_WINDOW_S = 900.0  # a notice older than this at the exit no longer explains it
# Recorded notices that are the cloud's own word that the capacity is being reclaimed
# (``karpenter.sh/disrupted`` alone is not: Karpenter's consolidation sets it too).
CLOUD_NOTICES = (
    "node taint aws-node",
    "node taint cloud.google",
    "event Spot",
    "event Instance",
    "scheduled event",
)
# The scheduler's and autoscaler's own events about a pod: "preemption: ... Preemption is not
# helpful for scheduling" in a FailedScheduling message is priority preemption talk, never a
# cloud reclaim. Only events of the node (or its NodeClaim) may say "Preempt" for the cloud.
SCHEDULER_EVENT_REASONS = {
    "FailedScheduling",
    "Scheduled",
    "Preempted",
    "Preempting",
    "NotTriggerScaleUp",
    "TriggeredScaleUp",
}
# Karpenter's own words (sigs.k8s.io/karpenter v1.14 pkg/controllers/disruption/events and
# node/termination/terminator/events). Its disruption controller (consolidation, drift) says on
# the Node and the NodeClaim, before it deletes the NodeClaim, "Disrupting Node: <reason>"; its
# termination controller then evicts and says on the pod "Evicted pod: <reason>", the reason
# being the NodeClaim's DisruptionReason, or "Forceful Termination" when the NodeClaim was
# deleted from outside the disruption controller: the interruption controller after a spot
# interruption (that is how Karpenter takes a reclaimed instance away), an expiry, a repair, a
# person. Karpenter's own disruption is never a reclaim.
KARPENTER_DISRUPTING = "DisruptionTerminating"
KARPENTER_DISRUPTING_PREFIXES = ("Disrupting Node: ", "Disrupting NodeClaim: ")
KARPENTER_EVICTED = "Evicted"
KARPENTER_EVICTED_PREFIX = "Evicted pod: "
KARPENTER_FORCEFUL = "Forceful Termination"
KARPENTER_NODEPOOL = "karpenter.sh/nodepool"  # on every node Karpenter made
DRAIN_TAINTS = {
    "karpenter.sh/disrupted",
    "node.kubernetes.io/out-of-service",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/rebalance-recommendation",
}
