"""Example: a DAG scheduled on the model Asset of ``spot_training_taskflow``.

Each event of ``spot_logreg_model`` (a training job that finished) starts a run. Its task reads
the event's extra (the checkpoint's step, manifest hash and URI, the job's cost and savings),
checks that the checkpoint is the one announced (its MANIFEST.json hashes to the event's
``manifest_hash``), loads the weights and evaluates them on the held-out data.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Asset, task

MODEL = Asset("spot_logreg_model")  # published by spot_training_taskflow

with DAG(
    dag_id="spot_training_evaluate",
    schedule=[MODEL],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["spot", "example"],
) as dag:

    @task
    def evaluate(triggering_asset_events=None) -> dict:
        """Evaluate the model the triggering event names."""
        import hashlib
        import io
        from pathlib import Path

        import numpy as np

        from airflow_spot.examples.train_logreg import accuracy, make_data

        extra = triggering_asset_events[MODEL][-1].extra
        where = Path(extra["uri"].removeprefix("file://"))
        manifest = (where / "MANIFEST.json").read_bytes()
        if hashlib.sha256(manifest).hexdigest() != extra["manifest_hash"]:
            raise ValueError(f"{where} is not the checkpoint the event announced")
        w = np.load(io.BytesIO((where / "weights.npy").read_bytes()), allow_pickle=False)
        x, y = make_data(0)  # the training DAG's seed
        return {
            "checkpoint_step": extra["checkpoint_step"],
            "accuracy": accuracy(w, x, y),
            "cost": extra["cost"],
            "savings": extra["savings"],
            "deadline_met": extra["deadline_met"],
        }

    evaluate()
