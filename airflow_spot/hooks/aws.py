"""Spot market and checkpoint access over an Airflow AWS connection.

Built on the amazon provider's ``AwsBaseHook``, so ``aws_default``, assumed roles, profiles and
``endpoint_url`` work as users expect. Results are cached for ``cache_ttl_s``; throttling and
transient errors are retried with exponential backoff; credentials never appear in messages.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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


_REGION = re.compile(r"([a-z]{2}(?:-[a-z]+)+-\d+)")


def region_of(zone: str) -> str | None:
    """The region of an availability zone or local zone: ``us-east-1a`` -> ``us-east-1``,
    ``us-west-2-lax-1a`` -> ``us-west-2``; None if it does not look like one."""
    m = _REGION.match(zone)
    return m.group(1) if m else None


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
        self._clients: dict[str, Any] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def _cached(self, key: tuple, fn):
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.cache_ttl_s:
            return hit[1]
        value = fn()
        for k in [k for k, (at, _) in self._cache.items() if now - at >= self.cache_ttl_s]:
            del self._cache[k]  # a long-lived hook must not grow without bound
        self._cache[key] = (now, value)
        return value

    def _call(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn(*args, **kwargs)
            except (NoCredentialsError, PartialCredentialsError) as e:
                raise ConfigError(
                    "aws_conn_id",
                    f"{what}: AWS connection {self.aws_conn_id!r} has no usable credentials "
                    f"({type(e).__name__}); set its login/password, a role_arn or a profile in "
                    "its extra, or run where an instance role is available",
                ) from e
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

    def ec2(self, region: str | None = None):
        """The EC2 client of ``region`` (default: the connection's), same credentials."""
        if region is None or region == self.region_name:
            return self.client()
        if region not in self._clients:
            try:
                # the provider's own path: the connection's verify, config, endpoint, user agent
                self._clients[region] = self.get_client_type(region_name=region)
            except Exception as e:  # noqa: BLE001 - as client(): the connection's fault
                raise ConfigError(
                    "aws_conn_id",
                    f"cannot use AWS connection {self.aws_conn_id!r} in {region}: "
                    f"{type(e).__name__}: {_redact(str(e))}",
                ) from e
        return self._clients[region]

    def by_region(self, zones: list[str] | None) -> dict[str | None, list[str]]:
        """Zones grouped by their region (``us-east-1a`` -> ``us-east-1``); no zones: the
        connection's region."""
        out: dict[str | None, list[str]] = {}
        for z in zones or []:
            out.setdefault(region_of(z) or self.region_name, []).append(z)
        return out or {self.region_name: []}

    def validate(self, instance_type: str, zones: list[str] | None = None) -> None:
        """Fail with a named field if the instance type or a zone does not exist (zones may
        span regions: each is checked in its own)."""
        for region, group in self.by_region(zones).items():
            ec2 = self.ec2(region)
            self._cached(
                ("type", instance_type, region),
                lambda ec2=ec2: self._call(
                    f"instance_type {instance_type!r}",
                    ec2.describe_instance_types,
                    InstanceTypes=[instance_type],
                ),
            )
            if not group:
                continue
            known = self._cached(
                ("zones", region),
                lambda ec2=ec2: {
                    z["ZoneName"]
                    for z in self._call("zones", ec2.describe_availability_zones)[
                        "AvailabilityZones"
                    ]
                },
            )
            bad = [z for z in group if z not in known]
            if bad:
                raise ConfigError(
                    "zones",
                    f"unknown availability zone(s) {bad} in region {region}; known: {sorted(known)}",
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
        """Spot price changes (Linux/UNIX) per zone between ``start`` and ``end`` (cached);
        zones in several regions are asked in each."""
        key = ("history", instance_type, tuple(zones or ()), start, end)
        return self._cached(key, lambda: self._history(instance_type, zones, start, end))

    def _history(
        self,
        instance_type: str,
        zones: list[str] | None,
        start: datetime | None,
        end: datetime | None,
    ) -> list[PricePoint]:
        out: list[PricePoint] = []
        for region, group in self.by_region(zones).items():
            ec2 = self.ec2(region)
            kwargs: dict[str, Any] = {
                "InstanceTypes": [instance_type],
                "ProductDescriptions": ["Linux/UNIX"],
            }
            if group:
                kwargs["Filters"] = [{"Name": "availability-zone", "Values": group}]
            if start:
                kwargs["StartTime"] = start
            if end:
                kwargs["EndTime"] = end
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
                    break
        return sorted(out, key=lambda p: p.at)

    def current_spot_prices(
        self, instance_type: str, zones: list[str] | None = None, *, now: datetime | None = None
    ) -> dict[str, float]:
        """The latest spot price per zone (from the last day of history), reused for
        ``cache_ttl_s`` (the window moves with the clock, so it is cached by zones, not times)."""

        def fetch() -> dict[str, float]:
            at = now or datetime.now(UTC)
            latest: dict[str, PricePoint] = {}
            for p in self._history(instance_type, zones, at - timedelta(days=1), at):
                if p.zone not in latest or p.at >= latest[p.zone].at:
                    latest[p.zone] = p
            return {z: p.price for z, p in sorted(latest.items())}

        return self._cached(("current", instance_type, tuple(zones or ()), now), fetch)

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
                        {
                            "Type": "TERM_MATCH",
                            "Field": "regionCode",
                            "Value": self.region_name or self.client().meta.region_name,
                        },
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
