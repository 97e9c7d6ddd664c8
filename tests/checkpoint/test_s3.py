"""Checkpoints in S3: real boto3 against a moto server over HTTP (moto is the only stand-in:
no real S3 is reachable here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import boto3
import pytest

from airflow_spot.checkpoint import Checkpoints, open_store
from airflow_spot.checkpoint.s3 import S3Store
from airflow_spot.exceptions import CheckpointError
from airflow_spot.testing import train_command


@pytest.fixture(scope="module")
def s3_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="spot-ckpt")
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def test_s3_round_trip_retention_and_corruption(s3_server) -> None:
    """Save, retain the last 2, skip a corrupted newest one, load the one before, over HTTP."""
    store = open_store("s3://spot-ckpt/jobs/run-1")
    assert isinstance(store, S3Store)
    c = Checkpoints(store, keep=2)
    for step in (10, 20, 30):
        c.save(step, {"weights.npy": f"w{step}".encode()}, now=step, total_steps=100)
    assert c.manifests() == ["ckpt-000000000030", "ckpt-000000000020"]
    keys = store.list()
    assert all(not k.startswith("ckpt-000000000010") for k in keys)
    store.put("ckpt-000000000030/weights.npy", b"corrupted")
    m = c.latest_valid()
    assert m.step == 20 and c.load(m) == {"weights.npy": b"w20"}
    raw = boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"]).list_objects_v2(
        Bucket="spot-ckpt", Prefix="jobs/run-1/"
    )
    assert all(o["Key"].startswith("jobs/run-1/ckpt-") for o in raw["Contents"])


def test_training_resumes_from_s3(s3_server, tmp_path: Path) -> None:
    """The example training job checkpoints to S3 and a second run resumes from it to the same model."""
    env = {**os.environ, **s3_server}
    args = train_command(40, save_every=10, seed=3)
    subprocess.run(
        args + ["--checkpoint-uri", "s3://spot-ckpt/resume"],
        env=env,
        check=True,
        capture_output=True,
    )
    c = Checkpoints(open_store("s3://spot-ckpt/resume"))
    assert c.latest_valid().step == 40
    subprocess.run(
        args + ["--checkpoint-uri", str(tmp_path / "local")], check=True, capture_output=True
    )
    local = Checkpoints(open_store(str(tmp_path / "local")))
    assert c.load(c.latest_valid()) == local.load(local.latest_valid())


def test_s3_claim_is_one_conditional_write(s3_server) -> None:
    """The first claim of a location records its owner (If-None-Match: *); a second one sees
    the first owner and changes nothing."""
    c = Checkpoints(open_store("s3://spot-ckpt/jobs/claimed"))
    assert c.claim({"run_id": "a", "map_index": 0}) is None
    assert c.claim({"run_id": "a", "map_index": 1}) == {"run_id": "a", "map_index": 0}
    c.set_owner({"run_id": "b", "map_index": -1})
    assert c.claim({"run_id": "c", "map_index": -1}) == {"run_id": "b", "map_index": -1}
    assert c.manifests() == []  # the record is not a checkpoint


def test_the_operator_reads_s3_checkpoints_through_its_aws_connection(
    s3_server, tmp_path: Path, monkeypatch
) -> None:
    """A worker without AWS credentials of its own reads an s3:// checkpoint_uri through
    ``aws_conn_id`` (the training process writes with its own); without the connection the
    task fails with a ConfigError naming the field and the fix (was botocore's
    NoCredentialsError, retried by Airflow)."""
    import json
    from datetime import timedelta

    from airflow_spot.backends.local import LocalBackend
    from airflow_spot.exceptions import ConfigError
    from airflow_spot.operators import SpotTrainingOperator
    from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace

    monkeypatch.setenv(
        "AIRFLOW_CONN_SPOT_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {
                    "region_name": "us-east-1",
                    "endpoint_url": s3_server["AWS_ENDPOINT_URL"],
                },
            }
        ),
    )
    for k in s3_server:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    trace = scripted_trace(tmp_path / "t.json", [(True, 5000)])

    def op(uri: str, env: dict | None = None, **kw) -> SpotTrainingOperator:
        return SpotTrainingOperator(
            task_id="train",
            command=train_command(20, save_every=5),
            checkpoint_uri=uri,
            expected_compute=timedelta(seconds=1),
            total_steps=20,
            deadline=timedelta(seconds=60),
            changeover=timedelta(seconds=0.1),
            policy="greedy",
            backend=LocalBackend(
                trace=str(trace),
                polarity="available",
                time_scale=1.0,
                work_dir=str(tmp_path / "runs"),
                extra_env=dict(s3_server) if env is None else env,  # the trainer's own
            ),
            decision_interval=timedelta(seconds=0.5),
            poll_interval=0.05,
            deferrable=False,
            **kw,
        )

    store = FileTaskStateStore(tmp_path / "a.json")
    summary = op("s3://spot-ckpt/conn-run", aws_conn_id="spot_s3").execute(make_context(store))
    assert summary["final_checkpoint"]["step"] == 20
    with pytest.raises(ConfigError, match=r"checkpoint_uri: no AWS credentials .*aws_conn_id"):
        op("s3://spot-ckpt/no-conn").execute(make_context(FileTaskStateStore(tmp_path / "b")))
    with pytest.raises(ConfigError, match="aws_conn_id: must be an Airflow connection id"):
        op("s3://spot-ckpt/x", aws_conn_id=3)
    # the training process without credentials of its own stops with exit 78, which fails
    # the task at once with the advice that fits it (it used to spend the failure budget
    # relaunching, and the message told the user to give the operator aws_conn_id)
    bare = {
        "AWS_ENDPOINT_URL": s3_server["AWS_ENDPOINT_URL"],
        "AIRFLOW_SPOT_CREDENTIALS_WAIT_S": "0",  # no wait for credentials that never come
    }
    with pytest.raises(ConfigError) as e:
        op("s3://spot-ckpt/bare", env=bare, aws_conn_id="spot_s3").execute(
            make_context(FileTaskStateStore(tmp_path / "c"))
        )
    assert str(e.value).startswith("command: the training process stopped on a configuration error")
    assert "the training process has no AWS credentials" in str(e.value)
    assert "extra_env" in str(e.value)
    state = json.loads((tmp_path / "c").read_text())
    assert len(state["airflow_spot_job"]["attempts"]) == 1  # not relaunched


def test_big_files_go_to_s3_in_parts_and_a_watcher_reads_only_their_size(
    s3_server, tmp_path: Path, monkeypatch
) -> None:
    """A file above the multipart size is uploaded and downloaded in parts (one PUT stops at
    5 GB), given as a path or as bytes; a watcher with ``hash_up_to`` checks it with HEAD
    alone (no GetObject), and resume_to downloads it whole."""
    from airflow_spot.checkpoint import s3
    from airflow_spot.checkpoint.training import TrainingSession

    monkeypatch.setattr(s3, "MULTIPART_FROM", 5 << 20)  # S3's smallest part
    monkeypatch.setattr(s3, "SINGLE_PUT_MAX", 5 << 20)  # bytes above it go in parts too
    big = tmp_path / "model.pt"
    big.write_bytes(os.urandom(12 << 20))
    s = TrainingSession("s3://spot-ckpt/big", total_steps=10, save_every=5)
    s.step_done(5, lambda: {"model.pt": big, "opt.bin": b"o" * (6 << 20)})
    client = boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"])
    for name in ("model.pt", "opt.bin"):
        etag = client.head_object(Bucket="spot-ckpt", Key=f"big/ckpt-000000000005/{name}")["ETag"]
        assert "-" in etag  # a multipart upload's ETag is "<md5 of md5s>-<parts>"
    watcher = Checkpoints(open_store("s3://spot-ckpt/big"), hash_up_to=1 << 20)
    calls: list[str] = []
    watcher.store.client.meta.events.register(
        "before-call.s3.*", lambda model, **kw: calls.append(model.name)
    )
    assert watcher.latest_valid().step == 5
    assert "GetObject" in calls and calls.count("HeadObject") == 2  # manifest read, files sized
    assert calls.count("GetObject") == 1
    step, files = TrainingSession("s3://spot-ckpt/big", total_steps=10).resume_to(tmp_path / "in")
    assert step == 5 and files["model.pt"].read_bytes() == big.read_bytes()
    assert files["opt.bin"].stat().st_size == 6 << 20
    with pytest.raises(CheckpointError, match="does not exist"):
        watcher.store.get_file("ckpt-000000000005/nothing", tmp_path / "n")
    with pytest.raises(CheckpointError, match="does not exist"):
        watcher.store.stat("ckpt-000000000005/nothing")
    assert not (tmp_path / "n").exists()


def test_retention_aborts_the_upload_a_killed_save_left(s3_server) -> None:
    """A save killed mid-upload leaves an unfinished multipart upload: invisible to listings
    but billed. Retention aborts it with the checkpoints older than those it keeps."""
    client = boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"])
    up = client.create_multipart_upload(Bucket="spot-ckpt", Key="torn/ckpt-000000000001/m.pt")
    client.upload_part(
        Bucket="spot-ckpt",
        Key="torn/ckpt-000000000001/m.pt",
        UploadId=up["UploadId"],
        PartNumber=1,
        Body=b"x" * (5 << 20),
    )
    c = Checkpoints(open_store("s3://spot-ckpt/torn"), keep=1)
    c.save(2, {"m.pt": b"2"}, now=0)
    c.save(3, {"m.pt": b"3"}, now=1)
    assert (
        client.list_multipart_uploads(Bucket="spot-ckpt", Prefix="torn/").get("Uploads", []) == []
    )
    assert c.manifests() == ["ckpt-000000000003"]


def test_a_trainer_waits_for_credentials_a_new_node_has_not_served_yet(
    s3_server, monkeypatch
) -> None:
    """A spot node just up may answer for its role's credentials a few seconds late; the
    training process waits (up to $AIRFLOW_SPOT_CREDENTIALS_WAIT_S) instead of failing the
    task for good with exit 78."""
    import threading

    from airflow_spot.checkpoint.training import TrainingSession

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AIRFLOW_SPOT_CREDENTIALS_WAIT_S", "20")

    def served() -> None:
        os.environ["AWS_ACCESS_KEY_ID"] = s3_server["AWS_ACCESS_KEY_ID"]
        os.environ["AWS_SECRET_ACCESS_KEY"] = s3_server["AWS_SECRET_ACCESS_KEY"]

    timer = threading.Timer(1.0, served)
    timer.start()
    try:
        assert TrainingSession("s3://spot-ckpt/late-creds", total_steps=5).resume() == (0, None)
    finally:
        timer.cancel()
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ[k] = s3_server[k]


def test_a_role_without_multipart_listing_is_told_once(caplog) -> None:
    """Retention aborts killed uploads; a least-privilege role may not list them. That is
    said once in the log, and saves go on (it was an error at every save)."""
    from botocore.stub import Stubber

    client = boto3.client(
        "s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    store = S3Store("spot-ckpt", "p", client=client)
    with Stubber(client) as stub:
        stub.add_client_error(
            "list_multipart_uploads", service_error_code="AccessDenied", http_status_code=403
        )
        with caplog.at_level("WARNING"):
            store.discard_partial("ckpt-", "ckpt-000000000002")
            store.discard_partial("ckpt-", "ckpt-000000000003")  # no call: the stub has none
    said = [r for r in caplog.records if "s3:ListBucketMultipartUploads" in r.getMessage()]
    assert len(said) == 1


def _parts_env(monkeypatch, part_mb: int = 5, concurrency: int = 3) -> None:
    monkeypatch.setenv("AIRFLOW_SPOT_S3_PART_MB", str(part_mb))  # S3's smallest part
    monkeypatch.setenv("AIRFLOW_SPOT_S3_CONCURRENCY", str(concurrency))
    monkeypatch.setenv("AIRFLOW_SPOT_S3_DOWNLOAD", "ranged")  # (the default is one stream)


def test_a_resume_streams_each_file_in_one_get_by_default(
    s3_server, tmp_path: Path, monkeypatch
) -> None:
    """By default a file comes down in one streamed GET (no ranges), hashed on the way:
    a whole object resumes, one replaced by other bytes of the same size is skipped."""
    monkeypatch.setenv("AIRFLOW_SPOT_S3_PART_MB", "5")
    for name in ("AIRFLOW_SPOT_S3_CONCURRENCY", "AIRFLOW_SPOT_S3_DOWNLOAD"):
        monkeypatch.delenv(name, raising=False)
    model = tmp_path / "model.pt"
    model.write_bytes(os.urandom((11 << 20) + 3))  # 3 parts up
    store = S3Store("spot-ckpt", "stream")
    c = Checkpoints(store, keep=5)
    c.save(1, {"model.pt": model}, now=1)
    c.save(2, {"model.pt": model}, now=2)
    boto3.client("s3").put_object(
        Bucket="spot-ckpt",
        Key="stream/ckpt-000000000002/model.pt",
        Body=os.urandom((11 << 20) + 3),
    )
    gets: list[str | None] = []
    store.client.meta.events.register(
        "provide-client-params.s3.GetObject", lambda params, **kw: gets.append(params.get("Range"))
    )
    found = c.load_latest_to(tmp_path / "in")
    assert found is not None
    m, files = found
    assert m.step == 1 and files["model.pt"].read_bytes() == model.read_bytes()
    assert gets == [None] * 4  # each try: its manifest, then its file in one stream


def test_concurrent_parts_arriving_out_of_order_hash_in_order(
    s3_server, tmp_path: Path, monkeypatch
) -> None:
    """A file goes up in concurrent parts and comes down in concurrent ranges, hashed as it
    crosses; with the second part held back so that later ones finish first, both ways,
    the digest is still that of the file, and a resume never reads it again."""
    import time

    from airflow_spot.checkpoint import checkpoints
    from airflow_spot.checkpoint.hashing import file_digest
    from airflow_spot.checkpoint.training import TrainingSession

    _parts_env(monkeypatch)
    model = tmp_path / "model.pt"
    model.write_bytes(os.urandom((21 << 20) + 7))  # 5 parts, the last one short
    held: list[str] = []

    def hold_second(params, model, **kw) -> None:
        if params.get("PartNumber") == 2 or str(params.get("Range", "")).startswith(
            f"bytes={5 << 20}-"
        ):
            held.append(model.name)
            time.sleep(0.4)

    s = TrainingSession("s3://spot-ckpt/parts", total_steps=10, save_every=5)
    s.checkpoints.store.client.meta.events.register("provide-client-params.s3.*", hold_second)
    saved = s.step_done(5, lambda: {"model.pt": model})
    assert (saved.files["model.pt"].digest, saved.files["model.pt"].size) == file_digest(
        model, saved.files["model.pt"].algo
    )
    head = boto3.client("s3").head_object(
        Bucket="spot-ckpt", Key="parts/ckpt-000000000005/model.pt"
    )
    assert head["ETag"].endswith('-5"')  # five parts
    monkeypatch.setattr(checkpoints, "file_digest", lambda *a: pytest.fail("read twice"))
    r = TrainingSession("s3://spot-ckpt/parts", total_steps=10)
    r.checkpoints.store.client.meta.events.register("provide-client-params.s3.*", hold_second)
    step, files = r.resume_to(tmp_path / "in")
    assert step == 5 and files["model.pt"].read_bytes() == model.read_bytes()
    assert held == ["UploadPart", "GetObject"]


def test_a_corrupt_object_or_a_failed_part_never_makes_a_checkpoint(
    s3_server, tmp_path: Path, monkeypatch
) -> None:
    """An object replaced by other bytes of the same size is skipped on resume (concurrent
    ranges); a part that fails for good fails the save: no manifest, the upload aborted
    (nothing left billed), and the checkpoint before is the one resumed."""
    from botocore.exceptions import ClientError

    from airflow_spot.checkpoint.training import TrainingSession

    _parts_env(monkeypatch)
    model = tmp_path / "model.pt"
    model.write_bytes(os.urandom(12 << 20))
    c = Checkpoints(open_store("s3://spot-ckpt/bad-parts"), keep=5)
    c.save(1, {"model.pt": model}, now=1)
    c.save(2, {"model.pt": model}, now=2)
    other = os.urandom(12 << 20)
    boto3.client("s3").put_object(
        Bucket="spot-ckpt", Key="bad-parts/ckpt-000000000002/model.pt", Body=other
    )

    def deny_part_3(params, **kw) -> None:
        if params.get("PartNumber") == 3:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "UploadPart")

    c.store.client.meta.events.register("provide-client-params.s3.UploadPart", deny_part_3)
    with pytest.raises(CheckpointError, match="AccessDenied"):
        c.save(3, {"model.pt": model}, now=3)
    assert c.manifests() == ["ckpt-000000000002", "ckpt-000000000001"]
    uploads = boto3.client("s3").list_multipart_uploads(Bucket="spot-ckpt", Prefix="bad-parts/")
    assert uploads.get("Uploads", []) == []
    step, files = TrainingSession("s3://spot-ckpt/bad-parts", total_steps=5).resume_to(
        tmp_path / "in"
    )
    assert step == 1 and files["model.pt"].read_bytes() == model.read_bytes()


@pytest.mark.parametrize(
    ("name", "value", "fix"),
    [
        ("AIRFLOW_SPOT_S3_PART_MB", "4", "a whole number from 5"),
        ("AIRFLOW_SPOT_S3_CONCURRENCY", "many", "a whole number from 1"),
        ("AIRFLOW_SPOT_S3_DOWNLOAD", "parallel", "stream or ranged"),
    ],
)
def test_a_bad_part_size_or_concurrency_names_the_variable(
    s3_server, tmp_path: Path, monkeypatch, name: str, value: str, fix: str
) -> None:
    from airflow_spot.exceptions import ConfigError

    monkeypatch.setenv(name, value)
    (tmp_path / "m").write_bytes(b"m")
    with pytest.raises(ConfigError, match=f"{name}: {value!r}: give {fix}"):
        Checkpoints(open_store("s3://spot-ckpt/bad-env")).save(1, {"m": tmp_path / "m"}, now=0)


def test_the_files_of_a_save_share_one_client_and_one_set_of_slots(monkeypatch) -> None:
    """The files of a save start at once, each asking the store for its client and its part
    slots: one client is built (each loads botocore's S3 model, ~25 MB while parsed) and one
    set of slots bounds the parts of them all."""
    import threading
    import time

    built: list[int] = []
    real = boto3.session.Session.client

    def slow_client(self, *args, **kwargs):
        built.append(1)
        time.sleep(0.2)  # the others ask meanwhile
        return real(self, *args, **kwargs)

    monkeypatch.setattr(boto3.session.Session, "client", slow_client)
    store = S3Store("spot-ckpt", "shared")
    got: list[tuple[object, object]] = []
    threads = [
        threading.Thread(target=lambda: got.append((store.client, store.parts))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    assert len({id(c) for c, _ in got}) == len({id(p) for _, p in got}) == 1


def test_a_resume_asks_for_one_listing_one_manifest_and_each_file_once(
    s3_server, tmp_path: Path, monkeypatch
) -> None:
    """What a resume asks of S3 beyond the plain GET of a key it knew: one listing (which
    checkpoint is newest) and its manifest (what to check the bytes against); then one
    streamed GET a file, and nothing else (no HEAD, no ranges)."""
    from airflow_spot.checkpoint.training import TrainingSession

    for name in ("AIRFLOW_SPOT_S3_CONCURRENCY", "AIRFLOW_SPOT_S3_DOWNLOAD"):
        monkeypatch.delenv(name, raising=False)
    files = {}
    for i in range(3):
        files[f"shard{i}.bin"] = tmp_path / f"shard{i}.bin"
        files[f"shard{i}.bin"].write_bytes(os.urandom(1000 + i))
    uri = "s3://spot-ckpt/requests"
    TrainingSession(uri, total_steps=2, save_every=1).step_done(1, lambda: dict(files))
    r = TrainingSession(uri, total_steps=2)
    asked: list[str] = []
    r.checkpoints.store.client.meta.events.register(
        "before-call.s3", lambda model, **kw: asked.append(model.name)
    )
    step, got = r.resume_to(tmp_path / "in")
    assert step == 1 and sorted(got) == sorted(files)
    assert sorted(asked) == ["GetObject"] * 4 + ["ListObjectsV2"]
