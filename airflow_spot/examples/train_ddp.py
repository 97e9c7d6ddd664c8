"""Real data-parallel training across N processes: the logistic regression of
:mod:`.train_logreg`, one shard of each mini-batch per rank, gradients all-reduced every step
through JAX's multi-process CPU runtime (gloo collectives over TCP).

    RANK=k WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P \\
        python -m airflow_spot.examples.train_ddp --steps 200 --seed 0 [--step-seconds 0.02]

``pip install 'airflow-provider-spot[gang]'`` brings JAX. Rank 0 hosts the rendezvous (JAX's
coordination service) at ``MASTER_ADDR:MASTER_PORT``; every rank connects to it.

Deterministic: step ``i``'s global mini-batch is drawn from ``seed`` and ``i`` alone, rank
``k`` takes its ``k``-th slice, and the gradients are summed in rank order (an all-gather,
then a fixed-order sum in float64 on every rank), so every rank holds the same weights, and a
gang resumed from any checkpoint ends bit-identical to an uninterrupted one at the same world
size. A reduction inside the collective library could add in an order that depends on the
algorithm it picks; the fixed-order sum cannot.

The stop is agreed: each rank's preemption notice (:meth:`TrainingSession.notice`) rides with
its gradient, and the gang stops at the same step when any rank heard one; rank 0 saves.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import numpy as np

from airflow_spot.checkpoint.training import TrainingSession
from airflow_spot.examples.train_logreg import FEATURES, accuracy, from_bytes, make_data, to_bytes

BATCH = 32  # examples per rank per step
HEARTBEAT_S = 10  # a rank that hears nothing from the coordinator for this long gives up


def connect(rank: int, world_size: int):
    """Join the gang (rank 0 hosts the rendezvous); returns the all-gather to use."""
    import jax

    jax.config.update("jax_platforms", "cpu")  # the gang's collectives run on the CPU
    jax.config.update("jax_enable_x64", True)  # gradients travel in float64, bit for bit
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if world_size > 1:
        addr = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ['MASTER_PORT']}"
        jax.distributed.initialize(
            coordinator_address=addr,
            num_processes=world_size,
            process_id=rank,
            initialization_timeout=60,
            heartbeat_timeout_seconds=HEARTBEAT_S,
            shutdown_timeout_seconds=HEARTBEAT_S,
        )
    from jax.experimental import multihost_utils

    return lambda row: np.asarray(multihost_utils.process_allgather(row))


def local_gradient(
    w: np.ndarray, x: np.ndarray, y: np.ndarray, seed: int, step: int, rank: int, world_size: int
) -> np.ndarray:
    """The summed logistic-loss gradient over this rank's slice of step ``step``'s batch."""
    idx = np.random.default_rng([seed, step]).integers(0, len(x) - 1000, size=BATCH * world_size)
    mine = idx[rank * BATCH : (rank + 1) * BATCH]
    xb, yb = x[mine], y[mine]
    p = 1.0 / (1.0 + np.exp(-(xb @ w)))
    return xb.T @ (p - yb)


def train(
    session: TrainingSession,
    seed: int,
    gather,
    step_seconds: float = 0.0,
    lr: float = 0.1,
) -> np.ndarray:
    x, y = make_data(seed)
    start, raw = session.resume()
    w = from_bytes(raw["weights.npy"]) if raw else np.zeros(FEATURES)
    n = session.world_size
    for step in range(start, session.total_steps):
        t0 = time.monotonic()
        g = local_gradient(w, x, y, seed, step, session.rank, n)
        row = np.append(g, 1.0 if session.notice() else 0.0)
        rows = gather(row)  # (world_size, FEATURES + 1), in rank order on every rank
        total = np.zeros(FEATURES)
        for r in range(n):  # a fixed order: the same bits on every rank, in every run
            total = total + rows[r, :FEATURES]
        w = w - lr * total / (BATCH * n)
        stop = bool(rows[:, FEATURES].max() > 0)
        if step_seconds:
            time.sleep(max(0.0, step_seconds - (time.monotonic() - t0)))
        done = step + 1
        due = done % session.save_every == 0 or done == session.total_steps
        metrics = {"accuracy": accuracy(w, x, y)} if due or stop else None
        session.step_done(
            done, lambda w=w: {"weights.npy": to_bytes(w)}, metrics=metrics, stopping=stop
        )
    return w


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    ap.add_argument("--checkpoint-uri")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank {rank} %(levelname)s %(message)s"
    )
    session = TrainingSession.from_env(
        total_steps=args.steps, save_every=args.save_every, checkpoint_uri=args.checkpoint_uri
    )
    gather = connect(session.rank, session.world_size)
    logging.info("Rank %d of %d joined the gang.", session.rank, session.world_size)
    try:
        w = train(session, args.seed, gather, args.step_seconds)
    except Exception:  # noqa: BLE001 - a crash leaves the gang at once, exit 1
        # JAX's exit-time shutdown waits for every peer, and a peer stuck in this step's
        # all-gather never comes: the supervisor stops the peers, not this process
        logging.exception("Rank %d failed; leaving the gang.", session.rank)
        logging.shutdown()
        os._exit(1)
    x, y = make_data(args.seed)
    logging.info("Training finished: %d steps, test accuracy %.4f", args.steps, accuracy(w, x, y))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
