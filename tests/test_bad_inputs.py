"""Bad inputs, one table: each is built for real (an operator argument, a backend setting, a
file on disk, a trace, a manifest, a kubeconfig) and refused with the project's error, naming
the field and the fix, while everything that existed before (two valid checkpoints, the task's
state) is left as it was.

``SPOT_BAD_INPUTS_TABLE=1 pytest -q -s tests/test_bad_inputs.py`` prints the table
(``benchmarks/bad_inputs.py`` does).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubePool, KubernetesBackend
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.market import Pool
from airflow_spot.checkpoint import Checkpoints, open_store
from airflow_spot.durations import parse_hours
from airflow_spot.exceptions import (
    BackendError,
    CheckpointError,
    ConfigError,
    InvalidJobSpec,
    TraceFormatError,
    UnknownPolicy,
)
from airflow_spot.jobstate import AttemptHandle
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.policy import JobSpec, get_policy
from airflow_spot.sensors.checkpoint import CheckpointSensor
from airflow_spot.simulate.engine import replay
from airflow_spot.simulate.traces import load_trace, load_traces
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

MODEL = {10: b"weights at step 10", 20: b"weights at step 20"}  # the valid checkpoints
BAD = "ckpt-000000000030"  # the newest checkpoint, bad in the resume rows
IDENT = TaskIdentity("dag", "train", "r1")
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: default}}}}]
current-context: x
"""
TABLE: list[tuple[str, str, str, bool]] = []  # (input, field, first line, clear), as run


@dataclass(frozen=True)
class Case:
    """One bad input: ``act(tmp)`` builds it and does what a user would (parse the DAG, start
    the task, launch, resume) and must raise ``error`` naming ``field`` with ``fix``
    (in the message or in what the act logged); ``setup(tmp)`` adds to what must survive."""

    input: str
    given: str
    field: str
    fix: str
    act: Callable[[Path], Any]
    error: type[Exception] = ConfigError
    setup: Callable[[Path], Any] | None = None


# -- builders ---------------------------------------------------------------------------------
def _ok(tmp: Path) -> dict[str, Any]:
    return dict(
        task_id="train",
        command=["python", "train.py"],
        checkpoint_uri=str(tmp / "ckpt"),
        expected_compute=timedelta(hours=4),
        total_steps=40,
        deadline=timedelta(hours=6),
        backend=LocalBackend(work_dir=str(tmp / "runs")),
    )


def _parse(**changes: Any) -> Callable[[Path], Any]:
    """The operator as the DAG file builds it (Airflow's DAG parsing)."""
    return lambda tmp: SpotTrainingOperator(**{**_ok(tmp), **changes})


def _start(**changes: Any) -> Callable[[Path], Any]:
    """The operator's first try (Airflow's ``execute``): refused before any job or attempt."""

    def act(tmp: Path) -> None:
        store = FileTaskStateStore(tmp / "task_state.json")
        try:
            SpotTrainingOperator(**{**_ok(tmp), **changes}).execute(make_context(store))
        finally:
            assert store.get(STATE_KEY) is None, "a job was recorded"
            assert not any((tmp / "runs").glob("*")), "an attempt was launched"

    return act


