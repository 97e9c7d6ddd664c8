"""What the operator hands the control loop: its rendered arguments and the task instance's
identity, as frozen values (the loop never sees the operator, its templates or Airflow)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

# the task's identity travels down to the backends, so it is defined there (a public name here)
from airflow_spot.backends.base import TaskIdentity as TaskIdentity
from airflow_spot.exceptions import ConfigError

if TYPE_CHECKING:
    from airflow_spot.checkpoint.manifest import Manifest
    from airflow_spot.jobstate import JobState

MIN_STEPS_FOR_RATE = 10


@dataclass(frozen=True)
class JobArgs:
    """The operator's arguments once rendered and checked (see ``arguments.py``)."""

    command: tuple[str, ...]
    checkpoint_uri: str
    expected_compute: timedelta
    total_steps: int | None
    changeover: timedelta
    policy: str
    spot_price: float
    on_demand_price: float
    max_preemptions: int | None
    on_preemption_budget: str
    max_failures: int
    decision_interval: timedelta
    poll_interval: float
    lease_s: float | None = None  # each attempt's lease (None: attempts hold none)
    nodes: int = 1  # the gang's size: every node is billed (the prices above are per node)
    acquire_s: float = 0.0  # wall seconds to get the gang's on-demand nodes (the safety net's)
    # the attempt returns a result once its last step is saved (``@task.spot_training``): a job
    # whose work is all checkpointed waits for the attempt's own end instead of stopping it
    returns: bool = False

    @classmethod
    def of(cls, op: Any) -> JobArgs:
        """The rendered arguments of ``op`` (a SpotTrainingOperator), as values."""
        from airflow_spot.operators.defaults import lease_s

        return cls(
            command=cls.argv(op.command),
            checkpoint_uri=str(op.checkpoint_uri),
            expected_compute=op.expected_compute,
            total_steps=op.total_steps,
            changeover=op.changeover,
            policy=op.policy,
            spot_price=op.spot_price,
            on_demand_price=op.on_demand_price,
            max_preemptions=op.max_preemptions,
            on_preemption_budget=op.on_preemption_budget,
            max_failures=op.max_failures,
            decision_interval=op.decision_interval,
            poll_interval=op.poll_interval,
            lease_s=lease_s(op.lease, op.decision_interval, op.poll_interval),
            nodes=gang_size(op.nodes, op.backend),
            acquire_s=op.on_demand_acquire.total_seconds(),
            returns=bool(op.returns_result),
        )

    def to_dict(self) -> dict[str, object]:
        """JSON values, durations in seconds, the command left out (it is the DAG's, and may
        hold what the job state has no need of): what a process without the operator reads
        back with :meth:`from_dict` to report on the job (see ``operators/unwatched.py``)."""
        d: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            d[name] = v.total_seconds() if isinstance(v, timedelta) else v
        d.pop("command")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> JobArgs:
        durations = ("expected_compute", "changeover", "decision_interval")  # acquire_s: a float
        values = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in durations:
            values[k] = timedelta(seconds=float(values[k]))  # type: ignore[arg-type]
        return cls(command=(), **values)  # type: ignore[arg-type]

    @staticmethod
    def argv(command: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
        return tuple(shlex.split(command) if isinstance(command, str) else command or ())

    def total_steps_known(self, state: JobState, m: Manifest | None) -> int | None:
        """The job's total steps: the operator's, else the state's, else the checkpoint's; a
        checkpoint that disagrees with the operator is an error."""
        total = self.total_steps or state.total_steps
        if total and m is not None and m.total_steps and m.total_steps != total:
            raise ConfigError(
                "total_steps",
                f"the operator says {total} but the training script's checkpoints say "
                f"{m.total_steps} (checkpoint {m.name}); make them agree (the job would stop "
                "early or never count as done)",
            )
        return total or (m.total_steps if m else None)

    def seconds_per_step(self, state: JobState, total: int) -> float:
        """Market seconds per step: measured once enough steps ran, else from expected_compute."""
        steps, secs = state.throughput()
        if steps >= MIN_STEPS_FOR_RATE and secs > 0:
            return secs / steps
        return self.expected_compute.total_seconds() * state.time_scale / total


@dataclass(frozen=True)
class Progress:
    """What a look measured: steps done (checkpointed, or reported on on-demand), steps
    reported, the rate and the changeover, all in market seconds."""

    total: int
    done_steps: int
    reported: int
    sps: float
    changeover: float


def gang_size(nodes: int | None, backend: Any) -> int:
    """The job's gang size: ``nodes`` as given, else the backend's (``LocalBackend(nodes=N)``),
    else 1 (the arguments' check made sure the two agree)."""
    from airflow_spot.backends.base import RunsGangs

    if nodes is not None:
        return int(nodes)
    return int(backend.nodes) if isinstance(backend, RunsGangs) else 1


def prices_or_reference(
    spot: float | None, on_demand: float | None
) -> tuple[float, float, tuple[str, ...]]:
    """The prices, the benchmarks' reference ones where not given, and the names given."""
    from airflow_spot.policy.model import REFERENCE_ON_DEMAND_PRICE, REFERENCE_SPOT_PRICE

    given = tuple(
        n for n, v in (("spot_price", spot), ("on_demand_price", on_demand)) if v is not None
    )
    return (
        REFERENCE_SPOT_PRICE if spot is None else spot,
        REFERENCE_ON_DEMAND_PRICE if on_demand is None else on_demand,
        given,
    )
