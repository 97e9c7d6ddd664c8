"""A real Kubernetes control plane for tests, ours and our users' (issue 20).

* :class:`ControlPlane`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
  kwok on 127.0.0.1, built from Go modules (``tools/k8s/build.sh``);
* :class:`~.karpenter.Karpenter`: Karpenter's kwok provider against it (NodeClaims, nodes,
  consolidation and their events the real ones), started by the opt-in ``karpenter`` fixture;
* :class:`Kubelet`: what runs on the simulated nodes: each bound pod's command as a local
  process, its status written as the kubelet writes it; and the cloud: which spot nodes exist,
  and how each is taken away.

Only the containers and the cloud are emulated; scheduling, admission, RBAC, eviction, the
node lifecycle controller, the taint manager and pod GC are the real components'.

The binaries are built from a checkout of the repository (``tools/k8s/``, which a wheel does
not ship); an installed package finds them in ``~/.cache/airflow-spot/k8s/<version>/bin``
(``$AIRFLOW_SPOT_K8S_CACHE``, ``$AIRFLOW_SPOT_K8S_BIN``), and without them fails (the pytest
fixtures skip) saying what is needed. Also here: :mod:`.looks` (a test's looks at an attempt),
:mod:`.autoscaler` (cluster-autoscaler's status ConfigMap), :mod:`.pytest_plugin`.
"""

from airflow_spot.testing.cluster.plane import (
    VERSION,
    ControlPlane,
    ControlPlaneError,
    ensure_binaries,
    missing_binaries,
    write_kubeconfig,
)

__all__ = [
    "VERSION",
    "ControlPlane",
    "ControlPlaneError",
    "ensure_binaries",
    "missing_binaries",
    "write_kubeconfig",
]
