"""Gangs on the real control plane (issue 36): ``KubernetesBackend(nodes=2)`` runs each
attempt as an indexed Job of two real JAX ranks (``airflow_spot.examples.train_ddp``, gloo
all-gathers over TCP) that the real Job controller, scheduler, node lifecycle controller,
taint manager and pod GC handle, the ranks running as processes under the test cluster's
kubelet. Each case takes the gang's nodes the way the cloud does and checks the gang's one
verdict (:mod:`airflow_spot.backends.kubernetes.gang_verdict`) and how long it took: within
30 s each, the partial gang's counted from its 6 s timeout. ``-s`` prints the table."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax  # noqa: F401 - the gang extra, pinned in requirements.lock: these never skip
import pytest

from airflow_spot.backends.base import AttemptStatus, Outcome, State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.backends.kubernetes.gang_launch import INDEX, JOB_NAME_LABEL
from airflow_spot.backends.kubernetes.gating import PLACEHOLDER_LABEL
from airflow_spot.checkpoint.manifest import Manifest
from airflow_spot.testing.cluster.looks import look

N = 2
SETTLE_S = 10.0  # the plane's node monitor grace is 6 s: a lost node is NotReady within it
TIMEOUT_S = 6.0  # the partial-gang timeout of these tests (10 min by default)
VERDICT_S = 30.0  # every case's verdict comes within this (the bound)
IDENT = TaskIdentity("gang_dag", "train", "manual__2026-01-01T00:00:00+00:00")
TRAIN = [
    sys.executable, "-m", "airflow_spot.examples.train_ddp",
    "--steps", "100000", "--step-seconds", "0.05", "--save-every", "20",
]  # fmt: skip
# rank 1 raises in its 30th step: a real crash of one rank while the capacity is healthy
CRASH_RANK_1 = [
    sys.executable,
    "-c",
    "import sys\n"
    "from airflow_spot.examples import train_ddp\n"
    "real = train_ddp.local_gradient\n"
    "def crash(w, x, y, seed, step, rank, n):\n"
    "    if rank == 1 and step == 30:\n"
    "        raise RuntimeError('rank 1 crashed')\n"
    "    return real(w, x, y, seed, step, rank, n)\n"
    "train_ddp.local_gradient = crash\n"
    "sys.exit(train_ddp.main(sys.argv[1:]))\n",
    *TRAIN[3:],
]
TABLE: list[tuple[str, str, float, str]] = []  # (case, verdict, seconds to verdict, from)


@pytest.fixture(scope="module", autouse=True)
def _table():
    """Print the verdict table at the end (``-s``), and write it where
    ``$AIRFLOW_SPOT_GANG_TABLE`` says."""
    yield
    rows = [f"| {c} | {v} | {s:.1f} | {since} |" for c, v, s, since in TABLE]
    text = "\n".join(["| case | verdict | seconds to verdict | from |", "|---|---|---|---|", *rows])
    print("\n" + text)
    if os.environ.get("AIRFLOW_SPOT_GANG_TABLE"):
        Path(os.environ["AIRFLOW_SPOT_GANG_TABLE"]).write_text(text + "\n")


def backend(cluster, **kw) -> KubernetesBackend:
    return KubernetesBackend(
        image="ghcr.io/me/train:1",
        config_file=cluster.kubeconfig,
        namespace=cluster.namespace,
        preset=kw.pop("preset", "karpenter"),
        gpus=1,
        nodes=N,
        gang_settle_s=SETTLE_S,
        gang_timeout_s=TIMEOUT_S,
        pending_timeout_s=TIMEOUT_S,
        grace_period_s=5,
        **kw,
    )


def launch(b: KubernetesBackend, tmp_path: Path, command=TRAIN, capacity: str = "spot"):
    return b.launch(IDENT, 1, capacity, command, checkpoint_uri=str(tmp_path / "ckpt"))


def rank_pods(cluster, h) -> dict[int, object]:
    pods = cluster.api.list_namespaced_pod(
        cluster.namespace, label_selector=f"{JOB_NAME_LABEL}={h.pod}"
    ).items
    return {int(p.metadata.annotations[INDEX]): p for p in pods}


def training(cluster, b: KubernetesBackend, h, ckpt: Path, timeout: float = 60.0) -> dict[int, str]:
    """Look (the operator's way) until both ranks run and have trained together (rank 0 wrote
    a checkpoint: their collectives are connected); each rank's node."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        st = look(b, h)
        assert not st.terminal, st
        if st.state is State.RUNNING and list(ckpt.glob("ckpt-*/MANIFEST.json")):
            return {k: p.spec.node_name for k, p in rank_pods(cluster, h).items()}
        time.sleep(0.2)
    raise AssertionError(f"the gang never trained in {timeout} s")


