"""The operator over several spot pools: cheapest pool with capacity, cool-down after a
preemption, and a ledger priced at the price that applied at each moment."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_spot.backends.local import LocalBackend
from airflow_spot.backends.local.market import Pool
from airflow_spot.exceptions import ConfigError
from airflow_spot.operators import SpotTrainingOperator
from airflow_spot.operators.spot_training import STATE_KEY
from airflow_spot.testing import FileTaskStateStore, make_context, scripted_trace, train_command


def test_cheapest_pool_cooldown_and_time_varying_prices(tmp_path: Path) -> None:
    """Spot starts in the cheap pool; when it is reclaimed the job moves to the dearer pool (the
    cheap one cools down); the dearer pool's price drops mid-run and the ledger bills both prices."""
    cheap = scripted_trace(tmp_path / "cheap.json", [(True, 6), (False, 2000)], prices=[(1.0, 10)])
    dear = scripted_trace(tmp_path / "dear.json", [(True, 2000)], prices=[(2.0, 15), (1.5, 10)])
    op = SpotTrainingOperator(
        task_id="train",
        command=train_command(80, step_seconds=0.05, save_every=5),
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=4),
        total_steps=80,
        deadline=timedelta(seconds=12),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        on_demand_price=3.06,
        backend=LocalBackend(
            pools=(Pool("cheap", str(cheap), "available"), Pool("dear", str(dear), "available")),
            time_scale=3600.0,
            work_dir=str(tmp_path / "runs"),
            notice_s=0.1,
            grace_s=1.0,
        ),
        decision_interval=timedelta(seconds=0.5),
        poll_interval=0.05,
        deferrable=False,
    )
    store = FileTaskStateStore(tmp_path / "state.json")
    summary = op.execute(make_context(store))
    attempts = store.get(STATE_KEY)["attempts"]
    assert (attempts[0]["pool"], attempts[0]["outcome"]) == ("cheap", "preempted")
    assert attempts[1]["pool"] == "dear" and attempts[-1]["outcome"] == "succeeded"
    prices = {round(s["price_per_h"], 2) for s in summary["segments"] if s["pool"] == "dear"}
    assert prices == {2.0, 1.5}
    billed = sum(
        (s["end_s"] - s["start_s"]) / 3600 * s["price_per_h"]
        for s in summary["segments"]
        if s["phase"] != "idle"
    )
    assert summary["cost"] == pytest.approx(billed, rel=1e-6)
    assert summary["deadline_met"] is True


def test_duplicate_pool_names_are_rejected() -> None:
    """Two pools with one name are a configuration error naming backend.pools."""
    with pytest.raises(ConfigError, match="backend.pools"):
        LocalBackend(pools=(Pool("a", "x.json"), Pool("a", "y.json")))


def test_live_price_through_an_airflow_connection(tmp_path: Path) -> None:
    """A pool priced live through an AWS connection (moto server over HTTP) is chosen when it is
    the cheapest, and the ledger bills the live price."""
    import json
    import os

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["AIRFLOW_CONN_AWS_LIVE_PRICES"] = json.dumps(
        {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"region_name": "us-east-1", "endpoint_url": f"http://{host}:{port}"},
        }
    )
    try:
        up = scripted_trace(tmp_path / "up.json", [(True, 2000)], prices=[(1.0, 10)])
        live = {"aws_conn_id": "aws_live_prices", "instance_type": "m5.large", "zone": "us-east-1a"}
        op = SpotTrainingOperator(
            task_id="train",
            command=train_command(20, step_seconds=0.02),
            checkpoint_uri=str(tmp_path / "ckpt"),
            expected_compute=timedelta(seconds=1),
            total_steps=20,
            deadline=timedelta(seconds=30),
            changeover=timedelta(seconds=0.1),
            policy="greedy",
            backend=LocalBackend(
                pools=(
                    Pool("trace", str(up), "available"),
                    Pool("live", str(up), "available", price_from=live),
                ),
                time_scale=3600.0,
                work_dir=str(tmp_path / "runs"),
            ),
            decision_interval=timedelta(seconds=0.5),
            poll_interval=0.05,
            deferrable=False,
        )
        store = FileTaskStateStore(tmp_path / "state.json")
        summary = op.execute(make_context(store))
    finally:
        server.stop()
    attempts = store.get(STATE_KEY)["attempts"]
    assert attempts[0]["pool"] == "live"
    live_price = attempts[0]["prices"][0][1]
    assert 0 < live_price < 1.0  # moto's constant spot price, not the trace's $1.00
    assert {s["price_per_h"] for s in summary["segments"] if s["pool"] == "live"} == {live_price}


def test_a_spot_request_stranded_in_a_down_pool_moves_to_one_with_capacity(tmp_path: Path) -> None:
    """A spot request waits for capacity in pool a, which is down, while pool b is up: the
    next look moves it to b instead of waiting on a (both replayed, nothing cooling down)."""
    from airflow_spot.policy import Capacity, Decision, JobSpec

    a = scripted_trace(tmp_path / "a.json", [(False, 100)], prices=[(1.0, 100)])
    b = scripted_trace(tmp_path / "b.json", [(True, 100)], prices=[(1.2, 100)])
    op = SpotTrainingOperator(
        task_id="train",
        command=[sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"],
        checkpoint_uri=str(tmp_path / "ckpt"),
        expected_compute=timedelta(seconds=20),
        total_steps=400,
        deadline=timedelta(hours=1),
        changeover=timedelta(seconds=0.1),
        policy="greedy",
        backend=LocalBackend(
            pools=(Pool("a", str(a), "available"), Pool("b", str(b), "available")),
            time_scale=1.0,
            work_dir=str(tmp_path / "runs"),
        ),
        deferrable=False,
    )
    state = op._new_state(time.time())
    ctl = op.turn(state, make_context(FileTaskStateStore(tmp_path / "s")))
    job = JobSpec(400.0, 3600.0, 0.1, 1.0, 3.06)
    ctl.capacity.choose_pool = lambda now, price: "a"  # type: ignore[method-assign]  # as if a had capacity when it was chosen
    ctl.attempt.launch(Capacity.SPOT, job)
    del ctl.capacity.choose_pool
    try:
        ctl.act(Decision(Capacity.SPOT, "spot_up"), job, time.time())
        first, second = state.attempts
        assert (first.pool, first.outcome) == ("a", "cancelled") and "moved" in first.reason
        assert second.pool == "b" and state.live is second
        ctl.act(Decision(Capacity.SPOT, "spot_up"), job, time.time())  # b has capacity: stays
        assert len(state.attempts) == 2
    finally:
        if state.live is not None:
            ctl.backend.cancel(state.live.handle)
