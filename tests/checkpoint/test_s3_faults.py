"""S3 faults: the checkpoint store retries what passes by itself (5xx, throttling, a connection
cut, also mid-body), through the fault proxy in front of a moto server, with botocore's own
retries off (``AWS_MAX_ATTEMPTS=1``) so that every fault reaches the store."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
    SSLError,
)

from airflow_spot.checkpoint import open_store
from airflow_spot.checkpoint.s3 import S3_RETRY_ENV, _transient
from airflow_spot.checkpoint.training import TrainingSession
from airflow_spot.exceptions import CheckpointError
from airflow_spot.testing.faults import FaultProxy, Mode


@pytest.fixture(scope="module")
def s3_proxy() -> Iterator[FaultProxy]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket="spot-faults")
    with FaultProxy((host, port), seed=3) as proxy:
        yield proxy
    server.stop()


@pytest.fixture
def via_proxy(s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> FaultProxy:
    for k, v in {
        "AWS_ENDPOINT_URL": s3_proxy.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",  # botocore gives up at once: the store's retries must hold
    }.items():
        monkeypatch.setenv(k, v)
    s3_proxy.set(Mode.PASS)
    s3_proxy.hits.clear()
    return s3_proxy


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")


def _upload_failed(code: str) -> S3UploadFailedError:
    try:
        try:
            raise _client_error(code)
        except ClientError as e:
            raise S3UploadFailedError(f"Failed to upload: {e}")  # noqa: B904 - as boto3 does
    except S3UploadFailedError as wrapped:
        return wrapped


URL = "http://127.0.0.1:1/b/k"


@pytest.mark.parametrize(
    ("error", "passes"),
    [
        (_client_error("SlowDown"), True),
        (_client_error("InternalError"), True),
        (_client_error("503"), True),
        (_client_error("ServiceUnavailable"), True),
        (_client_error("NoSuchKey"), False),
        (_client_error("AccessDenied"), False),
        (_client_error("PreconditionFailed"), False),
        (ConnectionClosedError(endpoint_url=URL), True),
        (EndpointConnectionError(endpoint_url=URL), True),
        (ReadTimeoutError(endpoint_url=URL), True),
        (ResponseStreamingError(error="Connection broken: IncompleteRead"), True),
        (IncompleteReadError(actual_bytes=144, expected_bytes=288), True),
        (RetriesExceededError(ConnectionClosedError(endpoint_url=URL)), True),
        (_upload_failed("SlowDown"), True),
        (_upload_failed("NoSuchBucket"), False),
        (SSLError(endpoint_url=URL, error="certificate verify failed"), False),
        (NoCredentialsError(), False),
        (ValueError("not an S3 error"), False),
    ],
)
def test_which_s3_errors_pass_by_themselves(error: BaseException, passes: bool) -> None:
    """5xx, throttling and cut connections (also mid-body, also wrapped by boto3's
    transfers) are retried; 4xx, credentials and certificate errors are not."""
    assert _transient(error) is passes


@pytest.mark.parametrize(
    "mode", [Mode.HTTP_500, Mode.THROTTLE, Mode.DROP_REQUEST, Mode.DROP_RESPONSE]
)
def test_a_trainer_saves_and_resumes_through_s3_faults(via_proxy: FaultProxy, mode: Mode) -> None:
    """A save and a resume each meet two faults in a row that botocore does not retry (a
    body cut mid-download, in DROP_RESPONSE, it never retries): both go through, whole. The
    trainer used to exit 1, spending the failure budget."""
    uri = f"s3://spot-faults/train-{mode.value}"
    via_proxy.set(mode, count=2)
    saved = TrainingSession(uri, total_steps=10, save_every=5).step_done(
        5, lambda: {"weights.npy": b"w" * 300}
    )
    assert saved is not None and saved.step == 5
    via_proxy.set(mode, count=2)
    step, files = TrainingSession(uri, total_steps=10).resume()
    assert (step, files) == (5, {"weights.npy": b"w" * 300})
    assert via_proxy.hits[mode] == 4


def test_a_resume_to_a_folder_rides_out_cut_bodies(
    via_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """A resume into a folder (its bodies read from the connection into one buffer, its
    files downloading while the manifest is read) meets answers cut mid-body: each is
    retried, and every file arrives whole."""
    from airflow_spot.checkpoint import s3parts

    direct: list[int] = []
    real = s3parts._stream_direct
    monkeypatch.setattr(s3parts, "_stream_direct", lambda *a: direct.append(1) or real(*a))
    uri = "s3://spot-faults/train-cut-bodies"
    files = {f"shard{i}.bin": bytes([i]) * (200_000 + i) for i in range(3)}
    TrainingSession(uri, total_steps=10, save_every=5).step_done(5, lambda: dict(files))
    for cuts in (1, 2, 3):
        via_proxy.set(Mode.DROP_RESPONSE, count=cuts)
        step, got = TrainingSession(uri, total_steps=10).resume_to(tmp_path / f"in{cuts}")
        assert step == 5 and {n: p.read_bytes() for n, p in got.items()} == files
    assert via_proxy.hits[Mode.DROP_RESPONSE] == 6 and direct


def test_the_retries_stop_at_their_budget_and_never_retry_a_missing_key(
    via_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``$AIRFLOW_SPOT_S3_RETRY_S=0`` the first SlowDown is raised; a missing key is a
    CheckpointError at once (one request), whatever the budget."""
    store = open_store("s3://spot-faults/budget")
    store.put("a", b"1")
    monkeypatch.setenv(S3_RETRY_ENV, "0")
    via_proxy.set(Mode.THROTTLE, count=1)
    with pytest.raises(ClientError, match="SlowDown"):
        store.get("a")
    monkeypatch.delenv(S3_RETRY_ENV)
    before = sum(via_proxy.hits.values())
    with pytest.raises(CheckpointError, match="does not exist"):
        store.get("nothing")
    assert sum(via_proxy.hits.values()) == before + 1
