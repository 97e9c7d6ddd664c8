"""Demo: a real (small) training job on replayed spot capacity, with a deadline.

A numpy logistic regression trains 480 steps (0.1 s each: 48 s of "compute"), checkpointing
every 5 steps, on the embedded local backend. Spot capacity follows a real AWS us-west-2a
V100 trace replayed at one trace hour per second, so the job is a 48 h job with a 62 h
deadline: it gets preempted, resumes from checkpoints, and falls back to on-demand when the
deadline gets close. Run it with ``make demo``.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_spot.backends.local import LocalBackend
from airflow_spot.operators import SpotTrainingOperator

# under the provider's default allowed checkpoint root, {AIRFLOW_HOME}/spot_checkpoints
DEMO_DIR = os.environ.get(
    "AIRFLOW_SPOT_DEMO_DIR",
    os.path.join(os.environ.get("AIRFLOW_HOME", "."), "spot_checkpoints", "spot_demo"),
)
STEPS = 480
TRACE = "bundled:cant-be-late/us-west-2a_v100_1/8.json"  # AWS us-west-2a V100 (MIT), see airflow_spot/data

with DAG(
    dag_id="spot_training_demo",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["spot", "demo"],
) as dag:
    SpotTrainingOperator(
        task_id="train",
        command=[
            sys.executable,
            "-m",
            "airflow_spot.examples.train_logreg",
            "--steps",
            str(STEPS),
            "--step-seconds",
            "0.1",
            "--save-every",
            "5",
            "--seed",
            "0",
        ],
        checkpoint_uri=DEMO_DIR
        + "/checkpoints/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        expected_compute=timedelta(seconds=48),
        total_steps=STEPS,
        deadline=timedelta(seconds=62),
        changeover=timedelta(seconds=0.2),
        policy="deadline_aware",
        spot_price=0.9731,
        on_demand_price=3.06,
        max_failures=1,
        backend=LocalBackend(
            trace=TRACE, time_scale=3600.0, work_dir=DEMO_DIR + "/runs", notice_s=0.2, grace_s=2.0
        ),
        decision_interval=timedelta(seconds=1),
        poll_interval=0.1,
    )