def _local(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: LocalBackend(**kw)


def _kube(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: KubernetesBackend(image="ghcr.io/me/train:1", **kw)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: nothing listens there


def _dead_kubeconfig(tmp: Path) -> str:
    path = tmp / "kubeconfig"
    path.write_text(KUBECONFIG.format(server=f"https://127.0.0.1:{_closed_port()}"))
    return str(path)


def _launch(**kw: Any) -> Callable[[Path], Any]:
    """A spot attempt launched on a KubernetesBackend whose kubeconfig names a dead server."""

    def act(tmp: Path) -> Any:
        given = {"config_file": _dead_kubeconfig(tmp), **kw}
        settings = {k: v(tmp) if callable(v) else v for k, v in given.items()}
        backend = KubernetesBackend(image="img", **settings)
        return backend.launch(IDENT, 1, "spot", ["python", "train.py"], checkpoint_uri="s3://b/c")

    return act


def _status_on_dead_server(tmp: Path) -> Any:
    backend = KubernetesBackend(image="img", config_file=_dead_kubeconfig(tmp))
    handle = AttemptHandle(launched_at=0.0, kind="kubernetes", attempt=1, capacity="spot")
    handle.namespace, handle.pod = "default", "dag-train-a1"
    return backend.status(handle)


def _template_file(tmp: Path) -> str:
    path = tmp / "template.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: trainer}\n")
    return str(path)


def _trace_file(text: str) -> Callable[[Path], Any]:
    def act(tmp: Path) -> Any:
        (tmp / "trace.json").write_text(text)
        return load_traces([tmp / "trace.json"], polarity="available")

    return act


def _malformed_trace_at_start(tmp: Path) -> None:
    (tmp / "market.json").write_text('{"metadata": {"gap_seconds": 600}, "data": [1, 1, 0')
    _start(backend=LocalBackend(trace=str(tmp / "market.json"), work_dir=str(tmp / "runs")))(tmp)


def _outside_roots(tmp: Path) -> None:
    """A rendered path (from dag_run.conf) to existing checkpoints outside the allowed local
    roots: refused when the task starts, before a claim, an attempt or retention touches it."""
    name = "AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS"
    before = os.environ.get(name)
    os.environ[name] = str(tmp / "allowed")
    try:
        _start()(tmp)
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before
    assert not list((tmp / "ckpt").glob("job-owner*")), "the location was claimed"


def _replay(**kw: Any) -> Callable[[Path], Any]:
    def act(tmp: Path) -> Any:
        trace = load_trace(scripted_trace(tmp / "t.json", [(True, 50)]), polarity="available")
        job = JobSpec(work_s=4 * 3600.0, deadline_s=6 * 3600.0)
        return replay(get_policy("deadline_aware"), trace, job, **kw)

    return act


# -- checkpoints: two valid ones always, a bad newest one for the resume rows ---------------
def _save_valid(tmp: Path) -> None:
    ckpts = Checkpoints(open_store(str(tmp / "ckpt")))
    for step, data in MODEL.items():
        ckpts.save(step, {"model.bin": data}, now=1_000.0 + step, total_steps=40)


def _bad_newest(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """Save step 30, then make its manifest say something untrue (``change`` edits it)."""

    def setup(tmp: Path) -> None:
        Checkpoints(open_store(str(tmp / "ckpt")), keep=10).save(
            30, {"model.bin": b"weights at step 30"}, now=1_030.0, total_steps=40
        )
        path = tmp / "ckpt" / BAD / "MANIFEST.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))

    return setup


def _lie_about_hash(doc: dict[str, Any]) -> None:
    doc["files"]["model.bin"]["sha256"] = hashlib.sha256(b"other weights").hexdigest()


def _escape_folder(doc: dict[str, Any]) -> None:
    doc["files"] = {"../../outside.bin": doc["files"]["model.bin"]}


def _resume_falls_back(tmp: Path) -> None:
    """The resume skips the bad newest checkpoint for step 20; then what it skipped for."""
    ckpts = Checkpoints(open_store(str(tmp / "ckpt")))
    manifest, files = ckpts.load_latest() or (None, None)
    assert manifest is not None and manifest.step == 20 and files == {"model.bin": MODEL[20]}
    ckpts.verify(BAD)


# -- the table ----------------------------------------------------------------------------
SOON = timedelta(hours=6)
CASES = [
    Case("a deadline shorter than the expected compute", "deadline=timedelta(hours=3)", "deadline", "move the deadline later or cut the work", _parse(deadline=timedelta(hours=3))),
    Case("a deadline in the past", "deadline=datetime(2020, 1, 1, tzinfo=UTC), at task start", "deadline", "give a later deadline", _start(deadline=datetime(2020, 1, 1, tzinfo=UTC))),
    Case("a duration string that is not one", "deadline='6 hours'", "deadline", "a duration like '6h'", _parse(deadline="6 hours")),
    Case("a duration without a unit", "deadline='3600'", "deadline", "write e.g. '3600h' or '3600s'", _parse(deadline="3600")),
    Case("a duration string on the command line", "--work 48x (durations.parse_hours)", "--work", "write e.g. 48h, 90m, 600s or 2d", lambda tmp: parse_hours("48x", "--work")),
    Case("an unknown policy", "policy='cheapest'", "policy", "deadline_aware", _parse(policy="cheapest"), UnknownPolicy),
    Case("an unknown policy prior", "policy='deadline_aware@mars'", "policy", "aws-p3", _parse(policy="deadline_aware@mars"), UnknownPolicy),
    Case("a zero decision interval", "decision_interval=timedelta(0)", "decision_interval", "at least 0.1 s", _parse(decision_interval=timedelta(0))),
    Case("a negative decision interval", "decision_interval=timedelta(minutes=-1)", "decision_interval", "at least 0.1 s", _parse(decision_interval=timedelta(minutes=-1))),
    Case("a zero poll interval", "poll_interval=0", "poll_interval", "seconds >= 0.01", _parse(poll_interval=0)),
    Case("a negative min_deferral", "min_deferral=timedelta(seconds=-30)", "min_deferral", "timedelta >= 0", _parse(min_deferral=timedelta(seconds=-30))),
    Case("a negative changeover", "changeover=timedelta(minutes=-5)", "changeover", "timedelta >= 0", _parse(changeover=timedelta(minutes=-5))),
    Case("a free on-demand price", "on_demand_price=0", "on_demand_price", "price per hour > 0", _parse(on_demand_price=0)),
    Case("a negative preemption budget", "max_preemptions=-1", "max_preemptions", "integer >= 0", _parse(max_preemptions=-1)),
    Case("an unknown budget action", "on_preemption_budget='retry'", "on_preemption_budget", "('on_demand', 'fail')", _parse(on_preemption_budget="retry")),
    Case("an unknown backend", "backend='mars'", "backend", "use 'local', LocalBackend(...)", _parse(backend="mars")),
    Case("a checkpoint URI that escapes its prefix", "checkpoint_uri='s3://bucket/ckpt/../other'", "checkpoint_uri", "must not contain '.' or '..'", _parse(checkpoint_uri="s3://bucket/ckpt/../other")),
    Case("a local checkpoint path that steps out with '..'", "checkpoint_uri='/data/ckpt/../other'", "checkpoint_uri", "must not contain '..'", _parse(checkpoint_uri="/data/ckpt/../other")),
    Case("a checkpoint path outside the allowed local roots", "checkpoint_uri=<rendered: a folder outside them>, at task start", "checkpoint_uri", "AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS", _outside_roots),
    Case("a relative checkpoint path for pods", "checkpoint_uri='ckpt/run', KubernetesBackend", "checkpoint_uri", "use s3://bucket/prefix", _parse(checkpoint_uri="ckpt/run", backend=KubernetesBackend(image="img"))),
    Case("a malformed trace file", "LocalBackend(trace='market.json'), at task start", "trace", '{"metadata": {"gap_seconds": ...}, "data": [...]}', _malformed_trace_at_start, TraceFormatError),
    Case("a trace of text, not numbers", "airflow-spot simulate trace.json (load_traces)", "trace", "list of whole numbers >= 0", _trace_file('{"metadata": {"gap_seconds": 600}, "data": ["up", "down"]}'), TraceFormatError),
    Case("a zero time scale", "LocalBackend(time_scale=0)", "backend.time_scale", "must be > 0", _local(time_scale=0)),
    Case("an unknown observe mode", "LocalBackend(observe='psychic')", "backend.observe", "must be 'cluster'", _local(observe="psychic")),
    Case("an unknown trace polarity", "LocalBackend(polarity='up')", "backend.polarity", "must be 'available'", _local(polarity="up")),
    Case("a negative notice", "LocalBackend(notice_s=-1)", "backend.notice_s", "number >= 0", _local(notice_s=-1)),
    Case("two pools of one name", "LocalBackend(pools=(Pool('a', ...), Pool('a', ...)))", "backend.pools", "must be unique", _local(pools=(Pool("a", "x.json"), Pool("a", "y.json")))),
    Case("a negative pool price", "LocalBackend(pools=(Pool('a', ..., spot_price=-1),))", "backend.pools", "spot_price must be a price per hour >= 0", _local(pools=(Pool("a", "x.json", spot_price=-1.0),))),
    Case("a pool price source without a zone", "KubePool('a', ..., price_from={'instance_type': ...})", "backend.pools[a].price_from", '"zone": "us-east-1a"', lambda tmp: KubePool("a", Placement(), price_from={"instance_type": "p3.2xlarge"})),
    Case("a bad pool name", "KubePool('Zone_A', ...)", "backend.pools", "short lowercase name", lambda tmp: KubePool("Zone_A", Placement())),
    Case("an unknown preset", "KubernetesBackend(preset='azure')", "backend.preset", "use one of eks, karpenter, gke, aks", _kube(preset="azure")),
    Case("a bad capacity name in a custom preset", "preset={'spot': ..., 'ondemand': ...}", "backend.preset", "give both 'spot' and 'on_demand'", _kube(preset={"spot": Placement(), "ondemand": Placement()})),
    Case("a bad map of placements", "Placement(tolerations=({'opertor': 'Exists'},))", "placement.tolerations", "unknown field(s) ['opertor']", lambda tmp: Placement({"pool": "a"}, ({"key": "gpu", "opertor": "Exists"},))),
    Case("a memory quantity in the wrong unit", "resources={'limits': {'memory': '64Gb'}}", "backend.resources", "e.g. '64Gi'", _kube(resources={"limits": {"memory": "64Gb"}})),
    Case("a fraction of a GPU", "KubernetesBackend(gpus=1.5)", "backend.gpus", "whole number >= 0", _kube(gpus=1.5)),
    Case("a zero pending timeout", "KubernetesBackend(pending_timeout_s=0)", "backend.pending_timeout_s", "seconds > 0", _kube(pending_timeout_s=0)),
    Case("a pod template that is not a pod", "pod_template={'kind': 'Deployment', ...}", "backend.pod_template", "must be a Pod", _kube(pod_template={"kind": "Deployment", "spec": {}})),
    Case("a privileged pod template", "pod_template={'spec': {'containers': [{'securityContext': {'privileged': True}}]}}", "backend.pod_template.spec.containers[0].securityContext.privileged", "allow_privileged=True", _kube(pod_template={"spec": {"containers": [{"name": "train", "securityContext": {"privileged": True}}]}})),
    Case("a pod template file that is not a pod", "pod_template='template.yaml', at launch", "backend.pod_template", "must be a Pod", _launch(pod_template=_template_file)),
    Case("a Kubernetes connection to a dead address", "kubeconfig server https://127.0.0.1:<closed>, launch", "backend.config_file", "check that the API server is up", _launch(), BackendError),
    Case("a dead address while watching", "kubeconfig server https://127.0.0.1:<closed>, status", "backend.config_file", "check that the API server is up", _status_on_dead_server, BackendError),
    Case("a kubeconfig that does not exist", "config_file='no-such-kubeconfig', at launch", "backend.config_file", "a kubeconfig the worker can read", _launch(config_file=lambda tmp: str(tmp / "no-such-kubeconfig"))),
    Case("an Airflow connection that does not exist", "kubernetes_conn_id='k8s_nowhere', at launch", "backend.kubernetes_conn_id", "create that Airflow connection", _launch(kubernetes_conn_id="k8s_nowhere", config_file=None)),
    Case("a manifest that lies about its hashes", "MANIFEST.json of the newest checkpoint, at resume", "sha256", "trying the one before it", _resume_falls_back, CheckpointError, _bad_newest(_lie_about_hash)),
    Case("a manifest naming a file outside its checkpoint", "MANIFEST.json files: '../../outside.bin', at resume", "checkpoint key '../../outside.bin'", "only relative paths", _resume_falls_back, CheckpointError, _bad_newest(_escape_folder)),
    Case("a probe budget of 0 (the probe hold)", "replay(..., probe_hold_s=0), as --probe-hold 0", "probe_hold_s", "seconds > 0", _replay(probe_hold_s=0.0)),
    Case("an unknown observe mode in the simulator", "replay(..., observe='psychic')", "observe", "choose one of cluster, oracle", _replay(observe="psychic")),
    Case("a changeover given as text", "JobSpec(changeover_s='5m')", "changeover_s", ">= 0 seconds", lambda tmp: JobSpec(work_s=3600.0, deadline_s=7200.0, changeover_s="5m"), InvalidJobSpec),  # type: ignore[arg-type]
    Case("a negative step to wait for", "CheckpointSensor(min_step=-1)", "min_step", "integer >= 0", lambda tmp: CheckpointSensor(task_id="wait", checkpoint_uri=str(tmp / "ckpt"), min_step=-1)),
    Case("an environment value that is not a string", "LocalBackend(extra_env={'SEED': 1})", "backend.extra_env", 'give {"NAME": "value"}', _local(extra_env={"SEED": 1})),
]  # fmt: skip


# -- the test -------------------------------------------------------------------------------
def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _judge(case: Case, tmp: Path) -> tuple[str, list[str]]:
    """(the error's first line, what is wrong with it: nothing for a clear refusal)."""
    _save_valid(tmp)
    if case.setup is not None:
        case.setup(tmp)
    before = _files(tmp)
    logged, logger = _Logged(), logging.getLogger("airflow_spot")
    logger.addHandler(logged)
    try:
        case.act(tmp)
    except Exception as e:  # noqa: BLE001 - judged below
        error: Exception | None = e
    else:
        error = None
    finally:
        logger.removeHandler(logged)
    text = str(error) if error is not None else ""
    problems = []
    if not isinstance(error, case.error):
        problems.append(f"expected {case.error.__name__}, got {type(error).__name__}: {text!r}")
    if case.field not in text:
        problems.append(f"the message does not name {case.field!r}")
    if isinstance(error, ConfigError) and not text.startswith(f"{error.field}: "):
        problems.append(f"the message does not begin with its field {error.field!r}")
    if case.fix not in text and not any(case.fix in line for line in logged.lines):
        problems.append(f"the message does not say the fix ({case.fix!r})")
    after = _files(tmp)
    lost = sorted(k for k, digest in before.items() if after.get(k) != digest)
    if lost:
        problems.append(f"lost or changed: {lost}")
    return (text.splitlines()[0] if text else "(accepted)"), problems


@pytest.fixture(scope="module", autouse=True)
def _print_table() -> Iterator[None]:
    """With SPOT_BAD_INPUTS_TABLE set, print the table once every row ran."""
    yield
    if not os.environ.get("SPOT_BAD_INPUTS_TABLE"):
        return
    cell = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["", "| input | field named | error (first line) |", "|---|---|---|"]
    lines += [f"| {cell(i)} | {cell(f)} | {cell(e)} |" for i, f, e, _ in TABLE]
    lines.append(f"bad inputs: {len(TABLE)} rows, {sum(ok for *_, ok in TABLE)} clear")
    print("\n".join(lines), flush=True)


@pytest.mark.parametrize("case", CASES, ids=[c.input for c in CASES])
def test_a_bad_input_is_refused_naming_its_field_and_losing_nothing(
    case: Case, tmp_path: Path
) -> None:
    """The input is refused with the project's error, which names its field and the fix, and
    every file that existed before (two valid checkpoints, a bad newer one) is unchanged."""
    first, problems = _judge(case, tmp_path)
    first = first.replace(str(tmp_path), "<tmp>")
    TABLE.append((f"{case.input}: {case.given}", case.field, first, not problems))
    assert not problems, "; ".join(problems)


def test_the_table_has_at_least_20_rows_of_distinct_inputs() -> None:
    """Issue 21's bar: at least 20 bad inputs, none of them twice."""
    assert len(CASES) >= 20
    assert len({c.input for c in CASES}) == len(CASES)
