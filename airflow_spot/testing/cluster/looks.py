"""Looking at an attempt on the test cluster the way the operator does, until something holds:
``status()``, then ``carry_out()`` of what is due (a notice relayed, a pod given up)."""

from __future__ import annotations

import time
from typing import Any

from airflow_spot.backends.base import AttemptStatus, State


def look(backend: Any, handle: Any) -> AttemptStatus:
    """One look: the attempt's status, and what it found due carried out."""
    st = backend.status(handle)
    backend.carry_out(handle, st)
    return st


def wait_running(backend: Any, handle: Any, timeout: float = 60.0, every: float = 0.2) -> str:
    """Look until the attempt runs (an AssertionError if it ends first or never runs); the
    name of its pod's node."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        st = look(backend, handle)
        if st.state is State.RUNNING:
            pod = backend.api.core.read_namespaced_pod(handle.pod, backend.namespace)
            return pod.spec.node_name
        assert not st.terminal, st
        time.sleep(every)
    raise AssertionError(f"the attempt never ran in {timeout} s")


def wait_ended(
    backend: Any, handle: Any, timeout: float = 60.0, every: float = 0.25
) -> AttemptStatus:
    """Look until the attempt has its verdict (an AssertionError after ``timeout``)."""
    until = time.monotonic() + timeout
    st = None
    while time.monotonic() < until:
        st = look(backend, handle)
        if st.terminal:
            return st
        time.sleep(every)
    raise AssertionError(f"no verdict in {timeout} s; last: {st}")
