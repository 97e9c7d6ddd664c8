"""Checkpoint save and resume against plain copies of the same bytes, local and S3 (issue 38).

    python benchmarks/checkpoint_io.py [--sizes 256,1024,4096] [--files 1,8] [--rounds 2]
                                       [--no-s3] [--dir /tmp]

For each total size (MiB, split evenly over 1 or 8 random files given to ``step_done`` as
paths) it times, side by side in one run, each case in a fresh interpreter that prints its
time and its peak RSS above the interpreter with its imports loaded:

* local save: ``step_done`` (one pass: hashed while copied, fsynced) against
  ``shutil.copyfile`` + ``fsync`` of each file;
* local resume: ``resume_to`` (hashed while copied) against ``shutil.copyfile`` of each
  file, with and without ``fsync`` (the stored files are evicted from the page cache
  before every resume: a resume on a new node reads them cold);
* S3 save: ``step_done`` against boto3's ``upload_file`` (its default parts and threads);
* S3 resume: ``resume_to`` against the best of boto3's ``download_file`` and one streamed
  ``get_object`` per file.

S3 is a moto server over HTTP on 127.0.0.1 (no real S3 is reachable here), with one change:
a ranged GET reads only its range. Stock moto reads the whole object for every ranged GET
(a 2 GiB file in 8 MiB ranges reads 512 GiB), which made boto3's own ``download_file`` take
242 s where one streamed GET took 2.5 s; real S3 serves a range at the cost of the range.
Uploads take the same code in both. One row at the smallest size shows stock moto's ranged
GETs, and the store's one-stream setting for such servers (``AIRFLOW_SPOT_S3_CONCURRENCY=1``).

Each local case runs ``--rounds`` times, alternating ours and the plain copy; the table
gives the fastest of each (the machine is shared: the slower rounds are other people's I/O).
Then the notice-window table: at the measured throughput of the biggest size, the largest
checkpoint that saves within a 30 s (GCP) and a 120 s (AWS) preemption notice.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

CASE = textwrap.dedent("""
    import json, os, resource, shutil, sys, time
    from pathlib import Path

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB on Linux

    def fsync(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    case, uri, srcs, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
    if uri.startswith("s3://"):
        import boto3
        from boto3.s3.transfer import TransferConfig
        bucket, prefix = uri[5:].split("/", 1)
        client = boto3.client("s3")
    from airflow_spot.checkpoint.training import TrainingSession
    from airflow_spot.checkpoint import open_store
    store = open_store(uri)
    if uri.startswith("s3://"):
        store.client  # built, its modules loaded, before the baseline
    base = rss()
    t0 = time.perf_counter()
    names = [Path(s).name for s in srcs]
    if case == "save-ours":
        session = TrainingSession(uri, total_steps=2, save_every=1)
        session.step_done(1, lambda: {n: Path(s) for n, s in zip(names, srcs)})
    elif case == "resume-ours":
        step, files = TrainingSession(uri, total_steps=2).resume_to(out)
        assert step == 1 and sorted(files) == sorted(names), files
    elif case in ("save-copy", "resume-copy", "resume-copy-nosync"):
        out.mkdir(parents=True, exist_ok=True)
        for s in srcs:
            shutil.copyfile(s, out / Path(s).name)
            if case != "resume-copy-nosync":
                fsync(out / Path(s).name)
    elif case == "save-upload_file":
        for n, s in zip(names, srcs):
            client.upload_file(s, bucket, f"{prefix}/{n}")
    elif case == "resume-download_file":
        out.mkdir(parents=True, exist_ok=True)
        for n in names:
            client.download_file(bucket, f"{prefix}/{n}", str(out / n))
    elif case == "resume-get_object":
        out.mkdir(parents=True, exist_ok=True)
        for n in names:
            body = client.get_object(Bucket=bucket, Key=f"{prefix}/{n}")["Body"]
            with open(out / n, "wb") as fh:
                for chunk in body.iter_chunks(1 << 20):
                    fh.write(chunk)
    else:
        raise SystemExit(f"unknown case {case}")
    print(json.dumps({"s": time.perf_counter() - t0, "mb": rss() - base}))
""")

# moto's S3 server, its ranged GET reading only the range (``ranged``) or as it is (``stock``)
SERVER = textwrap.dedent("""
    import re, sys
    from moto.s3.responses import S3Response

    def ranged_get(self, _orig=S3Response.get_object):
        m = re.fullmatch(r"bytes=(\\d+)-(\\d+)", self.headers.get("range") or "")
        if not m or self._get_int_param("partNumber"):
            return _orig(self)
        key, not_modified = self._get_key()
        begin, end = int(m[1]), min(int(m[2]), key.size - 1)
        if not_modified or begin > end:
            return _orig(self)
        with key.lock:
            key._value_buffer.seek(begin)
            data = key._value_buffer.read(end - begin + 1)
        headers = self._get_cors_headers_other()
        headers.update(key.response_dict)
        headers["content-range"] = f"bytes {begin}-{end}/{key.size}"
        headers["content-length"] = str(len(data))
        headers["Accept-Ranges"] = "bytes"
        return 206, headers, data

    if sys.argv[2] == "ranged":
        S3Response.get_object = ranged_get
    from moto.server import main
    main(["-p", sys.argv[1]])
""")
GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Row:
    op: str
    files: int
    size_mb: int
    ours: dict[str, float]
    plain: dict[str, float]
    plain_name: str
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.ours["s"] / self.plain["s"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(case: str, uri: str, srcs: list[Path], out: Path, env: dict[str, str]) -> dict:
    got = subprocess.run(
        [sys.executable, "-c", CASE, case, uri, json.dumps([str(s) for s in srcs]), str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if got.returncode:
        raise SystemExit(f"{case} failed:\n{got.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(got.stdout.strip().splitlines()[-1])


def evict(paths: list[Path]) -> None:
    """Drop clean pages of ``paths`` from the page cache: the next read is cold."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_files(where: Path, total_mb: int, files: int) -> list[Path]:
    where.mkdir(parents=True, exist_ok=True)
    each = total_mb * MIB // files
    block = os.urandom(MIB)
    out = []
    for i in range(files):
        path = where / f"shard{i}.bin"
        with open(path, "wb") as fh:
            for j in range(each // MIB):  # cheap distinct bytes: a random block, varied
                fh.write(block[j % 997 :] + block[: j % 997])
        out.append(path)
    return out


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["s"])


def local_rows(tmp: Path, srcs: list[Path], mb: int, rounds: int, env: dict) -> list[Row]:
    store = tmp / "store"
    saves: dict[str, list[dict]] = {"save-ours": [], "save-copy": []}
    for _ in range(rounds):
        for case in saves:
            if case == "save-ours":
                shutil.rmtree(store, ignore_errors=True)
            saves[case].append(run_case(case, str(store), srcs, tmp / "copy", env))
    stored = sorted(store.glob("ckpt-*/shard*.bin"))  # what the last save-ours wrote
    resumes: dict[str, list[dict]] = {
        c: [] for c in ("resume-ours", "resume-copy", "resume-copy-nosync")
    }
    for _ in range(rounds):
        for case in resumes:
            evict(stored)
            resumes[case].append(run_case(case, str(store), stored, tmp / "in", env))
    shutil.rmtree(store, ignore_errors=True)
    n = len(srcs)
    ours_r = best(resumes["resume-ours"])
    return [
        Row(
            "local save",
            n,
            mb,
            best(saves["save-ours"]),
            best(saves["save-copy"]),
            "copyfile + fsync",
        ),
        Row("local resume", n, mb, ours_r, best(resumes["resume-copy"]), "copyfile + fsync"),
        Row(
            "local resume", n, mb, ours_r, best(resumes["resume-copy-nosync"]), "copyfile (no sync)"
        ),
    ]


def start_server(kind: str) -> tuple[subprocess.Popen, dict[str, str]]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), kind],
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
            return server, env
        except Exception:
            if time.time() > until:
                server.terminate()
                raise
            time.sleep(0.2)


