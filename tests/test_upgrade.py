"""What an earlier version wrote where it outlives the version (the task state store, the
checkpoint location, Airflow's trigger table) is still read by this one.

The fixtures under ``tests/fixtures/upgrade/`` were captured from real runs and objects of the
revision named in its ``CAPTURED.json`` by ``capture.py`` there; never regenerate them from the
version under test. No DAG runs here: each test reads files."""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
RUNS = ["local_run", "kubernetes_run"]
JOBSTATES = [
    f"{run}/{name}.json" for run in RUNS for name in ("jobstate_live", "jobstate_finished")
]
ATTEMPT_FIELDS = (
    "attempt",
    "capacity",
    "launched_at",
    "granted_at",
    "started_at",
    "ended_at",
    "outcome",
    "reason",
    "exit_code",
    "step_start",
    "step_end",
    "ckpt_step_end",
    "price",
    "pool",
    "prices",
)
# fields stored under another name by 0.1.0: new name -> old name
RENAMED = {"granted_at": "launch_began_at"}
JOB_FIELDS = (
    "started_at",
    "deadline_at",
    "time_scale",
    "total_steps",
    "market",
    "current",
    "preemptions",
    "failures",
    "infra_disruptions",
    "spot_down_s",
    "decisions",
    "decisions_dropped",
    "finished",
    "failed",
)


def _load(rel: str) -> Any:
    return json.loads((FIXTURES / rel).read_text())


def _set(handle: dict[str, Any]) -> dict[str, Any]:
    """A handle's keys that hold something (a key stored as None reads as one left out)."""
    return {k: v for k, v in handle.items() if v is not None}


def test_the_fixtures_come_from_a_recorded_revision():
    meta = _load("CAPTURED.json")
    assert meta["revision"] and meta["local_run"]["attempts"] and meta["kubernetes_run"]["attempts"]


# -- the job state in the task state store ---------------------------------------------------


@pytest.mark.parametrize("rel", JOBSTATES)
def test_stored_job_state_loads_and_round_trips(rel: str):
    from airflow_spot.jobstate import JobState

    stored = _load(rel)
    state = JobState.from_dict(copy.deepcopy(stored))
    again = state.to_dict()
    for name in JOB_FIELDS:
        assert again[name] == stored[name], name
    assert len(state.attempts) == len(stored["attempts"]) >= 3
    for old, new in zip(stored["attempts"], again["attempts"], strict=True):
        for name in ATTEMPT_FIELDS:
            was = old[RENAMED.get(name, name)] if RENAMED.get(name) in old else old[name]
            assert new[name] == was, (old["attempt"], name)
        # every key of the stored handle survives (a backend reads them back: run_dir, pod,
        # node, notice, ...)
        assert _set(new["handle"]) == _set(old["handle"]), old["attempt"]
    # and what this version writes it reads back unchanged
    assert JobState.from_dict(copy.deepcopy(again)).to_dict() == again


@pytest.mark.parametrize("run", RUNS)
def test_a_live_attempt_is_found_again(run: str):
    """A task deferred by the old version resumes on its live attempt."""
    from airflow_spot.jobstate import JobState

    stored = _load(f"{run}/jobstate_live.json")
    state = JobState.from_dict(copy.deepcopy(stored))
    assert stored["current"] is not None and state.live is not None
    assert state.live.attempt == stored["attempts"][stored["current"]]["attempt"]
    assert state.live.outcome is None and state.finished is None
    handle = state.to_dict()["attempts"][state.current]["handle"]
    key = "run_dir" if run == "local_run" else "pod"
    assert handle[key] == stored["attempts"][stored["current"]]["handle"][key]


@pytest.mark.parametrize("run", RUNS)
def test_a_finished_job_keeps_its_summary(run: str):
    from airflow_spot.jobstate import JobState

    stored = _load(f"{run}/jobstate_finished.json")
    state = JobState.from_dict(copy.deepcopy(stored))
    assert state.live is None and state.finished == stored["finished"]
    assert state.finished["deadline_met"] is True
    preempted = sum(a.outcome == "preempted" for a in state.attempts)
    assert state.preemptions == state.finished["preemptions"] == preempted >= 2
    assert state.decisions and state.decisions == stored["decisions"]


# -- the checkpoint location -----------------------------------------------------------------


def _location(tmp_path: Path, rel: str) -> Path:
    """A copy of a stored location (a reader may write: a claim, a resume stage)."""
    dst = tmp_path / "location"
    shutil.copytree(FIXTURES / rel, dst)
    return dst


MANIFESTS = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("*/**/ckpt-*/MANIFEST.json"))


def test_every_manifest_is_tested():
    assert len(MANIFESTS) == 7  # three per run's location, one saved directly


@pytest.mark.parametrize("rel", MANIFESTS)
def test_stored_manifest_reads(rel: str):
    from airflow_spot.checkpoint.manifest import Manifest, checkpoint_name

    raw = (FIXTURES / rel).read_bytes()
    stored = json.loads(raw)
    m = Manifest.from_json(raw)
    assert m.step == stored["step"] and m.total_steps == stored["total_steps"]
    assert m.created == stored["created"] and m.metrics == stored["metrics"]
    assert m.extra == stored["extra"] and m.tags == stored["tags"]
    assert {k: (e.sha256, e.size) for k, e in m.files.items()} == {
        k: (v["sha256"], v["size"]) for k, v in stored["files"].items()
    }
    assert m.name == checkpoint_name(m.step) == Path(rel).parent.name
    assert json.loads(m.to_json()) == stored  # this version writes it the same way


