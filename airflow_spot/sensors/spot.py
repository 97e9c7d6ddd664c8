"""``SpotPriceSensor``: wait until spot is cheap enough in one of a list of zones.

``cheapest_below``, the check it shares with its trigger, lives in
:mod:`airflow_spot.hooks.conditions`; it stays importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import PokeReturnValue

from airflow_spot.exceptions import ConfigError, finite_number
from airflow_spot.hooks.conditions import cheapest_below
from airflow_spot.sensors.base import DeferrableSpotSensor


class SpotPriceSensor(DeferrableSpotSensor):
    """Wait until the spot price of ``instance_type`` is at or below a threshold in any of ``zones``.

    :param instance_type: an EC2 instance type, e.g. ``p3.2xlarge``.
    :param zones: availability zones to watch.
    :param max_price: threshold in dollars per hour; or
    :param max_fraction_of_on_demand: threshold as a share of the on-demand price (0 < f <= 1).
    :param aws_conn_id: the Airflow AWS connection.
    :param region_name: region override (else the connection's).
    :param on_demand_prices: ``{instance_type: price}`` used instead of the Pricing API.
    :param deferrable: wait in the triggerer (default).

    Returns (XCom) ``{"zone", "price", "threshold", "instance_type"}`` of the cheapest zone.
    """

    template_fields: Sequence[str] = ("instance_type", "zones")

    def __init__(
        self,
        *,
        instance_type: str,
        zones: list[str],
        max_price: float | None = None,
        max_fraction_of_on_demand: float | None = None,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        on_demand_prices: dict[str, float] | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 300)
        super().__init__(**kwargs)
        if not instance_type or not isinstance(instance_type, str):
            raise ConfigError("instance_type", "give an EC2 instance type, e.g. 'p3.2xlarge'")
        if not zones or isinstance(zones, str) or not all(isinstance(z, str) and z for z in zones):
            raise ConfigError(
                "zones", "give a list of availability zones, e.g. ['us-east-1a', 'us-east-1c']"
            )
        if (max_price is None) == (max_fraction_of_on_demand is None):
            raise ConfigError(
                "max_price", "give exactly one of max_price (per hour) or max_fraction_of_on_demand"
            )
        if max_price is not None and not (finite_number(max_price) and max_price > 0):
            raise ConfigError(
                "max_price", f"must be a number > 0 (dollars per hour), got {max_price!r}"
            )
        if max_fraction_of_on_demand is not None and not (
            finite_number(max_fraction_of_on_demand) and 0 < max_fraction_of_on_demand <= 1
        ):
            raise ConfigError(
                "max_fraction_of_on_demand", f"must be in (0, 1], got {max_fraction_of_on_demand!r}"
            )
        self.instance_type = instance_type
        self.zones = list(zones)
        self.max_price = max_price
        self.max_fraction_of_on_demand = max_fraction_of_on_demand
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.on_demand_prices = on_demand_prices
        self.deferrable = deferrable

    def _hook(self):
        from airflow_spot.hooks.aws import SpotMarketHook

        return SpotMarketHook(
            aws_conn_id=self.aws_conn_id,
            region_name=self.region_name,
            on_demand_prices=self.on_demand_prices,
        )

    def threshold(self, hook: Any) -> float:
        if self.max_price is not None:
            return float(self.max_price)
        return float(self.max_fraction_of_on_demand) * hook.on_demand_price(self.instance_type)  # type: ignore[arg-type]

    def poke(self, context: Any) -> PokeReturnValue:
        hook = self._hook()
        hook.validate(self.instance_type, self.zones)
        thr = self.threshold(hook)
        prices = hook.current_spot_prices(self.instance_type, self.zones)
        found = cheapest_below(prices, thr)
        self.log.info(
            "Spot %s: %s; threshold $%.4f/h -> %s",
            self.instance_type,
            ", ".join(f"{z} ${p:.4f}" for z, p in prices.items()) or "no prices",
            thr,
            f"{found['zone']} at ${found['price']:.4f}" if found else "wait",
        )
        if found is None:
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(
            is_done=True, xcom_value={**found, "instance_type": self.instance_type}
        )

    def trigger(self) -> Any:
        from airflow_spot.triggers.sensors import SpotPriceTrigger

        hook = self._hook()
        return SpotPriceTrigger(
            instance_type=self.instance_type,
            zones=self.zones,
            threshold=self.threshold(hook),
            aws_conn_id=self.aws_conn_id,
            region_name=self.region_name,
            poll_interval=float(self.poke_interval),
        )