def s3_rows(tmp: Path, srcs: list[Path], mb: int, kind: str) -> list[Row]:
    server, env = start_server(kind)
    n = len(srcs)
    try:
        ours = run_case("save-ours", "s3://bench/ours", srcs, tmp / "x", env)
        plain = run_case("save-upload_file", "s3://bench/plain", srcs, tmp / "x", env)
        rows = [Row("S3 save", n, mb, ours, plain, "upload_file")]
        ckpt = "s3://bench/plain"  # plain uploads: the same bytes under the same names
        got_ours = run_case("resume-ours", "s3://bench/ours", srcs, tmp / "in", env)
        plains = {
            c: run_case(c, ckpt, srcs, tmp / "in", env)
            for c in ("resume-get_object", "resume-download_file")
        }
        name = min(plains, key=lambda c: plains[c]["s"])
        other = [c for c in plains if c != name][0]
        note = f"{other.split('-', 1)[1]} {plains[other]['s']:.1f} s"
        rows.append(Row("S3 resume", n, mb, got_ours, plains[name], name.split("-", 1)[1], note))
        return rows
    finally:
        server.terminate()
        server.wait(timeout=30)


def stock_moto_rows(tmp: Path, srcs: list[Path], mb: int) -> list[Row]:
    """Stock moto (every ranged GET reads the whole object): our default ranges, and one
    stream per file (``AIRFLOW_SPOT_S3_CONCURRENCY=1``), against the plain downloads."""
    server, env = start_server("stock")
    n = len(srcs)
    try:
        run_case("save-ours", "s3://bench/ours", srcs, tmp / "x", env)
        run_case("save-upload_file", "s3://bench/plain", srcs, tmp / "x", env)
        plains = {
            c: run_case(c, "s3://bench/plain", srcs, tmp / "in", env)
            for c in ("resume-get_object", "resume-download_file")
        }
        ranged = run_case("resume-ours", "s3://bench/ours", srcs, tmp / "in", env)
        env1 = {**env, "AIRFLOW_SPOT_S3_CONCURRENCY": "1"}
        one = run_case("resume-ours", "s3://bench/ours", srcs, tmp / "in", env1)
        stream = plains["resume-get_object"]
        dl = f"download_file {plains['resume-download_file']['s']:.1f} s"
        return [
            Row("S3 resume, stock moto", n, mb, ranged, stream, "get_object", dl),
            Row("S3 resume, stock moto, concurrency 1", n, mb, one, stream, "get_object", dl),
        ]
    finally:
        server.terminate()
        server.wait(timeout=30)


