"""A gang's capacity from Karpenter's insufficient-capacity errors, counted per NodeClaim, on
the real control plane with Karpenter v1.14.1's kwok provider (issue 36, "capacity signals for
N").

The kwok provider is the test cloud, and a cloud can run out: ``tools/k8s/build.sh`` builds it
with ``tools/k8s/patches/kwok_ice.go``, and :meth:`Karpenter.out_of_capacity` makes every spot
launch fail with an ``InsufficientCapacityError``, as a real cloud's ``CreateFleet`` does (then
those offerings are listed unavailable for 3 minutes, as Karpenter's AWS provider does). That is
the emulated part, and only that: the NodeClaims, Karpenter's ``Nominated`` events on our pods,
its ``InsufficientCapacityError`` event on each NodeClaim and its deletion of the NodeClaim are
Karpenter's own. The gang's probe (N probe pods) and a spot gang's placeholders then read
"fewer than N" from those events, within seconds instead of the partial-gang timeout.
"""

from __future__ import annotations

import time

import pytest

from airflow_spot.backends.base import State, TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubernetesBackend
from airflow_spot.testing.cluster.karpenter import (
    CAPACITY_TYPE,
    karpenter_backend,
)

N = 2
SPOT_OUT = {CAPACITY_TYPE: "spot"}


def backend(cluster) -> KubernetesBackend:
    return karpenter_backend(
        cluster, resources={"requests": {"cpu": "100m", "memory": "64Mi"}}, nodes=N
    )


@pytest.fixture
def spot_out(karpenter_cluster):
    """The test cloud has no spot capacity for the test's length."""
    karpenter_cluster.karpenter.out_of_capacity(SPOT_OUT)
    try:
        yield karpenter_cluster
    finally:
        karpenter_cluster.karpenter.out_of_capacity()


def until(what: str, fn, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"no {what} within {timeout} s")


def ice_events(api) -> dict[str, str]:
    """NodeClaim -> the message of Karpenter's InsufficientCapacityError event on it."""
    got = api.list_event_for_all_namespaces(
        field_selector="reason=InsufficientCapacityError,involvedObject.kind=NodeClaim"
    ).items
    return {e.involved_object.name: e.message for e in got}


def test_a_gangs_probe_reads_fewer_than_n_from_nodeclaims_that_failed_for_capacity(
    spot_out,
) -> None:
    """N probe pods, no spot in the test cloud: Karpenter nominates them to a NodeClaim, whose
    launch fails for capacity (its real event, the NodeClaim deleted); the probe reads "fewer
    than N" from that, with the NodeClaim named."""
    c = spot_out
    b = backend(c)
    t0 = time.monotonic()
    probe = b.probe(TaskIdentity("gang_dag", "probe-ice", "manual__2026-01-01T00:00:00+00:00"))
    try:
        sig = until("probe answer", lambda: b.probe_signal(probe, time.time()))
        took = time.monotonic() - t0
        assert sig.up is False, sig
        assert f"0 of {N} probes placed" in sig.detail, sig
        assert f"fewer than {N}: 1 of 1 NodeClaims" in sig.detail, sig
        failed = ice_events(c.api)
        claim = next(name for name in failed if name in sig.detail)
        assert failed[claim].startswith(f"NodeClaim {claim} event: insufficient capacity"), failed
        assert "karpenter.sh/capacity-type=spot" in failed[claim]
        until("the NodeClaim deleted", lambda: claim not in {
            n["metadata"]["name"] for n in c.karpenter.nodeclaims()
        })  # fmt: skip
        print(f"\nprobe of {N}: 'fewer than {N}' {took:.1f} s after it was made ({sig.detail})")
    finally:
        b.drop_probe(probe)


def test_a_gated_spot_gang_reports_fewer_than_n_from_its_placeholders_nodeclaims(
    spot_out,
) -> None:
    """A spot gang waits behind its gate; its placeholders' NodeClaim fails for capacity, and
    the gang's status says so ("fewer than N" in ``evidence["capacity"]``) while it waits."""
    c = spot_out
    b = backend(c)
    ident = TaskIdentity("gang_dag", "gang-ice", "manual__2026-01-01T00:00:00+00:00")
    h = b.launch(ident, 1, "spot", ["sleep", "60"], checkpoint_uri="file:///tmp/x")
    try:

        def seen():
            st = b.status(h)
            return st if "capacity" in st.evidence else None

        st = until("the gang's capacity", seen)
        assert st.state is State.WAITING, st
        cap = st.evidence["capacity"]
        assert cap["up"] is False and cap["source"] == "karpenter", cap
        assert f"fewer than {N}" in cap["detail"] and f"{h.pod}-place-0" in cap["detail"], cap
    finally:
        b.cancel(h, wait_s=10)