@pytest.mark.parametrize("rel", ["local_run/location", "kubernetes_run/location"])
def test_stored_checkpoints_verify_and_load(tmp_path: Path, rel: str):
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store

    ckpts = Checkpoints(open_store(str(_location(tmp_path, rel))))
    latest = ckpts.latest_valid()
    assert latest is not None and latest.step == latest.total_steps == 200
    for name in ckpts.manifests():
        ckpts.verify(name)
    found = ckpts.load_latest()
    assert found is not None and set(found[1]) == {"weights.npy"}


def test_a_directly_saved_checkpoint_loads(tmp_path: Path):
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store

    ckpts = Checkpoints(open_store(str(_location(tmp_path, "checkpoint_direct"))))
    m = ckpts.latest_valid()
    assert m is not None and (m.step, m.total_steps) == (40, 100)
    assert m.metrics == {"loss": 0.25, "accuracy": 0.875} and m.extra["epoch"] == 2
    files = ckpts.load(m)
    assert files["state/optimizer.json"] == b'{"lr": 0.01, "momentum": 0.9}'
    assert files["weights.bin"] == bytes(range(256)) * 4


def _owner_records(run: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(job-owner.json, the run's claim key, its record) of a stored location."""
    location = FIXTURES / run / "location"
    owner = json.loads((location / "job-owner.json").read_text())
    (claim,) = [p for p in location.glob("job-owner-*.json")]
    return owner, claim.name, json.loads(claim.read_text())


@pytest.mark.parametrize("run", RUNS)
def test_stored_owner_records_are_read(tmp_path: Path, run: str):
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store

    owner, claim, record = _owner_records(run)
    assert set(owner) == {"dag_id", "task_id", "run_id", "map_index"} and owner == record
    ckpts = Checkpoints(open_store(str(_location(tmp_path, f"{run}/location"))))
    assert ckpts.owner() == owner
    assert ckpts.owner(claim) == record
    # a claim already made is found, not made again
    assert ckpts.claim({**owner, "map_index": 3}, claim) == record


@pytest.mark.parametrize("run", RUNS)
def test_the_location_claim_honours_stored_records(tmp_path: Path, run: str):
    """The operator's claim reads the records the old version wrote: the same task instance
    goes on (its work is complete here, so a new job is told there is nothing to train);
    another map index of the same run is refused; another run names the old owner."""
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.stores import open_store
    from airflow_spot.exceptions import ConfigError
    from airflow_spot.operators.location import claim_location
    from airflow_spot.testing import FakeTaskInstance

    owner, _, _ = _owner_records(run)
    uri = str(_location(tmp_path, f"{run}/location"))
    ckpts = Checkpoints.watching(open_store(uri))
    log = logging.getLogger("test_upgrade")
    with pytest.raises(ConfigError, match="already used by map index -1"):
        claim_location(ckpts, FakeTaskInstance(**{**owner, "map_index": 0}), uri, 200, log)
    other = FakeTaskInstance(**{**owner, "run_id": "manual__later"})
    with pytest.raises(ConfigError, match=f"complete checkpoint.*{owner['dag_id']}"):
        claim_location(ckpts, other, uri, 200, log)
    with pytest.raises(ConfigError, match="complete checkpoint"):  # not "in use": it is done
        claim_location(ckpts, FakeTaskInstance(**owner), uri, 200, log)


# -- triggers stored in Airflow's trigger table ----------------------------------------------


def _stored_triggers() -> list[tuple[str, dict[str, Any]]]:
    out = [(name, t) for name, t in sorted(_load("triggers.json").items())]
    for run in RUNS:
        t = _load(f"{run}/trigger_live.json")
        out.append((f"{run}/trigger_live", {**t, "serializes_as": t["classpath"]}))
    return out


TRIGGERS = _stored_triggers()


def _import_string(path: str) -> Any:
    """How the triggerer imports a stored class path (Airflow 3.3 moved the helper there from
    airflow.utils.module_loading); importlib where neither is found."""
    try:
        from airflow._shared.module_loading import import_string
    except ImportError:  # pragma: no cover - another Airflow
        try:
            from airflow.utils.module_loading import import_string
        except ImportError:
            import importlib

            module, _, name = path.rpartition(".")
            return getattr(importlib.import_module(module), name)
    return import_string(path)


def test_every_trigger_kind_is_stored():
    names = {name for name, _ in TRIGGERS}
    assert {
        "LocalAttemptTrigger",
        "KubernetesAttemptTrigger",
        "SpotPriceTrigger",
        "CheckpointTrigger",
        "LocalAttemptTrigger/stored_by_0.1.0",
        "KubernetesAttemptTrigger/stored_by_0.1.0",
    } <= names


@pytest.mark.parametrize(("name", "stored"), TRIGGERS, ids=[n for n, _ in TRIGGERS])
def test_stored_trigger_is_rebuilt(name: str, stored: dict[str, Any]):
    """The triggerer imports the stored class path and calls it with the stored kwargs; the
    trigger keeps every kwarg it was given, and serializes to a class path (0.1.0's own, or
    AttemptTrigger for the attempt triggers) that rebuilds it."""
    cls = _import_string(stored["classpath"])
    trigger = cls(**copy.deepcopy(stored["kwargs"]))
    path, kwargs = trigger.serialize()
    assert path in (stored["classpath"], "airflow_spot.triggers.attempt.AttemptTrigger")
    for key, value in stored["kwargs"].items():
        assert kwargs[key] == value, key
    json.dumps(kwargs)  # still plain JSON
    assert _import_string(path)(**copy.deepcopy(kwargs)).serialize() == (path, kwargs)