def print_rows(rows: list[Row]) -> None:
    print(
        "| operation | files | MiB | ours s | ours MB/s | ours peak MB | plain reference "
        "| plain s | plain peak MB | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rate = r.size_mb * MIB / 1e6 / r.ours["s"]
        note = f" ({r.note})" if r.note else ""
        print(
            f"| {r.op} | {r.files} | {r.size_mb} | {r.ours['s']:.2f} | {rate:.0f} "
            f"| {r.ours['mb']:.0f} | {r.plain_name}{note} | {r.plain['s']:.2f} "
            f"| {r.plain['mb']:.0f} | **{r.ratio:.2f}x** |"
        )


def print_windows(rows: list[Row]) -> None:
    """The largest checkpoint that saves within a 30 s and a 120 s notice, at the measured
    throughput of the biggest size saved as one file."""
    print("\n| save to | at (ours / plain) | in 30 s: ours | plain | in 120 s: ours | plain |")
    print("|---|---|---|---|---|---|")
    for op in ("local save", "S3 save"):
        found = [r for r in rows if r.op == op and r.files == 1]
        if not found:
            continue
        r = max(found, key=lambda r: r.size_mb)
        ours, plain = (r.size_mb * MIB / x["s"] for x in (r.ours, r.plain))
        cells = [f"{rate * w / GIB:.1f} GiB" for w in (30, 120) for rate in (ours, plain)]
        print(
            f"| {op.split()[0]} ({r.plain_name}) | {ours / 1e6:.0f} / {plain / 1e6:.0f} MB/s "
            f"| {' | '.join(cells)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024,4096", help="total MiB per checkpoint")
    ap.add_argument("--files", default="1,8", help="files per checkpoint")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each local case (fastest kept)")
    ap.add_argument("--no-s3", action="store_true", help="local only")
    ap.add_argument("--dir", default=None, help="where the files go (default: the temp dir)")
    args, _ = ap.parse_known_args()  # make bench passes its own arguments to every script
    sizes = [int(x) for x in args.sizes.split(",")]
    counts = [int(x) for x in args.files.split(",")]
    need = max(sizes) * MIB * 4
    free = shutil.disk_usage(args.dir or tempfile.gettempdir()).free
    if free < need + 4 * GIB:
        raise SystemExit(
            f"needs {need / GIB:.0f} GiB free for {max(sizes)} MiB, has {free / GIB:.0f}"
        )
    rows: list[Row] = []
    env = dict(os.environ)
    print(
        f"{os.cpu_count()} CPUs (shared); local: {args.dir or tempfile.gettempdir()}; S3: moto "
        "on 127.0.0.1 over HTTP, its ranged GET reading only the range (stock moto: last rows)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        tmp = Path(d)
        for mb in sizes:
            for n in counts:
                srcs = make_files(tmp / "src", mb, n)
                rows += local_rows(tmp, srcs, mb, args.rounds, env)
                if not args.no_s3:
                    rows += s3_rows(tmp, srcs, mb, "ranged")
                    if mb == min(sizes) and n == 1:
                        rows += stock_moto_rows(tmp, srcs, mb)
                shutil.rmtree(tmp / "src")
                print(f"  done: {mb} MiB in {n} file(s)", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (r.op.startswith("S3"), r.op, r.files, r.size_mb))
    print_rows(rows)
    print_windows(rows)


if __name__ == "__main__":
    main()
