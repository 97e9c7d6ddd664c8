"""Spot capacity for one job: whether spot counts as available (decided by
:mod:`airflow_spot.backends.capacity`, which the watcher runs too), which pools cool down, which
pool a spot launch goes to and at what price."""

from __future__ import annotations

from typing import Any

from airflow_spot.backends.base import Backend
from airflow_spot.backends.capacity import cooling_until, spot_available
from airflow_spot.backends.local.market import Pools
from airflow_spot.exceptions import BackendError
from airflow_spot.jobstate import AttemptRecord, JobState
from airflow_spot.policy import Capacity


class SpotCapacity:
    """Spot pools and prices as the job sees them: a replayed market's pools (``market``), or
    the backend's node pools when the real market is not replayed."""

    def __init__(self, backend: Backend, state: JobState) -> None:
        self.backend = backend
        self.state = state
        self.market = Pools.load(state.market) if state.market else None
        self._hooks: dict[tuple[Any, Any], Any] = {}

    @property
    def node_pools(self) -> dict[str, Any]:
        """The backend's spot node pools by name (none with a replayed market)."""
        return {p.name: p for p in self.backend.node_pools} if self.market is None else {}

    # -- availability -----------------------------------------------------------------------
    def cooling_until(self, now: float) -> dict[str, float]:
        """The pools kept out now, each with the wall time its cool-down ends."""
        return cooling_until(
            self.state.attempts, now, market=self.market, cooldown_s=self.backend.spot_cooldown_s
        )

    def cooling(self, now: float) -> set[str]:
        """Pools that lost the job's spot capacity less than their cool-down ago (kept out)."""
        return set(self.cooling_until(now))

    def available(self, now: float) -> bool:
        return spot_available(
            now,
            market=self.market,
            cooling=self.cooling_until(now),
            node_pools=self.node_pools,
            attempts=self.state.attempts,
            cooldown_s=self.backend.spot_cooldown_s,
        )

    def pool_down(self, live: AttemptRecord, now: float, spot: bool | None) -> bool:
        """The replayed market has taken the live attempt's spot capacity (its verdict is coming).
        Without a replayed market (Kubernetes) the pod's own status says so: never wait here."""
        if not self.market:
            return False
        if live.pool in self.market.names:
            return not self.market.market(live.pool).available_at(now)
        return spot is False

    def stranded(self, live: AttemptRecord, now: float) -> bool:
        """A spot request still waiting for capacity in a pool that is down, while another
        pool (not cooling down) has capacity: cheaper to move it than to wait."""
        pools = self.market
        return bool(
            pools is not None
            and live.capacity == Capacity.SPOT.value
            and live.granted_at is None
            and live.started_at is None
            and live.pool in pools.names
            and not pools.market(live.pool).available_at(now)
            and pools.available_at(now, self.cooling(now) | {live.pool})
        )

    # -- pools and prices -------------------------------------------------------------------
    def priced(self) -> bool:
        """Whether a spot launch picks among pools (replayed or node pools)."""
        return bool(self.market or self.node_pools)

    def pool_price(self, name: str, now: float, default: float) -> float:
        if self.market:
            return self.market.price(name, now, default, self.live_price)
        pool = self.node_pools[name]
        if pool.price_from:
            return self.live_price(pool.price_from)
        return pool.spot_price if pool.spot_price is not None else default

    def choose_pool(self, now: float, default: float) -> str:
        """The cheapest pool not cooling down (with capacity, on a replayed market)."""
        if self.market:
            return (
                self.market.choose(now, self.cooling(now), default, self.live_price)
                or self.market.names[0]
            )
        cooling = self.cooling(now)
        names = [n for n in self.node_pools if n not in cooling] or list(self.node_pools)
        return min(names, key=lambda n: (self.pool_price(n, now, default), n))

    def market_of(self, pool: str) -> Any:
        """The replayed market a launch into ``pool`` runs against (None: the real one)."""
        return self.market.market(pool or self.market.names[0]).spec if self.market else None

    def track_price(self, now: float, default: float) -> None:
        """Record the live spot attempt's price when its pool's price changes (the ledger bills by it)."""
        live = self.state.live
        if live is None or live.capacity != "spot" or not live.pool:
            return
        price = self.pool_price(live.pool, now, default)
        if not live.prices or live.prices[-1][1] != price:
            live.prices.append([now, price])

    def live_price(self, source: dict[str, Any]) -> float:
        """A pool's live spot price through its Airflow AWS connection (cached by the hook)."""
        key = (source.get("aws_conn_id"), source.get("region_name"))
        if key not in self._hooks:
            from airflow_spot.hooks.aws import SpotMarketHook

            self._hooks[key] = SpotMarketHook(aws_conn_id=key[0], region_name=key[1])
        prices = self._hooks[key].current_spot_prices(source["instance_type"], [source["zone"]])
        if source["zone"] not in prices:
            raise BackendError(
                f"no live spot price for {source['instance_type']} in {source['zone']}"
            )
        return prices[source["zone"]]
