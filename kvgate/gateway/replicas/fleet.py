"""The live fleet as the decisions see it: one ``FleetSnapshot`` per decision, and replica health.

``Fleet.snapshot`` assembles each replica's ``ReplicaView`` from the gateway state (pool, role,
capacity, last scrape, TTFT), the reservations ledger (plus, when coordinated, what lies outside this
gateway's claims) and the ``HealthTracker``. A replica's view is rebuilt only when something in it
changed since the last snapshot; otherwise the view built then is handed out again (views are
frozen, so sharing is safe). A replica whose KV capacity is not known yet (``0``: none configured,
none scraped) is not healthy in its view: admission has nothing to weigh it against.

Health has one state machine (``kvgate.routing.health``) fed from both sides: the active probes
(``kvgate.gateway.replicas.probes``) and the answers of real requests (``observe``), so one set of thresholds
decides when a replica is routable, ejected and back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvgate.admission.ledger import NO_LOAD
from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.state import GatewayState, ReplicaState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import (
    STARTING,
    HealthRules,
    HealthState,
    HealthTracker,
    Outcome,
    ReplicaHealth,
    outcome_of_status,
)
from kvgate.routing.router import Router
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView
from kvgate.vocabulary.snapshot import FleetSnapshot

EJECTED = HealthState.EJECTED
_TTFT_EWMA_WEIGHT = 0.2


def _nothing() -> None:
    return None


class Fleet:
    def __init__(
        self,
        state: GatewayState,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        router: Router,
        clock: Clock,
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._router = router
        self._clock = clock
        self.health = HealthTracker(
            HealthRules.from_config(
                config.routing, config.health.unhealthy_threshold, config.health.healthy_threshold
            )
        )
        self._views: dict[str, tuple[ReplicaState, ReplicaHealth, ReplicaView]] = {}
        """Per replica id: the view last built, with the state and health it was built from."""
        self._summed: dict[str, tuple[ReplicaLoad, ReplicaLoad, ReplicaLoad]] = {}
        """Per replica id: (own load, foreign load, their sum) last added, so that while neither
        changes the sum is the same object and the view is reused."""
        self.foreign_loads: Callable[[], Mapping[str, ReplicaLoad]] = dict
        """What lies outside this gateway's claims per replica (``RedisCoordinator``), added to the
        ledger's as load, so a request fits only within the claim."""
        self.others_used: Callable[[], Mapping[str, int]] = dict
        """KV tokens other gateways' reservations hold per replica (``RedisCoordinator``): with the
        ledger's, the fleet's occupancy estimate (``kvgate.gateway.telemetry.fleet_work``)."""
        self.on_recovered: Callable[[], None] = _nothing
        """Called when a replica becomes healthy: queued work may fit now."""
        self._pool_of_model = {
            m.name: next(
                (p.name for p in config.pools if (not p.models or m.name in p.models) and p.role != "decode"),
                "",
            )
            for m in config.models
        }
        """The pool a model's requests are counted under until a replica is chosen: its first pool
        that takes requests first-hand (a decode pool takes them only by hand-off)."""
        state.removal_listeners.append(self.forget)

    def pool_of(self, model: str) -> str:
        return self._pool_of_model.get(model, "")

    def snapshot(self, now_s: float) -> FleetSnapshot:
        return FleetSnapshot(now_s, tuple(self.views(now_s)), self._state.ledger)

    def views(self, now_s: float) -> list[ReplicaView]:
        """Every replica's view at ``now_s``, reused while nothing in it changed. Health states are
        frozen too: while a replica's is the same object its view fields are the ones its view
        holds, except an ejected replica's, which depend on the time (its back-off ends)."""
        foreign = self.foreign_loads()
        loads = self._state.ledger.loads
        states = self.health.states
        cache = self._views
        views = []
        for r in self._state.replicas.values():
            replica_id = r.replica_id
            load = loads.get(replica_id, NO_LOAD)
            other = foreign.get(replica_id) if foreign else None
            if other is not None:
                summed = self._summed.get(replica_id)
                if summed is not None and summed[0] is load and summed[1] is other:
                    load = summed[2]
                else:
                    own = load
                    load = ReplicaLoad(
                        own.pending_prompt_tokens + other.pending_prompt_tokens,
                        own.resident_sequences + other.resident_sequences,
                        own.remaining_decode_tokens + other.remaining_decode_tokens,
                        own.reserved_kv_tokens + other.reserved_kv_tokens,
                        own.pending_uncached_tokens + other.pending_uncached_tokens,
                    )
                    self._summed[replica_id] = (own, other, load)
            health = states.get(replica_id, STARTING)
            capacity = r.kv_capacity_tokens
            cached = cache.get(replica_id)
            old = cached[2] if cached is not None and cached[0] is r else None
            if (
                old is not None
                and cached is not None
                and cached[1] is health
                and health.state is not EJECTED
                and old.kv_capacity_tokens == capacity
            ):
                healthy, ready_since_s, backoff_until_s = old.healthy, old.ready_since_s, old.backoff_until_s
            else:
                healthy, ready_since_s, backoff_until_s = health.view_fields(now_s)
                healthy = healthy and capacity > 0
            if (
                old is not None
                and old.load is load
                and old.healthy is healthy
                and old.ready_since_s == ready_since_s
                and old.backoff_until_s == backoff_until_s
                and old.scraped is r.scraped
                and old.ttft_ewma_s == r.ttft_ewma_s
                and old.kv_capacity_tokens == capacity
                and old.models is r.models
            ):
                views.append(old)
                continue
            view = ReplicaView(
                replica_id,
                r.url,
                r.pool,
                r.role,
                r.models,
                capacity,
                r.max_sequences,
                healthy,
                ready_since_s,
                load,
                r.scraped,
                r.ttft_ewma_s,
                backoff_until_s,
            )
            cache[replica_id] = (r, health, view)
            views.append(view)
        return views

    def observe(self, replica: ReplicaState, status: int | None, retry_after_s: float | None = None) -> None:
        """A replica's answer (``None``: no answer) as passive health. A success on a replica already
        healthy with no failure pending changes nothing the probes would not, so it is skipped."""
        outcome = outcome_of_status(status)
        if outcome is Outcome.SUCCESS:
            health = self.health.get(replica.replica_id)
            if health.state is HealthState.HEALTHY and not health.consecutive_failures:
                return
        self.observe_outcome(replica, outcome, retry_after_s)

    def observe_outcome(
        self, replica: ReplicaState, outcome: Outcome, retry_after_s: float | None = None
    ) -> None:
        now_s = self._clock()
        before = self.health.get(replica.replica_id).state
        after = self.health.observe(replica.replica_id, outcome, now_s, retry_after_s)
        replica.healthy = after.routable(now_s)
        self._metrics.observe_health(replica, ejected=after.state is EJECTED and before is not EJECTED)
        if after.state is EJECTED and before is not EJECTED:
            self._router.forget(replica.replica_id)
        elif after.state is HealthState.HEALTHY and before is not HealthState.HEALTHY:
            self.on_recovered()

    def observe_ttft(self, replica: ReplicaState, ttft_s: float) -> None:
        """Smooth the replica's time to first token: a replica much slower than its peers is cold."""
        previous = replica.ttft_ewma_s
        replica.ttft_ewma_s = (
            ttft_s if previous is None else previous + _TTFT_EWMA_WEIGHT * (ttft_s - previous)
        )

    def forget(self, replica_id: str) -> None:
        self._views.pop(replica_id, None)
        self._summed.pop(replica_id, None)
        self._metrics.forget_replica(replica_id)
        self._router.forget(replica_id)
        self.health.remove(replica_id)
