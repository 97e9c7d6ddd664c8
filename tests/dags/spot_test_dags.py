"""DAGs the operator tests run with dag.test(); each reads its set-up from the environment."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.testing import train_command

ROOT = os.environ.get("SPOT_TEST_DIR", "/tmp/airflow-spot-test")
TRACE = os.environ.get("SPOT_TEST_TRACE", "bundled:cant-be-late/us-west-2a_v100_1/8.json")
STEPS = int(os.environ.get("SPOT_TEST_STEPS", "200"))
SCALE = float(os.environ.get("SPOT_TEST_SCALE", "1800"))
STEP_S = float(os.environ.get("SPOT_TEST_STEP_S", "0.05"))  # wall seconds a training step
START = datetime(2026, 1, 1, tzinfo=UTC)


def _train(steps: int, seed: int = 7) -> list[str]:
    return train_command(steps, step_seconds=STEP_S, save_every=5, seed=seed)


with DAG(
    "spot_test_preemptions", schedule=None, start_date=START, catchup=False
) as preemptions_dag:
    SpotTrainingOperator(
        task_id="train",
        command=_train(STEPS),
        checkpoint_uri=ROOT + "/ckpt/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        expected_compute=timedelta(seconds=STEPS * STEP_S),
        total_steps=STEPS,
        deadline=timedelta(seconds=float(os.environ.get("SPOT_TEST_DEADLINE_S", "17"))),
        changeover=timedelta(seconds=0.1),
        policy=os.environ.get("SPOT_TEST_POLICY", "deadline_aware"),
        max_failures=0,
        backend=LocalBackend(
            trace=TRACE,
            polarity="available",
            time_scale=SCALE,
            work_dir=ROOT + "/runs",
            notice_s=0.1,
            grace_s=2.0,
            observe=os.environ.get("SPOT_TEST_OBSERVE", "cluster"),
        ),
        decision_interval=timedelta(seconds=0.5),
        # the guard keeps two polls: a longer poll lets a run at 900x ride out a look that
        # comes a second late on a loaded machine (tests/conftest.py's preemptions_run)
        poll_interval=float(os.environ.get("SPOT_TEST_POLL_S", "0.05")),
        min_deferral=timedelta(0),  # the tests exercise the trigger path
    )

with DAG("spot_test_failures", schedule=None, start_date=START, catchup=False) as failures_dag:
    SpotTrainingOperator(
        task_id="train",
        command=[
            sys.executable,
            "-c",
            "import sys; print('boom: bad hyper-parameter'); sys.exit(3)",
        ],
        checkpoint_uri=ROOT + "/ckpt-fail",
        expected_compute=timedelta(seconds=5),
        total_steps=10,
        deadline=timedelta(seconds=60),
        changeover=timedelta(seconds=0.1),
        max_failures=1,
        max_preemptions=5,
        backend=LocalBackend(
            trace=TRACE, polarity="available", time_scale=3600.0, work_dir=ROOT + "/runs"
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.05,
        min_deferral=timedelta(0),  # the tests exercise the trigger path
    )

with DAG("spot_test_mapped", schedule=None, start_date=START, catchup=False) as mapped_dag:
    SpotTrainingOperator.partial(
        task_id="train",
        checkpoint_uri=ROOT + os.environ.get("SPOT_TEST_MAPPED_URI", "/mapped/{{ ti.map_index }}"),
        expected_compute=timedelta(seconds=1),
        total_steps=20,
        deadline=timedelta(seconds=30),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=LocalBackend(
            trace=TRACE, polarity="available", time_scale=60.0, work_dir=ROOT + "/runs"
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.05,
        min_deferral=timedelta(0),  # the tests exercise the trigger path
    ).expand(command=[_train(20), _train(20, seed=8)])