def verdict(b: KubernetesBackend, h, since: float) -> tuple[AttemptStatus, float, list]:
    """Look every 0.2 s until the gang's verdict; it, the seconds it took from ``since``, and
    every status seen on the way."""
    seen = []
    while time.time() - since < VERDICT_S + 15:
        st = look(b, h)
        seen.append(st)
        if st.terminal:
            return st, time.time() - since, seen
        time.sleep(0.2)
    raise AssertionError(f"no verdict in {VERDICT_S + 15} s: {seen[-1]}")


def record(case: str, st: AttemptStatus, took: float, since: str = "the reclaim") -> None:
    TABLE.append((case, st.outcome.value if st.outcome else "?", took, since))
    assert took <= VERDICT_S, (case, took)


def ranks_stop(cluster, h, timeout: float = 30.0) -> None:
    """No rank process of the gang is left running under the kubelet."""
    k, prefix = cluster.kubelet, f"{cluster.namespace}/{h.pod}-"
    until = time.monotonic() + timeout
    while time.monotonic() < until and [key for key in k.procs if key.startswith(prefix)]:
        time.sleep(0.2)
    assert not [key for key in k.procs if key.startswith(prefix)], k.procs


@pytest.mark.parametrize("victim", [0, 1], ids=["rank0", "worker"])
def test_a_rank_whose_node_is_reclaimed_preempts_the_gang(kube_cluster, tmp_path, victim) -> None:
    """A spot node deleted under rank 0 (the rendezvous) or under a worker: the gang is
    ``preempted``, naming that rank, though the other rank died of its collective at once
    (exit 1, a gloo error); the survivor is stopped with the gang."""
    b = backend(kube_cluster)
    h = launch(b, tmp_path)
    nodes = training(kube_cluster, b, h, tmp_path / "ckpt")
    t0 = time.time()
    kube_cluster.kubelet.reclaim(nodes[victim], "delete")
    st, took, _ = verdict(b, h, t0)
    assert st.outcome is Outcome.PREEMPTED, st.reason
    assert st.evidence["victims"] == [victim] and f"rank {victim} of 2" in st.reason
    ends = {r["rank"]: r["outcome"] for r in st.evidence["ranks"]}
    assert ends == {victim: "preempted", 1 - victim: "stopped"}, ends
    assert st.granted_at is not None and st.started_at is not None
    record(f"rank {victim}'s node reclaimed (node deleted)", st, took)
    ranks_stop(kube_cluster, h)


def test_every_node_reclaimed_at_once(kube_cluster, tmp_path) -> None:
    """Both nodes deleted together: ``preempted``, both ranks its victims."""
    b = backend(kube_cluster)
    h = launch(b, tmp_path)
    nodes = training(kube_cluster, b, h, tmp_path / "ckpt")
    t0 = time.time()
    kube_cluster.kubelet.reclaim_all(list(nodes.values()), "delete")
    st, took, _ = verdict(b, h, t0)
    assert st.outcome is Outcome.PREEMPTED and st.evidence["victims"] == [0, 1], st.reason
    record("every node reclaimed at once", st, took)


