"""Shared fixtures. Airflow's home and dags folder are set before anything imports airflow."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

_HOME = Path(tempfile.mkdtemp(prefix="airflow-spot-tests-"))
os.environ.setdefault("AIRFLOW_HOME", str(_HOME / "airflow_home"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(Path(__file__).parent / "dags"))
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# the in-process api-server signs its tokens with this (a session key, in memory only): the
# key Airflow would generate is 16 bytes, which PyJWT warns about for every token it signs
os.environ.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", os.urandom(32).hex())


def pytest_sessionfinish(session: object, exitstatus: object) -> None:
    """This session's Airflow home goes with it (every deployment and backend started under it
    is stopped by its fixture before this runs): a run leaves no folder behind in the temp dir."""
    shutil.rmtree(_HOME, ignore_errors=True)


def _plan_cache() -> Path:
    """The folder the tests' plans are kept in between runs (a cache outside the repository,
    as the Kubernetes binaries are): named by the solver's and the model's source, so that a
    change to either never reads a plan solved before it (the shape's key names the prior's
    numbers); the folders of other sources are removed. Tests that count solves use their own
    folder (tmp_path)."""
    import hashlib
    import shutil

    policy = Path(__file__).resolve().parents[1] / "airflow_spot" / "policy"
    source = b"".join((policy / f).read_bytes() for f in ("plan.py", "hazard.py"))
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "airflow-spot"
    here = base / "test-plans" / hashlib.sha256(source).hexdigest()[:16]
    try:
        here.mkdir(parents=True, exist_ok=True)
        for other in here.parent.iterdir():
            if other != here:
                shutil.rmtree(other, ignore_errors=True)
    except OSError:  # no home to write to: this session's own folder
        return _HOME / "plans"
    return here


os.environ.setdefault("AIRFLOW__SPOT_TRAINING__PLAN_CACHE", str(_plan_cache()))
# the tests' local checkpoint locations are temporary folders (tmp_path, mkdtemp)
os.environ.setdefault(
    "AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS",
    str(Path(tempfile.gettempdir()).resolve()),
)

REPO = Path(__file__).resolve().parents[1]

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

# the real Kubernetes control plane (issue 20): kube_control_plane / kube_cluster fixtures
pytest_plugins = ["airflow_spot.testing.cluster.pytest_plugin"]


def pytest_terminal_summary(terminalreporter) -> None:
    """The same line at the end, where ``pytest -q`` (``make test``) still shows it."""
    terminalreporter.write_line(pytest_report_header(None))


def pytest_report_header(config) -> str:  # noqa: ARG001 - pytest's signature
    """Name the real control plane's version (or say it is built on first use)."""
    from airflow_spot.testing.cluster.plane import bin_dir, missing_binaries

    where = bin_dir()
    if missing_binaries(where):
        return f"kubernetes: real control plane not built yet (tools/k8s/build.sh runs on first use; {where})"
    out = subprocess.run(
        [str(where / "kube-apiserver"), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    return f"kubernetes: kube-apiserver {out[-1] if out else '?'} (real control plane, {where})"


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata DB under this session's AIRFLOW_HOME (created once)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    if not (home / "airflow.db").exists():
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True
        )
    return home


@pytest.fixture(scope="session")
def preemptions_run(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One finished run of the preemptions DAG (tests/dags/spot_test_dags.py) under
    dag.test(), greedy on THREE_PREEMPTIONS_THEN_OUTAGE (spot up 1.5 h, down 10 min, three
    times; up 1 h; then down 5 h, forcing on-demand; then up): 5 market hours of compute, an
    8.5 h deadline, the market at half speed (900x, 0.1 s steps: at 1800x a loaded machine's
    process starts cost it its deadline). test_dag_runs checks the run and its model, test_plugin_api shows
    it: one run (~30 s), not one each. Its ``dag_id``, ``run_id``, ``state`` and ``dir``."""
    import importlib

    from airflow_spot.testing import THREE_PREEMPTIONS_THEN_OUTAGE, scripted_trace

    tmp = tmp_path_factory.mktemp("preemptions-run")
    env = {
        "SPOT_TEST_DIR": str(tmp),
        "SPOT_TEST_TRACE": str(scripted_trace(tmp / "market.json", THREE_PREEMPTIONS_THEN_OUTAGE)),
        "SPOT_TEST_SCALE": "900",
        "SPOT_TEST_STEP_S": "0.1",
        "SPOT_TEST_DEADLINE_S": "34",
        "SPOT_TEST_POLICY": "greedy",
        # the operator's guard keeps two polls of market time (900 s at 0.5 s): a look that
        # comes up to a second late (a stall under load: CI once saw 1.3 s between two looks
        # 0.6 s apart, at the last look before the fallback) still finds the slack it needs
        "SPOT_TEST_POLL_S": "0.5",
    }
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    sys.path.insert(0, str(REPO / "tests" / "dags"))
    try:
        dag = importlib.reload(importlib.import_module("spot_test_dags")).preemptions_dag
        dr = dag.test()
    finally:
        sys.path.pop(0)
        mp.undo()
    return {"dag_id": dag.dag_id, "run_id": dr.run_id, "state": dr.state, "dir": tmp}


@pytest.fixture(autouse=True)
def _time_limit(request):
    """No test may hang CI: each gets at most 240 s (SIGALRM raises in the main thread)."""
    import signal

    class TestTimeLimit(
        BaseException
    ):  # not an Exception: nothing in the code under test swallows it
        pass

    def on_alarm(signum, frame):  # noqa: ARG001
        raise TestTimeLimit(f"{request.node.nodeid} ran past its 240 s limit")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def _unfreeze_the_heap():
    """A trigger run here froze the test process's heap (triggers/base.py's gc.freeze, meant for
    a triggerer process): give it back to the collector after the test."""
    yield
    import gc

    if gc.get_freeze_count():
        gc.unfreeze()
