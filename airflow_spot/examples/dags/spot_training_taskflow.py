"""Example: a training job written with TaskFlow, which publishes its model as an Asset.

``@task.spot_training`` takes SpotTrainingOperator's arguments; the decorated function is the
training entry point. Each attempt runs it in a fresh interpreter (on Kubernetes, in a container
of your image) with a ``session``: a TrainingSession bound to the job's checkpoint location
(``resume()``, ``step_done()``). The function imports what it uses inside its body: it travels
as its source. Its return value (a small JSON value) lands in the task's XCom under ``result``,
beside the ledger summary.

The job: the numpy logistic regression of :mod:`airflow_spot.examples.train_logreg`, 120 steps
of 0.05 s (a 6 h job) on the local backend, spot replayed from a real AWS V100 trace at one
trace hour per wall second, with a 15 h deadline. When it succeeds, the task records an event of the Asset ``spot_logreg_model`` whose
extra says which checkpoint holds the model (step, manifest hash, URI) and what it cost; the
``spot_training_evaluate`` DAG is scheduled on that Asset.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Asset, task

from airflow_spot.backends.local import LocalBackend

# under the provider's default allowed checkpoint root, {AIRFLOW_HOME}/spot_checkpoints
ROOT = os.environ.get(
    "AIRFLOW_SPOT_DEMO_DIR",
    os.path.join(os.environ.get("AIRFLOW_HOME", "."), "spot_checkpoints", "spot_demo"),
)
MODEL = Asset("spot_logreg_model")
STEPS, STEP_S, SEED = 120, 0.05, 0
TRACE = "bundled:cant-be-late/us-west-2a_v100_1/8.json"  # AWS us-west-2a V100 (MIT)

with DAG(
    dag_id="spot_training_taskflow",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["spot", "example"],
) as dag:

    @task.spot_training(
        checkpoint_uri=ROOT + "/taskflow/{{ run_id | replace(':', '_') | replace('+', '_') }}",
        expected_compute=timedelta(seconds=STEPS * STEP_S),
        total_steps=STEPS,
        save_every=10,
        deadline=timedelta(seconds=15),
        changeover=timedelta(seconds=0.2),
        backend=LocalBackend(
            trace=TRACE, time_scale=3600.0, work_dir=ROOT + "/runs", notice_s=0.2, grace_s=2.0
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.1,
        max_failures=1,
        outlets=[MODEL],
    )
    def train_logreg(session, seed: int = 0, step_seconds: float = 0.0):
        """Logistic regression by SGD; resumes from the newest checkpoint after a preemption."""
        from airflow_spot.examples.train_logreg import accuracy, make_data, train

        w = train(session, seed, step_seconds)  # session.resume(), then step_done() each step
        x, y = make_data(seed)
        return {"accuracy": accuracy(w, x, y), "seed": seed}

    # (type checkers see the function's own signature: session comes in the training process)
    train_logreg(seed=SEED, step_seconds=STEP_S)  # type: ignore[call-arg, misc]
