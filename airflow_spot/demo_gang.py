"""`make demo-gang`: a 4-rank training job on spot, preempted as a gang, falling back to on-demand.

Runs ``SpotTrainingOperator(nodes=4)`` on the embedded local backend (``LocalBackend(nodes=4)``:
four real rank processes of ``airflow_spot.examples.train_ddp``, JAX's multi-process CPU runtime
with gloo all-reduces) against a scripted count trace: all four nodes for a while, then one
node taken (the whole gang is preempted and every rank stopped), four again, then two taken,
then no spot at all, so the job falls back to on-demand to meet its deadline. The operator runs
in this process, synchronously (``deferrable=False``: no Airflow scheduler or triggerer; the
tests run the same operator on a real deployment). Then the same training runs once more as
one uninterrupted gang, and the demo prints whether the two final models are bit-identical,
and the job's ledger. Its files go to ``.demo/gang/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path

NODES = 4
STEPS = 1200
# one tick a wall second (gap 3600 s replayed at 3600x): spot for 40 s, one node taken, four
# again for 35 s, two taken, then no spot: the second outage outlasts the slack
COUNTS = [4] * 40 + [3, 0, 0] + [4] * 35 + [2] + [0] * 900
COMMAND = [sys.executable, "-m", "airflow_spot.examples.train_ddp", "--seed", "11"]
TRAIN = [*COMMAND, "--steps", str(STEPS), "--save-every", "10"]


def _trace(path: Path, counts: list[int]) -> str:
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": counts}))
    return str(path)


def _backend(root: Path, name: str, counts: list[int]):
    from airflow_spot.backends.local import LocalBackend

    return LocalBackend(
        trace=_trace(root / f"{name}.json", counts),
        polarity="available",
        time_scale=3600.0,
        work_dir=str(root / f"runs-{name}"),
        nodes=NODES,
        notice_s=0.5,
        grace_s=3.0,
    )


def run_job(root: Path) -> dict:
    """The gang job through the operator; its summary (the XCom it returns)."""
    from airflow_spot.operators import SpotTrainingOperator
    from airflow_spot.testing import FileTaskStateStore, make_context

    op = SpotTrainingOperator(
        task_id="train_gang",
        command=[*TRAIN, "--step-seconds", "0.05"],
        checkpoint_uri=str(root / "ckpt"),
        expected_compute=timedelta(seconds=STEPS * 0.05 + 5),
        total_steps=STEPS,
        deadline=timedelta(seconds=240),
        changeover=timedelta(seconds=10),
        policy="uniform_progress",
        backend=_backend(root, "market", COUNTS),
        decision_interval=timedelta(seconds=2),
        poll_interval=0.2,
        deferrable=False,
    )
    return op.execute(make_context(FileTaskStateStore(root / "state.json")))  # type: ignore[arg-type]


def run_uninterrupted(root: Path) -> None:
    """The same training as one gang that nothing interrupts (the reference model)."""
    from airflow_spot.backends.base import TaskIdentity

    backend = _backend(root, "whole", [NODES] * 900)
    handle = backend.launch(
        TaskIdentity("demo", "train_gang", "whole"),
        1,
        "spot",
        TRAIN,
        checkpoint_uri=str(root / "ckpt-whole"),
        changeover_wall_s=0.0,
        market=backend.market_spec(time.time()),
    )
    until = time.time() + 300
    while not (status := backend.status(handle)).terminal and time.time() < until:
        time.sleep(0.2)
    if not status.terminal:
        backend.cancel(handle)
    if status.outcome is None or status.outcome.value != "succeeded":
        raise SystemExit(f"the uninterrupted gang did not succeed: {status.reason}")


def final_weights(ckpt: Path) -> tuple[int, str]:
    """The newest whole checkpoint's step and the sha256 of its weights."""
    from airflow_spot.checkpoint.checkpoints import Checkpoints
    from airflow_spot.checkpoint.local import LocalStore

    cps = Checkpoints(LocalStore(str(ckpt)))
    m = cps.latest_valid()
    if m is None:
        raise SystemExit(f"no whole checkpoint in {ckpt}")
    files = cps.load(m)
    return m.step, hashlib.sha256(files["weights.npy"]).hexdigest()


def report(summary: dict, same: bool, steps: tuple[int, int]) -> str:
    lines = [f"gang of {summary.get('nodes', 1)} ranks, policy {summary['policy']}:"]
    for a in summary["attempts"]:
        ranks = ", ".join(f"{r['rank']}:{r['outcome']}" for r in a.get("ranks") or [])
        lines.append(
            f"  attempt {a['attempt']} on {a['capacity']:<9} {a['outcome']:<10} steps "
            f"{a['step_start']}->{a['checkpoint_step_end']}  ranks [{ranks}]"
        )
    hours = summary.get("node_hours") or {}
    lines += [
        f"preemptions {summary['preemptions']}, fallbacks to on-demand "
        f"{summary['fallbacks_to_on_demand']}, failures {summary['failures']}",
        f"node-hours: spot {hours.get('spot', 0):.2f}, on-demand {hours.get('on_demand', 0):.2f}"
        f" (market hours, {summary.get('nodes', 1)} nodes billed)",
        f"cost ${summary['cost']:.2f} against ${summary['on_demand_cost']:.2f} all on-demand",
        f"deadline met: {summary['deadline_met']}",
        f"final model (step {steps[0]}) bit-identical to an uninterrupted gang's (step "
        f"{steps[1]}): {same}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".demo/gang", help="where the demo writes (emptied first)")
    args = ap.parse_args(argv)
    root = Path(args.dir).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    import os

    os.environ.setdefault("AIRFLOW__SPOT_TRAINING__ALLOWED_LOCAL_CHECKPOINT_ROOTS", str(root))
    print(
        f"Running a {NODES}-rank gang on a scripted spot market (two to three minutes on 2 cores)...",
        flush=True,
    )
    summary = run_job(root)
    print("...and the same training once, uninterrupted, for the reference model.", flush=True)
    run_uninterrupted(root)
    (step, got), (whole_step, expected) = (
        final_weights(root / "ckpt"),
        final_weights(root / "ckpt-whole"),
    )
    same = got == expected and step == whole_step == STEPS
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    print(report(summary, same, (step, whole_step)))
    ok = (
        same
        and summary["deadline_met"]
        and summary["preemptions"] >= 2
        and summary["fallbacks_to_on_demand"] >= 1
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
