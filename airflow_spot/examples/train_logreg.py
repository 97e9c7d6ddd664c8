"""A small, real, deterministic training job: logistic regression by mini-batch SGD (numpy).

    python -m airflow_spot.examples.train_logreg --steps 400 --seed 0 [--step-seconds 0.05]
        [--via-files DIR]

The dataset is generated from ``seed``; mini-batch ``i`` is drawn from ``seed`` and ``i`` alone,
so a run resumed from any checkpoint ends bit-identical to an uninterrupted one.
``--step-seconds`` paces each step (an emulated GPU step) so that preemptions can land
mid-run in a demo. The final checkpoint's metrics hold the test accuracy. ``--via-files``
checkpoints through local files in ``DIR`` (``resume_to`` and paths given to ``step_done``),
as a model too big to hold twice in memory would; the checkpoints are byte-identical.
"""

from __future__ import annotations

import argparse
import io
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from airflow_spot.checkpoint.training import TrainingSession

FEATURES = 20


def make_data(seed: int, n: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=FEATURES)
    x = rng.normal(size=(n, FEATURES))
    y = (x @ true_w + 0.5 * rng.normal(size=n) > 0).astype(np.float64)
    return x, y


def sgd_step(
    w: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    seed: int,
    step: int,
    lr: float = 0.1,
    batch: int = 64,
) -> np.ndarray:
    idx = np.random.default_rng([seed, step]).integers(0, len(x) - 1000, size=batch)
    xb, yb = x[idx], y[idx]
    p = 1.0 / (1.0 + np.exp(-(xb @ w)))
    return w - lr * xb.T @ (p - yb) / batch


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float((((x[-1000:] @ w) > 0) == (y[-1000:] > 0.5)).mean())


def to_bytes(w: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, w, allow_pickle=False)
    return buf.getvalue()


def from_bytes(raw: bytes) -> np.ndarray:
    return np.load(io.BytesIO(raw), allow_pickle=False)


def _state_of(w: np.ndarray, via_files: Path | None) -> Callable[[], Mapping[str, bytes | Path]]:
    if via_files is None:
        return lambda: {"weights.npy": to_bytes(w)}

    def write() -> dict[str, bytes | Path]:
        path = via_files / "weights.npy"  # e.g. torch.save(model.state_dict(), path)
        np.save(path, w, allow_pickle=False)
        return {"weights.npy": path}

    return write


def train(
    session: TrainingSession,
    seed: int,
    step_seconds: float = 0.0,
    via_files: Path | None = None,
) -> np.ndarray:
    x, y = make_data(seed)
    if via_files is None:
        start, raw = session.resume()
        w = from_bytes(raw["weights.npy"]) if raw else np.zeros(FEATURES)
    else:
        via_files.mkdir(parents=True, exist_ok=True)
        start, paths = session.resume_to(via_files / "resumed")
        w = np.load(paths["weights.npy"], allow_pickle=False) if paths else np.zeros(FEATURES)
    for step in range(start, session.total_steps):
        t0 = time.monotonic()
        w = sgd_step(w, x, y, seed, step)
        if step_seconds:
            time.sleep(max(0.0, step_seconds - (time.monotonic() - t0)))
        done = step + 1
        metrics = (
            {"accuracy": accuracy(w, x, y)}
            if done % session.save_every == 0 or done == session.total_steps
            else None
        )
        session.step_done(done, _state_of(w, via_files), metrics=metrics)
    return w


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    ap.add_argument("--checkpoint-uri")
    ap.add_argument("--via-files", type=Path, help="checkpoint through local files in this folder")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    session = TrainingSession.from_env(
        total_steps=args.steps, save_every=args.save_every, checkpoint_uri=args.checkpoint_uri
    )
    w = train(session, args.seed, args.step_seconds, args.via_files)
    x, y = make_data(args.seed)
    logging.info("Training finished: %d steps, test accuracy %.4f", args.steps, accuracy(w, x, y))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