def test_a_node_drained_with_a_notice(kube_cluster, tmp_path) -> None:
    """Karpenter's spot interruption on rank 1's node (``SpotInterrupted``, the disrupted
    taint), then its drain through the Eviction API: the notice is relayed to every rank, the
    gang agrees to stop at one step, rank 0 saves, and the verdict is ``preempted``."""
    b = backend(kube_cluster)
    h = launch(b, tmp_path)
    nodes = training(kube_cluster, b, h, tmp_path / "ckpt")
    k, t0 = kube_cluster.kubelet, time.time()
    k._notice(nodes[1])  # the cloud's word first; the drain follows
    until = time.monotonic() + 10
    while not h.notice_sent and time.monotonic() < until:
        look(b, h)
        time.sleep(0.2)
    assert h.notice_sent and h.notice == "event SpotInterrupted", h
    k.reclaim(nodes[1], "drain")
    st, took, _ = verdict(b, h, t0)
    assert st.outcome is Outcome.PREEMPTED, st.reason
    newest = max((tmp_path / "ckpt").glob("ckpt-*/MANIFEST.json"))
    m = Manifest.from_json(newest.read_bytes())
    assert m.created >= t0 and m.world_size == N  # saved on the notice, by rank 0
    record("one node drained with a notice", st, took, "the notice")
    ranks_stop(kube_cluster, h)


def test_a_survivor_that_fails_before_the_lost_record_is_still_preempted(
    kube_cluster, tmp_path
) -> None:
    """Rank 1's node stops heartbeating: its process dies at once, rank 0 fails on the reset
    socket (exit 1, a gloo error) within a second, while the API still shows rank 1's node
    Ready (the node monitor marks it NotReady only after its grace). The gang waits for that
    record instead of reading rank 0's exit as an application failure: ``preempted``."""
    b = backend(kube_cluster)
    h = launch(b, tmp_path)
    nodes = training(kube_cluster, b, h, tmp_path / "ckpt")
    t0 = time.time()
    kube_cluster.kubelet.reclaim(nodes[1], "unreachable")
    st, took, seen = verdict(b, h, t0)
    assert st.outcome is Outcome.PREEMPTED and st.evidence["victims"] == [1], st.reason
    # the survivor's failure came first: the gang waited (no verdict) with rank 0 failed
    early = [s for s in seen if not s.terminal and s.state is State.PREEMPTING]
    trail = [(round(s.heartbeat - t0, 1), s.state.value, s.evidence["ranks"]) for s in seen]
    assert any(
        r["rank"] == 0 and r["exit_code"] == 1 for s in early for r in s.evidence["ranks"]
    ), trail
    rank0 = rank_pods(kube_cluster, h)[0].status.container_statuses[0].state.terminated
    assert rank0.exit_code == 1 and "allgather failed" in (rank0.message or "").lower(), rank0
    node = kube_cluster.api.read_node(nodes[1])
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status != "True" and rank0.finished_at <= ready.last_transition_time
    record("a survivor fails before the lost rank's record", st, took)


def test_a_partial_gang_is_deleted_at_its_timeout(kube_cluster, tmp_path) -> None:
    """The cloud has one spot node for a gang of two: one placeholder is placed, the other
    waits, and the ranks stay gated (holding nothing). At the 6 s timeout the gang is deleted
    (Job, placeholders) and the attempt is ``spot_unavailable``: a request that was never
    granted, the node-seconds it held reported for billing."""
    k = kube_cluster.kubelet
    k.spot_limit = 1
    b = backend(kube_cluster)
    t0 = time.time()
    h = launch(b, tmp_path)
    st, took, seen = verdict(b, h, t0)
    assert st.outcome is Outcome.SPOT_UNAVAILABLE and "partial gang: 1 of 2" in st.reason, st
    assert st.granted_at is None  # never all N: spot was not there for the gang
    # held since its first node (the API's times have whole seconds), about the timeout long
    assert st.evidence["held_since"] >= int(t0) and 0 < st.evidence["held_node_s"] <= TIMEOUT_S + 2
    assert all(s.state is State.WAITING for s in seen[:-1])
    assert not rank_pods(kube_cluster, h) or all(
        p.metadata.deletion_timestamp for p in rank_pods(kube_cluster, h).values()
    )
    api, ns = kube_cluster.api, kube_cluster.namespace
    until = time.monotonic() + 15
    while time.monotonic() < until and (
        api.list_namespaced_pod(ns, label_selector=f"{PLACEHOLDER_LABEL}={h.pod}").items
        or k.spot_nodes()
    ):
        time.sleep(0.2)
    assert not k.spot_nodes(), "the partial gang's node is still held"
    record("a partial gang stuck Pending past its timeout", st, took - TIMEOUT_S, "the timeout")


