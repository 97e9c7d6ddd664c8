"""Test doubles for airflow-spot, for our tests and our users': small working implementations,
no mocks. What a test of a DAG or of training code needs most is importable from here:

* :class:`FileTaskStateStore`, :class:`FakeTaskInstance`, :func:`make_context`: Airflow's task
  state store, task instance and context, as the operator reads them (:mod:`.fakes`);
* :func:`scripted_trace`, :data:`THREE_PREEMPTIONS_THEN_OUTAGE`: a spot market scripted tick by
  tick; :func:`train_command`: the bundled example training; :func:`modules_loaded`: what an
  import costs (:mod:`.fakes`);
* :class:`MemoryStore`: an in-memory checkpoint store (:mod:`.memory`); :class:`~.disks.FullDisk`:
  a local store whose disk fills up on demand (the kernel's ENOSPC, :mod:`.disks`).

Two more, imported by name (each starts servers or processes):

* :mod:`.faults`: a fault-injecting HTTP proxy (S3's and Kubernetes' errors, dropped and cut
  connections) in front of a moto S3 server or a Kubernetes API server;
* :mod:`.cluster`: a real Kubernetes control plane (etcd, kube-apiserver, controllers,
  scheduler, kwok; Karpenter on demand) with our kubelet and cloud, and its pytest fixtures
  (``pytest_plugins = ["airflow_spot.testing.cluster.pytest_plugin"]``). Its binaries are built
  from a checkout of the repository; an installed package says so when they are missing.

Everything here imports with the package's own dependencies (no pytest, moto or kmock).
"""

from airflow_spot.testing.fakes import (
    THREE_PREEMPTIONS_THEN_OUTAGE,
    FakeTaskInstance,
    FileTaskStateStore,
    make_context,
    modules_loaded,
    scripted_trace,
    train_command,
)
from airflow_spot.testing.memory import MemoryStore

__all__ = [
    "THREE_PREEMPTIONS_THEN_OUTAGE",
    "FakeTaskInstance",
    "FileTaskStateStore",
    "MemoryStore",
    "make_context",
    "modules_loaded",
    "scripted_trace",
    "train_command",
]
