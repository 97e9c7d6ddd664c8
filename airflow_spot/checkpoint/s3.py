"""A checkpoint store in S3 (or an S3-compatible service) through boto3, imported only when
a store is used: big files go up in concurrent parts and come down in one stream (or
ranges), hashed on the way (:mod:`.s3parts`), a passing error (5xx, throttling, a cut
connection) is retried for a while, and the errors a user fixes (no credentials, no such
bucket) are a ConfigError naming ``checkpoint_uri`` and the fix."""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from airflow_spot.checkpoint import s3parts
from airflow_spot.checkpoint.base import error_code, must_exist, safe_key, tmp_beside
from airflow_spot.checkpoint.hashing import SHA256, new_hasher
from airflow_spot.exceptions import CheckpointError, ConfigError
from airflow_spot.settings import S3_RETRY_ENV as S3_RETRY_ENV  # (tests and chaos import it here)
from airflow_spot.settings import s3_retry_s

log = logging.getLogger(__name__)
CREDENTIALS_WAIT_ENV = "AIRFLOW_SPOT_CREDENTIALS_WAIT_S"  # a trainer's wait for AWS credentials
MULTIPART_FROM = 64 << 20  # S3: a file above this goes up and down in parts
SINGLE_PUT_MAX = 5 << 30  # S3: the most one PUT takes (bytes above it go in parts)
S3_RETRY_MAX_WAIT_S = 4.0  # the longest wait between two tries
# S3 error codes that pass by themselves (5xx and throttling)
TRANSIENT_CODES = frozenset(
    {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
     "RequestTimeout", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
)  # fmt: skip


def _transient(e: BaseException) -> bool:
    """Whether an S3 error passes by itself: a 5xx or throttling answer, or a connection
    refused, cut or timed out (also mid-body, where botocore has stopped retrying); SSL
    errors and every 4xx are not."""
    from botocore.exceptions import (
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        SSLError,
    )

    seen: BaseException | None = e
    while seen is not None:  # boto3's transfers wrap the error (S3UploadFailedError)
        if isinstance(seen, SSLError):
            return False
        if isinstance(seen, (ConnectionError, HTTPClientError, IncompleteReadError)):
            return True
        if error_code(seen) in TRANSIENT_CODES:
            return True
        last = getattr(seen, "last_exception", None)  # boto3's RetriesExceededError
        seen = last if isinstance(last, BaseException) else seen.__cause__ or seen.__context__
    return False


def _retried(self, method, args, kwargs):
    """``method``, tried again with backoff while it fails with a passing error, for up to
    ``[spot_training] s3_retry_s`` seconds (in the training process ``$AIRFLOW_SPOT_S3_RETRY_S``,
    which the operator sets from it at launch; botocore's own retries give up after seconds, and
    not at all once a body streams): a trainer then rides out S3 throttling or a dropped
    connection instead of exiting 1, and a watcher's look does not fail its task's try."""
    start, give_up = time.monotonic(), None
    delay = 0.5
    while True:
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            if give_up is None:  # read at the first failure: an Airflow process reads its
                # configuration for it, a cost every call would pay (~5 ms)
                give_up = start + s3_retry_s(airflow=not self.training)
            left = give_up - time.monotonic()
            if not _transient(e) or left <= 0:
                raise
            wait = min(delay * random.uniform(0.5, 1.0), left)
            log.warning(
                "%s: %s failed (%s: %s); trying again in %.1f s (for %.0f s more).",
                self.uri,
                method.__name__,
                type(e).__name__,
                e,
                wait,
                left,
            )
            time.sleep(wait)
            delay = min(delay * 2, S3_RETRY_MAX_WAIT_S)


# a listing's next page: where its answer says it goes on, and the argument that asks for it
_NEXT = {
    "NextContinuationToken": "ContinuationToken",  # list_objects_v2
    "NextKeyMarker": "KeyMarker",  # list_multipart_uploads (with the next one)
    "NextUploadIdMarker": "UploadIdMarker",
}


def _pages(method: Callable[..., dict[str, Any]], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every page of a listing, asked for one after another. Not botocore's paginator:
    the first one a client builds loads its model (~14 ms, on every resume's first listing)."""
    while True:
        page = method(**kwargs)
        yield page
        follow = {arg: page[key] for key, arg in _NEXT.items() if page.get(key)}
        if not page.get("IsTruncated") or not follow:
            return
        if all(kwargs.get(arg) == value for arg, value in follow.items()):
            raise CheckpointError(f"a listing of {kwargs.get('Prefix')!r} did not move on")
        kwargs.update(follow)


def _named(method):
    """Retry passing S3 errors for a while (:func:`_retried`), and turn the errors a user
    fixes (no credentials, no such bucket) into a ConfigError naming ``checkpoint_uri`` and
    the fix, instead of botocore's traceback on every retry."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return _retried(self, method, args, kwargs)
        except Exception as e:
            kind = type(e).__name__
            code = error_code(e)
            if kind == "S3UploadFailedError" and "NoSuchBucket" in str(e):
                code = "NoSuchBucket"  # a managed (multipart) upload wraps the ClientError
            if kind in ("NoCredentialsError", "PartialCredentialsError"):
                raise ConfigError(
                    "checkpoint_uri",
                    f"the training process has no AWS credentials to reach {self.uri} ({e}): "
                    "give it some (LocalBackend(extra_env={'AWS_ACCESS_KEY_ID': ..., "
                    "'AWS_SECRET_ACCESS_KEY': ...}), KubernetesBackend(env_from_secrets=...) or "
                    "a pod role); the operator's aws_conn_id serves only the Airflow worker"
                    if self.training
                    else f"no AWS credentials to reach {self.uri} ({e}): give the operator "
                    "aws_conn_id (an Airflow AWS connection), or give this process credentials "
                    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance or pod role)",
                ) from e
            if code == "NoSuchBucket":
                raise ConfigError(
                    "checkpoint_uri",
                    f"{self.uri}: bucket {self.bucket!r} does not exist (or is not on this "
                    "endpoint); create it or fix the URI",
                ) from e
            raise

    return call


class S3Store:
    """``s3://bucket/prefix`` through boto3; endpoint and credentials from the environment
    (``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ...) or a given client."""

    def __init__(
        self, bucket: str, prefix: str = "", client=None, *, training: bool = False
    ) -> None:
        self.training = training  # in the training process (says so in its errors)
        self._no_upload_listing = False
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client = client
        self._parts: s3parts.Parts | None = None  # the part size, concurrency and slots
        # the files of a save start at once: one client and one set of slots for them all
        # (each client built loads botocore's S3 model, ~25 MB while it is parsed)
        self._first_use = threading.Lock()

    @property
    def parts(self) -> s3parts.Parts:
        """Read from the environment at the first transfer (a bad value: a ConfigError)."""
        with self._first_use:
            if self._parts is None:
                self._parts = s3parts.Parts(s3parts.Tuning.from_env())
        return self._parts

    @property
    def client(self):
        if self._client is not None:
            return self._client
        with self._first_use:
            if self._client is None:
                self._client = self._new_client()
        return self._client

    def _new_client(self):
        """A client of a session of its own: boto3's default one keeps the credentials it
        first found."""
        import boto3

        session = boto3.session.Session()
        if self.training:  # a spot node just up may not serve its role's credentials yet:
            # wait a little rather than fail the task for good (exit 78)
            until = time.monotonic() + float(os.environ.get(CREDENTIALS_WAIT_ENV, "30"))
            while session.get_credentials() is None and time.monotonic() < until:
                time.sleep(min(5.0, max(0.0, until - time.monotonic())))
                session = boto3.session.Session()
        return session.client(
            "s3",
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL"),
        )

    def _key(self, key: str) -> str:
        safe_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    @staticmethod
    def _transfer():
        from boto3.s3.transfer import TransferConfig

        # s3transfer widens the parts itself when a file would need more than 10,000
        return TransferConfig(
            multipart_threshold=MULTIPART_FROM, multipart_chunksize=MULTIPART_FROM
        )

    @_named
    def put(self, key: str, data: bytes) -> None:
        if len(data) <= SINGLE_PUT_MAX:  # one PUT: no copy of the data in parts
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
            return
        import io

        self.client.upload_fileobj(
            io.BytesIO(data), self.bucket, self._key(key), Config=self._transfer()
        )

    @_named
    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a local file, in parts above 64 MB (one PUT stops at 5 GB)."""
        self.client.upload_file(
            os.fspath(path), self.bucket, self._key(key), Config=self._transfer()
        )

    @_named
    def put_file_hashed(self, key: str, path: str | os.PathLike[str], algo: str) -> tuple[str, int]:
        """Upload a local file in concurrent parts, hashing it as it is read (one pass)."""
        return s3parts.upload(
            self.client, self.bucket, self._key(key), os.fspath(path), algo, self.parts
        )

    @_named
    def get_file_hashed(self, key: str, path: str | os.PathLike[str], algo: str) -> tuple[str, int]:
        """Download ``key`` to a local file (one stream, or concurrent ranges), hashing it on
        the way (written beside it, then renamed); each try starts a fresh file."""
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_beside(dest)
        try:
            with must_exist(self.uri, key), open(tmp, "xb") as fh:
                got = s3parts.download(
                    self.client, self.bucket, self._key(key), fh.fileno(), algo, self.parts
                )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return got

    @_named
    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Download ``key`` to a local file (in parts; written beside it, then renamed)."""
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_beside(dest)
        try:
            with must_exist(self.uri, key):
                self.client.download_file(
                    self.bucket, self._key(key), os.fspath(tmp), Config=self._transfer()
                )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    @_named
    def stat(self, key: str) -> tuple[int, str]:
        """Size and ETag (a HEAD: nothing is downloaded)."""
        with must_exist(self.uri, key):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return int(head["ContentLength"]), str(head["ETag"])

    @_named
    def discard_partial(self, prefix: str, below: str) -> None:
        """Abort multipart uploads that a killed writer left (invisible, but billed) under
        top-level folders starting with ``prefix`` that sort below ``below``."""
        from botocore.exceptions import ClientError

        if self._no_upload_listing:
            return
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            for page in _pages(
                self.client.list_multipart_uploads, Bucket=self.bucket, Prefix=base + prefix
            ):
                for up in page.get("Uploads", []):
                    if up["Key"][len(base) :].split("/")[0] < below:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                        )
        except ClientError as e:
            if error_code(e) not in ("AccessDenied", "403"):
                raise
            self._no_upload_listing = True  # said once, not at every save
            log.warning(
                "%s: not allowed to list or abort unfinished multipart uploads (%s); uploads "
                "cut off by a kill stay until a lifecycle rule (AbortIncompleteMultipartUpload) "
                "removes them. Grant s3:ListBucketMultipartUploads and s3:AbortMultipartUpload.",
                self.uri,
                e,
            )

    @_named
    def digest(self, key: str, algo: str = SHA256) -> tuple[str, int]:
        with must_exist(self.uri, key):
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        return s3parts.hash_body(body, new_hasher(algo))  # one reused buffer, as resumes read

    @_named
    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist (S3 conditional write); False if it did."""
        from botocore.exceptions import ClientError

        for _ in range(5):
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
                return True
            except ClientError as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "412"):
                    return False
                if code in ("ConditionalRequestConflict", "409"):
                    continue  # a simultaneous write to the key: S3 says try again
                if code not in ("NotImplemented", "501"):
                    raise
                # an S3-compatible store without conditional writes: look, then write (racy)
                if key in self.list(key):
                    return False
                self.put(key, data)
                return True
        if key in self.list(key):
            return False  # the other writer won
        raise CheckpointError(f"{self.uri}/{key}: conditional write kept conflicting; try again")

    @_named
    def get(self, key: str) -> bytes:
        with must_exist(self.uri, key):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    @_named
    def list(self, prefix: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        out = []
        for page in _pages(self.client.list_objects_v2, Bucket=self.bucket, Prefix=base + prefix):
            out += [o["Key"][len(base) :] for o in page.get("Contents", [])]
        return sorted(out)

    @_named
    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
