"""Spot capacity for one job: whether spot counts as available (decided by
:mod:`airflow_spot.backends.capacity`, which the watcher runs too), which pools cool down, which
pool a spot launch goes to and at what price."""

from __future__ import annotations

from typing import Any

from airflow_spot.backends.base import Backend, SeesSpot, TaskIdentity
from airflow_spot.backends.capacity import cooling_until, replayed_spot, spot_available
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

    @property
    def oracle(self) -> bool:
        """Every look reads the replayed market's true state (the paper's replay)."""
        return self.market is not None and self.state.observe == "oracle"

    def facts(self, now: float, settle_s: float = 0.0) -> list[tuple[bool, float, str]]:
        """What shows spot's state at this look: ``(up, wall time, source)``, oldest first.

        Under the oracle, the replayed market itself. Otherwise only what a cluster shows: the
        job's spot attempts (held: up; waiting for capacity: down; a preemption: down at its
        ``ended_at``), its probe, and what the backend's cluster says (:class:`SeesSpot`).
        A request younger than ``settle_s`` shows nothing yet (capacity may be on its way)."""
        st = self.state
        if self.oracle:
            return [(self.available(now), now, "market")]
        out: list[tuple[bool, float, str]] = []
        since = st.spot_seen_at if st.spot_seen_at is not None else st.started_at
        for a in st.attempts:
            if a.capacity != Capacity.SPOT.value:
                continue
            if a.ended_at is None:
                if a.granted_at:
                    out.append((True, now, "attempt"))
                elif now - a.launched_at >= settle_s:
                    out.append((False, now, "request"))
            elif a.ended_at >= since:
                if a.outcome == "preempted":
                    out.append((False, a.ended_at, "attempt"))
                elif a.outcome == "spot_unavailable":
                    out.append((False, a.ended_at, "request"))
                elif a.granted_at:
                    out.append((True, a.ended_at, "attempt"))
        answer = self.probe_answer(now)
        if answer is not None:
            out.append(answer)
        if self.market is None and isinstance(self.backend, SeesSpot):
            out += [(s.up, s.at, s.source) for s in self.backend.spot_signals(now) if s.fact]
        return sorted(out, key=lambda f: (f[1], not f[0]))

    # -- probes -----------------------------------------------------------------------------
    def can_probe(self) -> bool:
        return self.market is not None or isinstance(self.backend, SeesSpot)

    def probe_answer(self, now: float) -> tuple[bool, float, str] | None:
        """What the probe asking now shows (a replayed market answers as the cloud would)."""
        pr = self.state.probe
        if pr is None:
            return None
        if self.market is not None:
            up = replayed_spot(self.market, now, self.cooling_until(now))
        elif isinstance(self.backend, SeesSpot):
            sig = self.backend.probe_signal(pr["handle"], now)
            if sig is None:
                return None
            up, now = sig.up, sig.at
        else:
            return None
        if up:
            pr["found_at"] = now
        return (up, now, "probe")

    def settle_probe(
        self, now: float, take_spot: bool, keep_looking: bool, ident: TaskIdentity, job: Any
    ) -> None:
        """After a decision: a probe that found capacity is used by a spot launch, or given
        back and billed for ``job.changeover_s`` at the spot price; a probe is started (or
        kept) while the policy asks to look, and deleted when it no longer does."""
        st = self.state
        pr = st.probe
        if pr is not None and pr.get("found_at"):
            if not take_spot:
                # a gang's probe found its N nodes (placeholders): all N are billed
                st.probe_found.append(
                    [pr["found_at"], job.changeover_s, job.spot_price * job.nodes]
                )
            self._drop(pr)
            pr = st.probe = None
        if keep_looking and not take_spot and self.can_probe():
            if pr is None:
                handle = None
                if self.market is None and isinstance(self.backend, SeesSpot):
                    handle = self.backend.probe(ident)
                st.probe = {"started_at": now, "handle": handle}
                st.probes += 1
        elif pr is not None:
            self._drop(pr)
            st.probe = None

    def drop_probe(self) -> None:
        """Delete the probe asking now, if any (the task ends)."""
        if self.state.probe is not None:
            self._drop(self.state.probe)
            self.state.probe = None

    def _drop(self, pr: dict[str, Any]) -> None:
        if pr.get("handle") is not None and isinstance(self.backend, SeesSpot):
            self.backend.drop_probe(pr["handle"])

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
