"""Make-before-break returns to spot on Kubernetes: a held spot pod is bound and started, says
it is ready (``ready_at``) and trains nothing until ``release_hold``; then it resumes from the
checkpoint the on-demand attempt saved when it stopped. A held pod reclaimed before its
release is preempted, and the on-demand attempt trains on."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.backends.base import HandsOver, Outcome, State
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.checkpoint.checkpoints import Checkpoints
from airflow_spot.checkpoint.stores import open_store
from airflow_spot.checkpoint.training import ENV, HOLD_ANNOTATION, NOTICE_ANNOTATION
from airflow_spot.testing import train_command
from airflow_spot.testing_kube import FakeCloud, FakeKube

IDENT = {
    "dag_id": "nightly_train",
    "task_id": "train",
    "run_id": "manual__2026-01-01T00:00:00+00:00",
    "map_index": -1,
    "try_number": 1,
}
STEPS = 400


@pytest.fixture
def cloud(tmp_path: Path):
    kube = FakeKube().start()
    cfg = kube.kubeconfig(tmp_path / "kubeconfig")
    made: list[FakeCloud] = []

    def make(**kw: Any) -> FakeCloud:
        c = FakeCloud(cfg, tmp_path / "nodes", kube=kube, **kw).start()
        made.append(c)
        return c

    yield make, KubernetesBackend(image="ghcr.io/me/train:1", config_file=cfg, gpus=1)
    for c in made:
        c.stop()
    kube.stop()


def _until(what: Callable[[], Any], timeout: float = 20.0) -> Any:
    until = time.time() + timeout
    while time.time() < until:
        if found := what():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _latest(ckpt: Path) -> int:
    m = Checkpoints(open_store(str(ckpt))).latest_manifest()
    return m.step if m else 0


def _launch(b: KubernetesBackend, attempt: int, capacity: str, ckpt: Path, **kw: Any):
    cmd = train_command(STEPS, step_seconds=0.02, save_every=5, seed=7)
    return b.launch(IDENT, attempt, capacity, cmd, checkpoint_uri=str(ckpt), **kw)


def test_a_held_pod_is_ready_trains_nothing_until_released_then_resumes(
    cloud, tmp_path: Path
) -> None:
    make, b = cloud
    fake = make()
    ckpt = tmp_path / "ckpt"
    assert isinstance(b, HandsOver)
    od = _launch(b, 1, "on_demand", ckpt)
    _until(lambda: _latest(ckpt) >= 10)
    spot = _launch(b, 2, "spot", ckpt, hold=True)
    pod = b.api.read_namespaced_pod(spot.pod, "default")
    assert pod.metadata.annotations == {NOTICE_ANNOTATION: "", HOLD_ANNOTATION: "wait"}
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env[ENV["hold"]] == env[ENV["notice_annotations"]]
    ready = _until(lambda: (s := b.status(spot)).ready_at is not None and s)
    assert ready.state is State.LAUNCHING and ready.started_at is None
    assert ready.granted_at is not None and ready.ready_at >= ready.granted_at - 1.0
    assert b.status(od).state is State.RUNNING  # the held launch kept the on-demand pod
    assert spot.pod in fake.procs  # its container runs (held, not training)

    stopped = b.cancel(od, wait_s=20)  # on-demand checkpoints on SIGTERM and stops
    assert stopped.outcome is Outcome.CANCELLED
    saved = _latest(ckpt)
    log = (tmp_path / "nodes" / str(od.pod) / "container.log").read_text()
    assert f"checkpoint at step {saved} saved" in log  # on SIGTERM: nothing lost
    time.sleep(1.0)  # held: nothing read, nothing written
    assert _latest(ckpt) == saved
    still = b.status(spot)
    assert still.started_at is None and still.ready_at is not None

    released_at = time.time()
    b.release_hold(spot)
    st = _until(lambda: (s := b.status(spot)).started_at is not None and s)
    assert st.started_at >= released_at - 1e-3 and st.state is State.RUNNING
    assert _until(lambda: _latest(ckpt) > saved)
    log = (tmp_path / "nodes" / str(spot.pod) / "container.log").read_text()
    assert log.index("Released") < log.index("Resuming")
    assert f"(step {saved} of {STEPS})" in log  # resumed from the checkpoint saved on stopping
    end = _until(lambda: (s := b.status(spot)).terminal and s, timeout=40)
    assert end.outcome is Outcome.SUCCEEDED


def test_a_held_pod_reclaimed_before_its_release_is_preempted(cloud, tmp_path: Path) -> None:
    """The spot node is reclaimed while the pod is held: preempted, its training never began
    (no started_at), and the on-demand pod runs on untouched."""
    make, b = cloud
    fake = make()
    ckpt = tmp_path / "ckpt"
    od = _launch(b, 1, "on_demand", ckpt)
    _until(lambda: _latest(ckpt) >= 5)
    spot = _launch(b, 2, "spot", ckpt, hold=True)
    _until(lambda: b.status(spot).ready_at is not None)
    saved = _latest(ckpt)
    fake.inject(str(spot.pod), "pod_gc")
    end = _until(lambda: (s := b.status(spot)).terminal and s)
    assert end.outcome is Outcome.PREEMPTED and end.started_at is None, end.reason
    assert b.status(od).state is State.RUNNING
    assert _until(lambda: _latest(ckpt) > saved)  # on-demand trains on
    b.cancel(od, wait_s=20)


def test_a_held_pod_with_a_reclaim_notice_is_not_ready(cloud, tmp_path: Path) -> None:
    """A notice on the held pod's node: it is not offered as ready (the hand-over would go
    to a node about to vanish); it is preempted, and saved nothing."""
    make, b = cloud
    fake = make(grace_s=5.0)
    ckpt = tmp_path / "ckpt"
    spot = _launch(b, 1, "spot", ckpt, hold=True)
    _until(lambda: b.status(spot).ready_at is not None)
    fake.inject(str(spot.pod), "karpenter")
    st = _until(lambda: (s := b.status(spot)).state is State.PREEMPTING and s)
    assert st.ready_at is None and st.started_at is None
    b.carry_out(spot, st)  # the notice relayed to the pod
    end = _until(lambda: (s := b.status(spot)).terminal and s)
    assert end.outcome is Outcome.PREEMPTED
    assert _latest(ckpt) == 0  # held: nothing was saved