def test_an_application_failure_in_one_rank(kube_cluster, tmp_path) -> None:
    """Rank 1 raises on healthy capacity and rank 0 then fails in the same second on the
    gloo error: an ``app_failure`` naming rank 1 (the termination messages tell the crash from
    the collective error), with rank 1's traceback in the log tail."""
    b = backend(kube_cluster)
    h = launch(b, tmp_path, CRASH_RANK_1)
    training(kube_cluster, b, h, tmp_path / "ckpt")
    t0 = time.time()
    st, took, _ = verdict(b, h, t0)
    assert st.outcome is Outcome.APP_FAILURE, st.reason
    assert st.evidence["rank"] == 1 and st.reason.startswith("rank 1 of 2"), st.reason
    assert st.exit_code == 1
    assert "rank 1 crashed" in b.log_tail(h)
    rank1 = rank_pods(kube_cluster, h)[1].status.container_statuses[0].state.terminated
    assert rank1.exit_code == 1 and "rank 1 crashed" in rank1.message
    assert json.dumps(st.evidence)  # the trigger carries it as JSON
    crashed = rank1.finished_at.timestamp()  # whole seconds
    record("an application failure in one rank", st, t0 + took - crashed, "the crash")


def test_an_on_demand_gang_takes_the_reserved_pool_and_reports_its_acquisition(
    kube_cluster, tmp_path
) -> None:
    """``preset="karpenter-reserved"``: the on-demand gang (no gate: the fallback waits for no
    placeholder) may take reserved or on-demand nodes and never spot; the time it took to get
    all N nodes is in its status (``acquired_s``)."""
    k = kube_cluster.kubelet
    k.autoscale = False
    for name, kind in (("res-1", "reserved"), ("res-2", "reserved"), ("spot-x", "spot")):
        k.wait_ready(k.add_node(name, {"karpenter.sh/capacity-type": kind}))
    b = backend(kube_cluster, preset="karpenter-reserved")
    h = launch(b, tmp_path, ["sleep", "60"], capacity="on_demand")
    until = time.monotonic() + 30
    while (st := look(b, h)).state is not State.RUNNING and time.monotonic() < until:
        assert not st.terminal, st
        time.sleep(0.2)
    assert st.state is State.RUNNING and st.evidence["spot_node"] is False, st
    assert sorted(st.evidence["nodes"]) == ["res-1", "res-2"]
    assert 0 <= st.evidence["acquired_s"] <= 30 and st.granted_at is not None
    b.cancel(h)


def test_a_gangs_probe_is_up_only_when_all_n_are_placed(kube_cluster) -> None:
    """A gang of two probes with two probe pods: with one spot node to be had it shows
    nothing yet (a single pod's probe would say "up"); with two, "all 2 probes placed". The
    drop deletes both."""
    k = kube_cluster.kubelet
    k.spot_limit = 1
    b = backend(kube_cluster)
    b.cluster.ensure_priority_class()
    probe = b.probe(IDENT)
    assert probe["count"] == N

    def settled() -> object:
        until, sig = time.monotonic() + 10, None
        while time.monotonic() < until:
            pods = kube_cluster.api.list_namespaced_pod(kube_cluster.namespace).items
            if sum(1 for p in pods if p.spec.node_name) >= min(N, k.spot_limit or N):
                return b.probe_signal(probe, time.time())
            time.sleep(0.2)
        return sig

    assert settled() is None  # one of two placed: not up
    k.spot_limit = None
    sig = settled()
    assert sig is not None and sig.up and sig.detail == f"all {N} probes placed", sig
    b.drop_probe(probe)
    until = time.monotonic() + 10
    while (
        time.monotonic() < until
        and kube_cluster.api.list_namespaced_pod(kube_cluster.namespace).items
    ):
        time.sleep(0.2)
    assert not kube_cluster.api.list_namespaced_pod(kube_cluster.namespace).items
