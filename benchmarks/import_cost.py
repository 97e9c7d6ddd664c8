"""Cost to Airflow: what importing the operator and the TaskFlow decorator adds to
``import airflow.sdk``, and how fast the local backend reacts to a preemption.

    python benchmarks/import_cost.py [--runs 7]

1. In fresh interpreters: time ``import airflow.sdk``, then, on top of it, the import of
   ``airflow_spot.operators`` (the operator); in other interpreters, on top of what a TaskFlow
   DAG file imports first (``import airflow.sdk; from airflow.sdk import task``, which loads
   Airflow's decorator machinery), the import of ``airflow_spot.decorators.spot_training``
   (what ``task.spot_training`` imports the first time a DAG file uses it, the operator
   included). Medians of ``--runs``. Target: each under 50 ms.
2. Reaction time: a spot attempt runs the example training job; the replayed market takes spot
   away at a known wall time; a watcher polls as the trigger does; the operator's controller
   then decides. Printed: market change -> preemption verdict -> next launch decision.
   Target: under 2 s plus the poll interval.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = (
    "import time; t0 = time.perf_counter(); {baseline}; t1 = time.perf_counter(); "
    "import {module}; t2 = time.perf_counter(); "
    "import sys; heavy = sorted(m for m in ('numpy', 'kubernetes', 'boto3', 'airflow.triggers.base') if m in sys.modules); "
    "print(t1 - t0, t2 - t1, ','.join(heavy))"
)
MODULES = {  # name: (what the DAG file imports first, our module)
    "operator": ("import airflow.sdk", "airflow_spot.operators"),
    "decorator": (
        "import airflow.sdk; from airflow.sdk import task",
        "airflow_spot.decorators.spot_training",
    ),
}


def import_cost(runs: int) -> None:
    base: dict[str, list[float]] = {name: [] for name in MODULES}
    ours: dict[str, list[float]] = {name: [] for name in MODULES}
    heavy: dict[str, str] = {}
    for _ in range(runs):  # interleaved: a load change on the machine hits both alike
        for name, (baseline, module) in MODULES.items():
            out = subprocess.run(
                [sys.executable, "-c", PROBE.format(baseline=baseline, module=module)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            base[name].append(float(out[0]))
            ours[name].append(float(out[1]))
            heavy[name] = out[2] if len(out) > 2 else ""
    for name, (baseline, module) in MODULES.items():
        print(f"{baseline}: median {1000 * statistics.median(base[name]):.1f} ms over {runs} runs")
        print(
            f"  + import {module}: median {1000 * statistics.median(ours[name]):.1f} ms "
            f"(max {1000 * max(ours[name]):.1f} ms; target < 50 ms); heavy modules loaded: "
            f"{heavy[name] or 'none'}"
        )


def reaction_time(poll: float) -> None:
    from airflow_spot.backends.base import TaskIdentity
    from airflow_spot.backends.local import LocalBackend
    from airflow_spot.testing import scripted_trace
    from airflow_spot.triggers.watch import Watch

    with tempfile.TemporaryDirectory() as d:
        trace = scripted_trace(
            Path(d) / "m.json", [(True, 18), (False, 1000)]
        )  # down after 3 s at 3600x
        b = LocalBackend(
            trace=str(trace),
            polarity="available",
            time_scale=3600.0,
            work_dir=d,
            notice_s=0.2,
            grace_s=2.0,
        )
        epoch = time.time()
        market = b.market_spec(epoch)
        h = b.launch(
            TaskIdentity("bench", "t", "r"),
            1,
            "spot",
            [
                sys.executable,
                "-m",
                "airflow_spot.examples.train_logreg",
                "--steps",
                "10000",
                "--step-seconds",
                "0.02",
                "--checkpoint-uri",
                d + "/ckpt",
            ],
            checkpoint_uri=d + "/ckpt",
            changeover_wall_s=0.0,
            market=market,
        )
        change_at = epoch + 18 * 600 / 3600.0
        watch = Watch(h, market.to_dict(), True, time.time() + 3600)
        while True:
            ev = watch.poll_once()
            if ev is not None and ev.kind.value == "attempt_ended":
                break
            time.sleep(poll)
        seen = time.time()
        # the controller's decision after the verdict: one policy call
        from airflow_spot.policy import Capacity, JobSpec, Observation, get_policy

        t0 = time.perf_counter()
        get_policy("deadline_aware").decide(
            JobSpec(48 * 3600, 60 * 3600, 720),
            Observation(3 * 3600, 2 * 3600, Capacity.NONE, False),
        )
        decided = seen + (time.perf_counter() - t0)
        st = b.status(h)
        print(
            f"preemption reaction (poll interval {poll:.2f} s): market change -> verdict {st.ended_at - change_at:.2f} s "
            f"(the job saw the notice file, checkpointed and exited), -> watcher sees it {seen - change_at:.2f} s, "
            f"-> next launch decision {decided - change_at:.2f} s (target < 2 s + poll)"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--poll", type=float, default=0.5)
    args, _ = ap.parse_known_args()
    import_cost(args.runs)
    reaction_time(args.poll)


if __name__ == "__main__":
    main()
