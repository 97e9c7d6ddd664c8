"""Fakes for tests, ours and our users': a task state store, a task instance, a context, a
scripted spot market, the bundled example training's command, and the modules an import
loads. No mocks: these are small working implementations."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class FileTaskStateStore:
    """A ``task_state_store`` kept in a JSON file, so that it outlives a (killed) process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _load(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._load().get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:  # noqa: ARG002
        doc = self._load()
        doc[key] = json.loads(json.dumps(value))  # JSON values only, as Airflow's store
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)

    def delete(self, key: str) -> None:
        doc = self._load()
        doc.pop(key, None)
        self.path.write_text(json.dumps(doc))


@dataclass
class FakeTaskInstance:
    dag_id: str = "dag"
    task_id: str = "train"
    run_id: str = "run"
    map_index: int = -1
    try_number: int = 1
    max_tries: int = 0  # Airflow's retries: tries left while try_number <= max_tries
    # other task instances' states, {run_id: {task_id: state}}, as Airflow's execution API
    # answers ``get_task_states`` (the dag.test() tests ask the real one)
    states: dict = field(default_factory=dict)

    def get_task_states(self, dag_id: str, **_: Any) -> dict:
        return self.states


def make_context(store: FileTaskStateStore, **ti: Any) -> dict[str, Any]:
    """The parts of an Airflow context the operator reads."""
    return {"task_state_store": store, "ti": FakeTaskInstance(**ti)}


def train_command(
    steps: int,
    *,
    step_seconds: float | None = None,
    save_every: int | None = None,
    seed: int | None = None,
) -> list[str]:
    """The command of the bundled example training (a numpy logistic regression that
    checkpoints through ``TrainingSession``), with the given options."""
    argv = [sys.executable, "-m", "airflow_spot.examples.train_logreg", "--steps", str(steps)]
    for flag, value in (
        ("--step-seconds", step_seconds),
        ("--save-every", save_every),
        ("--seed", seed),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def scripted_trace(
    path: str | Path,
    pattern: list[tuple[bool, int]],
    gap_s: int = 600,
    prices: list[tuple[float, int]] | None = None,
) -> Path:
    """Write a market trace (availability polarity) from ``[(spot_up, ticks), ...]`` and, if
    given, per-tick prices from ``[(price, ticks), ...]`` (the last price fills the rest)."""
    data = [1 if up else 0 for up, n in pattern for _ in range(n)]
    doc: dict[str, Any] = {
        "metadata": {"gap_seconds": gap_s, "note": "scripted test market"},
        "data": data,
    }
    if prices:
        series = [p for p, n in prices for _ in range(n)]
        doc["prices"] = (series + [series[-1]] * len(data))[: len(data)]
    p = Path(path)
    p.write_text(json.dumps(doc))
    return p


# spot up 1.5 h, down 10 min, three times; up 30 min; then down 5 h (a long outage forces
# on-demand); then up again. In availability ticks of 600 s, for scripted_trace(). Spot is up
# 5 h before the outage, so a job of 5 h or more can never finish on spot alone, however fast
# the machine (with 1 h in the fourth run a 5 h job did, once, on an idle machine at 900x)
THREE_PREEMPTIONS_THEN_OUTAGE: list[tuple[bool, int]] = [
    (True, 9),
    (False, 1),
    (True, 9),
    (False, 1),
    (True, 9),
    (False, 1),
    (True, 3),
    (False, 30),
    (True, 200),
]


def modules_loaded(statement: str, after: str = "") -> set[str]:
    """Modules a fresh interpreter loads to run ``statement`` (those that ``after``, run first,
    loaded are left out): what an import or a DAG parse costs."""
    code = (
        f"import sys\n{after}\nbefore = set(sys.modules)\n{statement}\n"
        "new = sorted(set(sys.modules) - before)\nimport json\nprint(json.dumps(new))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def job_args(**overrides: Any) -> Any:
    """The arguments of a small job (4 h of compute in 400 steps, greedy, spot $1 and
    on-demand $3 per hour), as the operator stores them: for tests of what reads a job's
    stored state (a summary, the UI's pages). ``overrides``: any :class:`JobArgs` field."""
    from datetime import timedelta

    from airflow_spot.operators.job import JobArgs

    fields: dict[str, Any] = {
        "command": ("true",),
        "checkpoint_uri": "file:///tmp/ckpt",
        "expected_compute": timedelta(hours=4),
        "total_steps": 400,
        "changeover": timedelta(minutes=6),
        "policy": "greedy",
        "spot_price": 1.0,
        "on_demand_price": 3.0,
        "max_preemptions": None,
        "on_preemption_budget": "fallback",
        "max_failures": 3,
        "decision_interval": timedelta(minutes=5),
        "poll_interval": 30.0,
    }
    return JobArgs(**{**fields, **overrides})
