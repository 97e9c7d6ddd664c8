"""The AWS hook over an Airflow connection to a moto server over HTTP (moto is the stand-in: no
real AWS is reachable here). moto returns a constant spot price, so the real price series of the
bundled aws-p3 sample is served through botocore's Stubber."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime, timedelta

import pytest
from botocore.stub import Stubber

from airflow_spot.exceptions import ConfigError
from airflow_spot.hooks.aws import SpotMarketHook
from airflow_spot.simulate.traces import bundled

SECRET = "s3cr3t-value-never-logged"


@pytest.fixture(scope="module")
def moto_conn():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    conn = {
        "conn_type": "aws",
        "login": "testing",
        "password": SECRET,
        "extra": {"region_name": "us-east-1", "endpoint_url": f"http://{host}:{port}"},
    }
    os.environ["AIRFLOW_CONN_AWS_MOTO"] = json.dumps(conn)
    os.environ["AIRFLOW_CONN_AWS_BROKEN"] = '{"conn_type": "aws", "extra": "{not json"}'
    yield f"http://{host}:{port}"
    server.stop()


def real_history(zones: list[str], now: datetime) -> dict:
    """The bundled real p3.2xlarge prices as a describe_spot_price_history answer (last 10 per zone)."""
    sample = json.loads(bundled("aws-p3/spot_prices_sample.json").read_text())
    items = []
    for z in zones:
        for k, price in enumerate(sample["prices"][z][-10:]):
            items.append(
                {
                    "AvailabilityZone": z,
                    "InstanceType": "p3.2xlarge",
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": str(price),
                    "Timestamp": now - timedelta(minutes=30 * (10 - k)),
                }
            )
    return {"SpotPriceHistory": items}


def test_validate_against_moto(moto_conn) -> None:
    """A real instance type and zone pass; an unknown one is a ConfigError naming the field."""
    hook = SpotMarketHook(aws_conn_id="aws_moto")
    hook.validate("g5.xlarge", ["us-east-1a", "us-east-1c"])  # moto 5.2.5 does not list p3 types
    with pytest.raises(ConfigError, match="instance_type: instance_type 'p9.mega'"):
        hook.validate("p9.mega")
    with pytest.raises(
        ConfigError, match=r"zones: unknown availability zone\(s\) \['us-east-1z'\]"
    ):
        hook.validate("g5.xlarge", ["us-east-1z"])


def test_malformed_connection_names_the_connection(moto_conn) -> None:
    """A connection whose extra is not JSON fails naming aws_conn_id."""
    with pytest.raises(ConfigError, match="aws_conn_id: cannot use AWS connection 'aws_broken'"):
        SpotMarketHook(aws_conn_id="aws_broken").validate("g5.xlarge")


def test_current_prices_from_the_real_series_cached(moto_conn) -> None:
    """The latest real price per zone comes back; a second call within the TTL is served from cache."""
    now = datetime(2023, 3, 1, tzinfo=UTC)
    hook = SpotMarketHook(aws_conn_id="aws_moto", cache_ttl_s=60)
    stub = Stubber(hook.get_conn())
    stub.add_response(
        "describe_spot_price_history", real_history(["us-east-1a", "us-east-1c"], now)
    )
    with stub:
        first = hook.current_spot_prices("p3.2xlarge", ["us-east-1a", "us-east-1c"], now=now)
        again = hook.current_spot_prices(
            "p3.2xlarge", ["us-east-1a", "us-east-1c"], now=now
        )  # no response queued
    sample = json.loads(bundled("aws-p3/spot_prices_sample.json").read_text())["prices"]
    assert first == {"us-east-1a": sample["us-east-1a"][-1], "us-east-1c": sample["us-east-1c"][-1]}
    assert again == first


def test_current_prices_without_a_fixed_clock_are_cached_and_the_cache_is_bounded(
    moto_conn,
) -> None:
    """The live path asks 'now' every look: within the TTL the answer is reused (one API call),
    and expired entries are dropped instead of piling up for the life of a run."""
    hook = SpotMarketHook(aws_conn_id="aws_moto", cache_ttl_s=60)
    calls = []
    real = hook._history
    hook._history = lambda *a: calls.append(a) or real(*a)
    for _ in range(3):
        assert set(hook.current_spot_prices("g5.xlarge", ["us-east-1a"])) == {"us-east-1a"}
    assert len(calls) == 1
    hook.cache_ttl_s = 0.0
    for _ in range(3):
        hook.current_spot_prices("g5.xlarge", ["us-east-1a"])
    assert len(calls) == 4 and len(hook._cache) == 1


def test_zones_in_several_regions_are_asked_in_each(moto_conn) -> None:
    """The README's sensor watches us-east-1 and us-east-2 zones over one connection: each
    region is validated and priced with its own client."""
    hook = SpotMarketHook(aws_conn_id="aws_moto")
    zones = ["us-east-1a", "us-east-1c", "us-east-2a"]
    hook.validate("g5.xlarge", zones)
    assert set(hook.current_spot_prices("g5.xlarge", zones)) == set(zones)
    with pytest.raises(
        ConfigError,
        match=r"zones: unknown availability zone\(s\) \['us-east-2z'\] in region us-east-2",
    ):
        hook.validate("g5.xlarge", ["us-east-1a", "us-east-2z"])


def test_a_connection_without_credentials_names_the_connection(monkeypatch, moto_conn) -> None:
    """No credentials anywhere: a ConfigError naming aws_conn_id and the fix, not botocore's
    NoCredentialsError."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_NOCREDS",
        json.dumps(
            {"conn_type": "aws", "extra": {"region_name": "us-east-1", "endpoint_url": moto_conn}}
        ),
    )
    with pytest.raises(ConfigError, match="aws_conn_id: .*'aws_nocreds' has no usable credentials"):
        SpotMarketHook(aws_conn_id="aws_nocreds", max_attempts=1).validate("g5.xlarge")


