"""Big checkpoints: memory of a save and a resume, and what the watcher reads, over S3.

    python benchmarks/checkpoint_io.py [--mb 512]

A moto S3 server runs in its own process (real boto3 over HTTP; no real S3 is reachable
here). Each case runs in a fresh interpreter that prints its peak RSS above the interpreter
with its imports loaded:

1. save a ``--mb`` MB model file given as bytes (``{"model.pt": data}``) vs as a path;
2. resume it with ``resume()`` (bytes) vs ``resume_to(folder)`` (paths);
3. the operator's check that the checkpoint is whole: hashing every file (as before) vs
   ``hash_up_to`` (size by HEAD above 64 MB): time and bytes downloaded.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CASE = textwrap.dedent("""
    import os, resource, sys, time
    from pathlib import Path
    import boto3
    from airflow_spot.checkpoint import Checkpoints, open_store
    from airflow_spot.checkpoint.training import TrainingSession

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB on Linux

    case, uri, model, work = sys.argv[1:5]
    store = open_store(uri)
    store.client  # the client built and its modules loaded before the baseline
    base = rss()
    t0 = time.perf_counter()
    got = "-"
    if case == "save-bytes":
        TrainingSession(uri, total_steps=2, save_every=1).step_done(1, lambda: {"model.pt": Path(model).read_bytes()})
    elif case == "save-path":
        TrainingSession(uri, total_steps=2, save_every=1).step_done(1, lambda: {"model.pt": Path(model)})
    elif case == "resume-bytes":
        step, files = TrainingSession(uri, total_steps=2).resume()
        assert step == 1 and len(files["model.pt"]) == os.path.getsize(model)
    elif case == "resume-path":
        step, files = TrainingSession(uri, total_steps=2).resume_to(work)
        assert step == 1 and files["model.pt"].stat().st_size == os.path.getsize(model)
    else:
        limit = None if case == "watch-hash" else 64 << 20
        c = Checkpoints(store, hash_up_to=limit)
        sizes = []
        c.store.client.meta.events.register(
            "after-call.s3.GetObject",
            lambda parsed, **kw: sizes.append(parsed.get("ContentLength", 0)),
        )
        assert c.latest_valid().step == 1
        got = f"{sum(sizes) / 2**20:.1f}"
    print(f"{rss() - base:.0f} {time.perf_counter() - t0:.2f} {got}")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512, help="size of the model file")
    args, _ = ap.parse_known_args()  # make bench passes its own arguments to every script
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        until = time.time() + 30
        while True:
            try:
                client.create_bucket(Bucket="bench")
                break
            except Exception:
                if time.time() > until:
                    raise
                time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "model.pt"
            with open(model, "wb") as fh:
                for _ in range(args.mb):
                    fh.write(os.urandom(1 << 20))
            print(f"model file {args.mb} MB; S3 = moto server over HTTP; peak RSS above baseline")
            print(f"{'case':<14} {'peak RSS MB':>12} {'seconds':>8} {'MB downloaded':>14}")
            for i, case in enumerate(
                [
                    "save-bytes",
                    "save-path",
                    "resume-bytes",
                    "resume-path",
                    "watch-hash",
                    "watch-size",
                ]
            ):
                # saves go to their own prefix; the rest read what save-path wrote
                uri = "s3://bench/" + ("bytes" if case == "save-bytes" else "path")
                out = subprocess.run(
                    [sys.executable, "-c", CASE, case, uri, str(model), f"{tmp}/in{i}"],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise SystemExit(f"{case} failed:\n{out.stderr[-2000:]}")
                mem, secs, got = out.stdout.split()
                print(f"{case:<14} {mem:>12} {secs:>8} {got:>14}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
