"""SpotPriceSensor and CheckpointSensor: conditions, results, deferral, bad input."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred
from botocore.stub import ANY, Stubber

from airflow_spot.checkpoint import Checkpoints, open_store
from airflow_spot.exceptions import BackendError, ConfigError
from airflow_spot.hooks.conditions import cheapest_below
from airflow_spot.sensors import CheckpointSensor, SpotPriceSensor
from airflow_spot.triggers.events import EventKind, SpotEvent
from airflow_spot.triggers.sensors import CheckpointTrigger, SpotPriceTrigger

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def moto_conn():
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    os.environ["AIRFLOW_CONN_AWS_SENSORS"] = json.dumps(
        {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"region_name": "us-east-1", "endpoint_url": url},
        }
    )
    boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket="ckpt")
    yield url
    server.stop()


def _stub_prices(sensor: SpotPriceSensor, prices: dict[str, float]):
    hook = sensor._hook()
    stub = Stubber(hook.get_conn())
    stub.add_response(
        "describe_instance_types",
        {"InstanceTypes": [{"InstanceType": "p3.2xlarge"}]},
        {"InstanceTypes": ["p3.2xlarge"]},
    )
    stub.add_response(
        "describe_availability_zones",
        {
            "AvailabilityZones": [
                {"ZoneName": z} for z in ("us-east-1a", "us-east-1c", "us-east-1d")
            ]
        },
        {},
    )
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                {
                    "AvailabilityZone": z,
                    "InstanceType": "p3.2xlarge",
                    "SpotPrice": str(p),
                    "Timestamp": NOW - timedelta(minutes=5),
                }
                for z, p in prices.items()
            ]
        },
        {
            "InstanceTypes": ["p3.2xlarge"],
            "ProductDescriptions": ["Linux/UNIX"],
            "Filters": ANY,
            "StartTime": ANY,
            "EndTime": ANY,
        },
    )
    sensor._hook = lambda: hook  # the same (stubbed) client for the poke
    return stub


def test_cheapest_below() -> None:
    """The cheapest zone at or under the threshold; none when every zone is above."""
    assert cheapest_below({"a": 1.2, "b": 0.9, "c": 1.0}, 1.0) == {
        "zone": "b",
        "price": 0.9,
        "threshold": 1.0,
    }
    assert cheapest_below({"a": 1.2}, 1.0) is None


def test_moved_checks_stay_importable_from_the_sensor_modules() -> None:
    """cheapest_below and find_checkpoint moved below the sensors (their triggers share them);
    the old import paths still give the same functions."""
    from airflow_spot.hooks import conditions
    from airflow_spot.sensors import checkpoint, spot

    assert spot.cheapest_below is conditions.cheapest_below
    assert checkpoint.find_checkpoint is conditions.find_checkpoint


def test_spot_price_sensor_absolute_and_fraction(moto_conn) -> None:
    """With real-looking p3 prices the sensor returns the cheapest qualifying zone."""
    s = SpotPriceSensor(
        task_id="s",
        instance_type="p3.2xlarge",
        zones=["us-east-1a", "us-east-1c", "us-east-1d"],
        max_price=1.25,
        aws_conn_id="aws_sensors",
    )
    with _stub_prices(s, {"us-east-1a": 1.6703, "us-east-1c": 1.2054, "us-east-1d": 1.1856}):
        assert s.execute({}) == {
            "zone": "us-east-1d",
            "price": 1.1856,
            "threshold": 1.25,
            "instance_type": "p3.2xlarge",
        }
    f = SpotPriceSensor(
        task_id="f",
        instance_type="p3.2xlarge",
        zones=["us-east-1a", "us-east-1c"],
        max_fraction_of_on_demand=0.3,
        aws_conn_id="aws_sensors",
        deferrable=True,
    )
    with (
        _stub_prices(f, {"us-east-1a": 1.6703, "us-east-1c": 1.2054}),
        pytest.raises(TaskDeferred) as d,
    ):
        f.execute({})  # 30 % of $3.06 = $0.918: not yet, so it defers
    assert isinstance(d.value.trigger, SpotPriceTrigger)
    assert d.value.trigger.serialize()[1]["threshold"] == pytest.approx(0.918)
    done = f.execute_complete(
        {},
        SpotEvent(
            EventKind.CONDITION_MET, 1.0, True, {"zone": "us-east-1c", "price": 0.9}
        ).to_payload(),
    )
    assert done == {"zone": "us-east-1c", "price": 0.9}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_price": 0}, "max_price"),
        ({"max_price": -1}, "max_price"),
        ({"max_price": "1.10"}, "max_price"),
        ({"max_price": True}, "max_price"),
        ({"max_price": float("inf")}, "max_price"),
        ({"max_fraction_of_on_demand": "0.35"}, "max_fraction_of_on_demand"),
        ({}, "max_price"),
        ({"max_price": 1, "max_fraction_of_on_demand": 0.5}, "max_price"),
        ({"max_fraction_of_on_demand": 1.5}, "max_fraction_of_on_demand"),
        ({"max_price": 1, "zones": []}, "zones"),
        ({"max_price": 1, "zones": "us-east-1a"}, "zones"),
        ({"max_price": 1, "instance_type": ""}, "instance_type"),
    ],
)
def test_spot_price_sensor_bad_input(kwargs, field) -> None:
    """Each bad argument is a ConfigError naming it, at parse time."""
    base = {"task_id": "s", "instance_type": "p3.2xlarge", "zones": ["us-east-1a"]}
    with pytest.raises(ConfigError) as e:
        SpotPriceSensor(**{**base, **kwargs})
    assert e.value.field == field


def test_checkpoint_sensor_on_s3_through_the_connection(moto_conn) -> None:
    """A checkpoint at or beyond min_step in S3 (moto over HTTP, via the Airflow connection) is found."""
    from airflow_spot.hooks.aws import SpotMarketHook

    store = open_store(
        "s3://ckpt/run-1", s3_client=SpotMarketHook(aws_conn_id="aws_sensors").s3_client()
    )
    c = Checkpoints(store)
    c.save(100, {"w": b"1"}, now=NOW.timestamp() - 60, total_steps=1000, metrics={"accuracy": 0.8})
    sensor = CheckpointSensor(
        task_id="c", checkpoint_uri="s3://ckpt/run-1", min_step=200, aws_conn_id="aws_sensors"
    )
    with pytest.raises(TaskDeferred) as d:
        sensor.execute({})
    trigger = d.value.trigger
    assert isinstance(trigger, CheckpointTrigger) and trigger.poll() is None
    c.save(200, {"w": b"2"}, now=NOW.timestamp(), total_steps=1000, metrics={"accuracy": 0.9})
    ev = trigger.poll()
    assert ev.kind is EventKind.CONDITION_MET and ev.status["step"] == 200
    out = sensor.execute_complete({}, ev.to_payload())
    assert out["metrics"] == {"accuracy": 0.9} and out["uri"] == "s3://ckpt/run-1/ckpt-000000000200"


def test_checkpoint_sensor_newer_than_and_bad_input(tmp_path: Path) -> None:
    """newer_than selects by time; bad bounds name their field."""
    Checkpoints(open_store(str(tmp_path))).save(5, {"w": b"x"}, now=1000.0)
    old = CheckpointSensor(
        task_id="c",
        checkpoint_uri=str(tmp_path),
        newer_than=datetime.fromtimestamp(999, UTC),
        deferrable=False,
    )
    assert old.poke({}).xcom_value["step"] == 5
    new = CheckpointSensor(
        task_id="d",
        checkpoint_uri=str(tmp_path),
        newer_than=datetime.fromtimestamp(2000, UTC),
    )
    assert new.poke({}).is_done is False
    with pytest.raises(ConfigError, match="min_step: give min_step"):
        CheckpointSensor(task_id="e", checkpoint_uri=str(tmp_path))
    with pytest.raises(ConfigError, match="checkpoint_uri"):
        CheckpointSensor(task_id="e", checkpoint_uri="s3://", min_step=1)
    with pytest.raises(ConfigError, match="newer_than"):
        CheckpointSensor(task_id="e", checkpoint_uri=str(tmp_path), newer_than=datetime(2020, 1, 1))


def _price_answer(prices: dict[str, float]) -> dict:
    return {
        "SpotPriceHistory": [
            {
                "AvailabilityZone": z,
                "InstanceType": "p3.2xlarge",
                "SpotPrice": str(p),
                "Timestamp": NOW - timedelta(minutes=5),
            }
            for z, p in prices.items()
        ]
    }


def test_spot_price_trigger_builds_its_hook_once(moto_conn, monkeypatch) -> None:
    """Two polls share one hook (built on the first), and each asks for prices afresh: a price
    that fell between them is seen by the second."""
    from airflow_spot.hooks import aws

    built = []

    class Counting(aws.SpotMarketHook):
        def __init__(self, *args, **kwargs) -> None:
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(aws, "SpotMarketHook", Counting)
    trigger = SpotPriceTrigger(
        instance_type="p3.2xlarge",
        zones=["us-east-1a", "us-east-1c"],
        threshold=1.25,
        aws_conn_id="aws_sensors",
    )
    with Stubber(trigger.hook.get_conn()) as stub:
        stub.add_response(
            "describe_spot_price_history",
            _price_answer({"us-east-1a": 1.6703, "us-east-1c": 1.3054}),
        )
        stub.add_response(
            "describe_spot_price_history",
            _price_answer({"us-east-1a": 1.6703, "us-east-1c": 1.2054}),
        )
        assert trigger.poll() is None
        ev = trigger.poll()
        stub.assert_no_pending_responses()
    assert ev.kind is EventKind.CONDITION_MET
    assert ev.status == {
        "zone": "us-east-1c",
        "price": 1.2054,
        "threshold": 1.25,
        "instance_type": "p3.2xlarge",
    }
    assert len(built) == 1 and built[0]["aws_conn_id"] == "aws_sensors"


def test_checkpoint_trigger_opens_its_store_once(moto_conn, monkeypatch) -> None:
    """Two polls share one store and one S3 client on the connection (built on the first),
    and the second still sees a checkpoint written between them."""
    from airflow_spot.hooks.aws import SpotMarketHook

    clients = []
    s3_client = SpotMarketHook.s3_client

    def counting(self):
        clients.append(self.aws_conn_id)
        return s3_client(self)

    monkeypatch.setattr(SpotMarketHook, "s3_client", counting)
    trigger = CheckpointTrigger(
        checkpoint_uri="s3://ckpt/run-2", min_step=2, newer_than=None, aws_conn_id="aws_sensors"
    )
    c = Checkpoints(
        open_store(
            "s3://ckpt/run-2", s3_client=s3_client(SpotMarketHook(aws_conn_id="aws_sensors"))
        )
    )
    c.save(1, {"w": b"1"}, now=NOW.timestamp())
    assert trigger.poll() is None
    c.save(2, {"w": b"2"}, now=NOW.timestamp())
    ev = trigger.poll()
    assert ev.kind is EventKind.CONDITION_MET and ev.status["step"] == 2
    assert ev.status["uri"] == "s3://ckpt/run-2/ckpt-000000000002"
    assert clients == ["aws_sensors"]


@pytest.mark.parametrize(
    ("event", "says"),
    [
        (SpotEvent(EventKind.ERROR, 1.0, message="ConfigError: zones: unknown"), "zones: unknown"),
        (SpotEvent(EventKind.TICK, 1.0), "a bug in airflow-spot"),
    ],
)
def test_a_watch_that_ends_without_the_condition_fails_the_task(event, says, tmp_path) -> None:
    """An ERROR event (the trigger gave up) or one a sensor's trigger never sends fails the
    task with a BackendError that says what happened."""
    sensor = CheckpointSensor(task_id="c", checkpoint_uri=str(tmp_path), min_step=1)
    with pytest.raises(BackendError, match="^c: ") as e:
        sensor.execute_complete({}, event.to_payload())
    assert says in str(e.value)