def test_the_pricing_api_is_asked_for_the_connections_region(moto_conn, monkeypatch) -> None:
    """Without a region filter the Pricing API answers for whichever region it lists first."""
    seen = {}

    class Pricing:
        def get_products(self, **kw):
            seen.update({f["Field"]: f["Value"] for f in kw["Filters"]})
            return {"PriceList": []}

    hook = SpotMarketHook(aws_conn_id="aws_moto")
    session = hook.get_session()
    monkeypatch.setattr(type(session), "client", lambda self, *a, **k: Pricing())
    monkeypatch.setattr(hook, "get_session", lambda *a, **k: session)
    assert hook.on_demand_price("p3.2xlarge") == pytest.approx(3.06)  # the table, after the API
    assert seen["regionCode"] == "us-east-1" and seen["instanceType"] == "p3.2xlarge"


def test_throttling_is_retried_with_backoff(moto_conn, caplog) -> None:
    """Two Throttling errors, then an answer: the call succeeds, and no secret is logged."""
    now = datetime(2023, 3, 1, tzinfo=UTC)
    hook = SpotMarketHook(aws_conn_id="aws_moto", backoff_s=0.01)
    stub = Stubber(hook.get_conn())
    stub.add_client_error(
        "describe_spot_price_history", service_error_code="Throttling", http_status_code=400
    )
    stub.add_client_error(
        "describe_spot_price_history",
        service_error_code="RequestLimitExceeded",
        http_status_code=503,
    )
    stub.add_response("describe_spot_price_history", real_history(["us-east-1c"], now))
    with stub, caplog.at_level(logging.DEBUG):
        prices = hook.current_spot_prices("p3.2xlarge", ["us-east-1c"], now=now)
    assert set(prices) == {"us-east-1c"}
    assert caplog.text.count("retrying in") == 2
    assert SECRET not in caplog.text


def test_on_demand_price_configured_or_table(moto_conn) -> None:
    """A configured price wins; otherwise a known type has a price and an unknown one is named."""
    assert (
        SpotMarketHook(aws_conn_id="aws_moto", on_demand_prices={"x1.big": 9.0}).on_demand_price(
            "x1.big"
        )
        == 9.0
    )
    assert SpotMarketHook(aws_conn_id="aws_moto").on_demand_price("p3.2xlarge") == pytest.approx(
        3.06
    )
    with pytest.raises(ConfigError, match="on_demand_price: no on-demand price known for 'zz.top'"):
        SpotMarketHook(aws_conn_id="aws_moto").on_demand_price("zz.top")
