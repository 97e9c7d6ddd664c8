"""Spot market and checkpoint access over an Airflow AWS connection.

Built on the amazon provider's ``AwsBaseHook``, so ``aws_default``, assumed roles, profiles and
``endpoint_url`` work as users expect. Results are cached for ``cache_ttl_s``; throttling and
transient errors are retried with exponential backoff; credentials never appear in messages.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_spot.exceptions import BackendError, ConfigError

log = logging.getLogger(__name__)
RETRYABLE = {
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "InternalError",
    "ServiceUnavailable",
    "Unavailable",
    "SlowDown",
    "RequestTimeout",
}
# us-east-1 on-demand Linux prices per hour, used when neither the caller nor the Pricing API gives one
DEFAULT_ON_DEMAND = {
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "g5.xlarge": 1.006,
    "g4dn.xlarge": 0.526,
    "p4d.24xlarge": 32.7726,
    "g5.12xlarge": 5.672,
}


@dataclass(frozen=True)
class PricePoint:
    zone: str
    instance_type: str
    price: float
    at: datetime


class SpotMarketHook(AwsBaseHook):
    """EC2 spot prices, on-demand prices and S3 checkpoint access through one AWS connection.

    :param aws_conn_id: the Airflow AWS connection (default ``aws_default``).
    :param cache_ttl_s: how long price answers are reused.
    :param on_demand_prices: ``{instance_type: price per hour}`` overriding the Pricing API.
    :param max_attempts: tries for a throttled or transiently failing call.
    """

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "AWS spot market"

    def __init__(
        self,
        *args: Any,
        cache_ttl_s: float = 300.0,
        on_demand_prices: dict[str, float] | None = None,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("client_type", "ec2")
        super().__init__(*args, **kwargs)
        self.cache_ttl_s = cache_ttl_s
        self.on_demand_prices = dict(on_demand_prices or {})
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._cache: dict[tuple, tuple[float, Any]] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def _cached(self, key: tuple, fn):
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.cache_ttl_s:
            return hit[1]
        value = fn()
        self._cache[key] = (now, value)
        return value

    def _call(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError, EndpointConnectionError

        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn(*args, **kwargs)
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                if code in RETRYABLE and attempt < self.max_attempts:
                    delay = self.backoff_s * 2 ** (attempt - 1)
                    log.warning(
                        "%s throttled or unavailable (%s); retrying in %.1f s (%d/%d).",
                        what,
                        code,
                        delay,
                        attempt,
                        self.max_attempts,
                    )
                    time.sleep(delay)
                    continue
                raise _translate(what, code) from e
            except EndpointConnectionError as e:
                if attempt < self.max_attempts:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                raise BackendError(
                    f"{what}: cannot reach the AWS endpoint ({e.kwargs.get('endpoint_url', '?')})"
                ) from e
        raise BackendError(f"{what}: gave up after {self.max_attempts} attempts")

    # -- validation -------------------------------------------------------------------------
    def client(self):
        """The EC2 client; a malformed connection is a ConfigError naming ``aws_conn_id``."""
        try:
            return self.get_conn()
        except Exception as e:  # noqa: BLE001 - any failure to build the client is the connection's
            raise ConfigError(
                "aws_conn_id",
                f"cannot use AWS connection {self.aws_conn_id!r}: {type(e).__name__}: "
                f"{_redact(str(e))}; fix the connection's extra (JSON) or credentials",
            ) from e

    def validate(self, instance_type: str, zones: list[str] | None = None) -> None:
        """Fail with a named field if the instance type or a zone does not exist here."""
        ec2 = self.client()
        self._cached(
            ("type", instance_type),
            lambda: self._call(
                f"instance_type {instance_type!r}",
                ec2.describe_instance_types,
                InstanceTypes=[instance_type],
            ),
        )
        if zones:
            known = self._cached(
                ("zones",),
                lambda: {
                    z["ZoneName"]
                    for z in self._call("zones", ec2.describe_availability_zones)[
                        "AvailabilityZones"
                    ]
                },
            )
            bad = [z for z in zones if z not in known]
            if bad:
                raise ConfigError(
                    "zones",
                    f"unknown availability zone(s) {bad} in region {self.region_name}; known: {sorted(known)}",
                )

    # -- prices -----------------------------------------------------------------------------
    def spot_price_history(
        self,
        instance_type: str,
        zones: list[str] | None = None,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[PricePoint]:
        """Spot price changes (Linux/UNIX) per zone between ``start`` and ``end`` (cached)."""
        ec2 = self.client()
        kwargs: dict[str, Any] = {
            "InstanceTypes": [instance_type],
            "ProductDescriptions": ["Linux/UNIX"],
        }
        if zones:
            kwargs["Filters"] = [{"Name": "availability-zone", "Values": list(zones)}]
        if start:
            kwargs["StartTime"] = start
        if end:
            kwargs["EndTime"] = end

        def fetch() -> list[PricePoint]:
            out: list[PricePoint] = []
            token = None
            while True:
                page = self._call(
                    "describe_spot_price_history",
                    ec2.describe_spot_price_history,
                    **kwargs,
                    **({"NextToken": token} if token else {}),
                )
                for h in page.get("SpotPriceHistory", []):
                    out.append(
                        PricePoint(
                            h["AvailabilityZone"],
                            h["InstanceType"],
                            float(h["SpotPrice"]),
                            h["Timestamp"],
                        )
                    )
                token = page.get("NextToken")
                if not token:
                    return sorted(out, key=lambda p: p.at)

        key = ("history", instance_type, tuple(zones or ()), start, end)
        return self._cached(key, fetch)

    def current_spot_prices(
        self, instance_type: str, zones: list[str] | None = None, *, now: datetime | None = None
    ) -> dict[str, float]:
        """The latest spot price per zone (from the last day of history)."""
        now = now or datetime.now(timezone.utc)
        latest: dict[str, PricePoint] = {}
        for p in self.spot_price_history(
            instance_type, zones, start=now - timedelta(days=1), end=now
        ):
            if p.zone not in latest or p.at >= latest[p.zone].at:
                latest[p.zone] = p
        return {z: p.price for z, p in sorted(latest.items())}

    def on_demand_price(self, instance_type: str) -> float:
        """On-demand price per hour: configured, else the Pricing API, else a built-in table."""
        if instance_type in self.on_demand_prices:
            return self.on_demand_prices[instance_type]

        def from_api() -> float | None:
            try:
                from botocore.config import Config

                pricing = self.get_session().client(
                    "pricing",
                    region_name="us-east-1",
                    endpoint_url=self.conn_config.endpoint_url,
                    config=Config(retries={"max_attempts": 1}, connect_timeout=3, read_timeout=10),
                )
                resp = pricing.get_products(
                    ServiceCode="AmazonEC2",
                    Filters=[
                        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
                        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
                        {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
                        {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
                        {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
                    ],
                    MaxResults=1,
                )
                for raw in resp.get("PriceList", []):
                    doc = json.loads(raw) if isinstance(raw, str) else raw
                    for term in doc["terms"]["OnDemand"].values():
                        for dim in term["priceDimensions"].values():
                            return float(dim["pricePerUnit"]["USD"])
            except Exception as e:  # noqa: BLE001 - the Pricing API is optional
                log.info(
                    "Pricing API unavailable for %s (%s); using the built-in table.",
                    instance_type,
                    type(e).__name__,
                )
            return None

        price = self._cached(("od", instance_type), from_api)
        if price is None:
            price = DEFAULT_ON_DEMAND.get(instance_type)
        if price is None:
            raise ConfigError(
                "on_demand_price",
                f"no on-demand price known for {instance_type!r}; pass on_demand_prices={{...}}",
            )
        return price

    # -- checkpoints ------------------------------------------------------------------------
    def s3_client(self):
        """An S3 client on this connection (credentials, role, endpoint_url)."""
        return self.get_session().client(
            "s3", endpoint_url=self.conn_config.endpoint_url, region_name=self.region_name
        )


def _redact(text: str) -> str:
    """Never let something that looks like a secret reach a log line or an error."""
    import re

    return re.sub(
        r"(?i)(secret|password|token|aws_secret_access_key)(['\"]?\s*[:=]\s*['\"]?)[^'\",\s}]+",
        r"\1\2***",
        text,
    )


def _translate(what: str, code: str) -> Exception:
    if code in ("InvalidInstanceType", "InvalidParameterValue") and what.startswith(
        "instance_type"
    ):
        return ConfigError("instance_type", f"{what} is not an EC2 instance type here ({code})")
    if code in ("InvalidParameterValue", "InvalidZone.NotFound"):
        return ConfigError("zones", f"{what}: {code}")
    if code in (
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
    ):
        return ConfigError(
            "aws_conn_id",
            f"{what}: the AWS connection was refused ({code}); check its credentials or role",
        )
    return BackendError(f"{what}: AWS error {code}")
