"""The decision path's parts, built once per gateway over one clock.

A request's life is ``price`` (``Pricer``), ``admit`` and route (``Dispatcher``, over the
``Fleet``'s snapshot), proxy, ``account`` (``Accounting``) and ``release`` (``Dispatcher``); the
proxy (``kvgate.gateway.request_path.proxy``) calls them in that order. They share the gateway state, the
metrics and one injected clock, so a replay on a manual clock drives the whole path deterministically.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from kvgate.admission.controller import AdmissionController
from kvgate.admission.itl_guard import ItlGuard
from kvgate.admission.tenants import TenantDirectory
from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.replicas.fleet import Fleet
from kvgate.gateway.request_path.accounting import Accounting
from kvgate.gateway.request_path.dispatcher import Dispatcher
from kvgate.gateway.request_path.pricing import Pricer
from kvgate.gateway.state import GatewayState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.router import Router
from kvgate.vocabulary.clock import Clock


@dataclass(frozen=True, slots=True)
class DecisionPath:
    clock: Clock
    pricer: Pricer
    fleet: Fleet
    dispatcher: Dispatcher
    accounting: Accounting
    metrics: GatewayMetrics

    @classmethod
    def build(
        cls,
        state: GatewayState,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        clock: Clock = time.monotonic,
    ) -> DecisionPath:
        tenants = TenantDirectory(config.admission, config.auth)
        controller = AdmissionController(config.admission, state.ledger, tenants)
        metrics.bind_promises(lambda: controller.promise_counts)
        guard = controller.itl_guard
        if guard is not None:
            metrics.bind_itl_guard(lambda: _itl_limits(state, guard))
            state.removal_listeners.append(guard.forget)
        router = Router(config.routing, random.Random(config.routing.seed))
        fleet = Fleet(state, config, metrics, router, clock)
        for pool in config.pools:
            metrics.declare_pool(pool.name)
        dispatcher = Dispatcher(state, config, metrics, fleet, controller, router, clock)
        fleet.on_recovered = dispatcher.pump
        return cls(
            clock,
            Pricer(state, config, controller.tenants),
            fleet,
            dispatcher,
            Accounting(state, controller, fleet, metrics),
            metrics,
        )


def _itl_limits(state: GatewayState, guard: ItlGuard) -> list[tuple[str, str, int]]:
    """Each replica's learned limit under its pool and name (a metric never carries a URL)."""
    replicas = state.replicas
    return [
        (replica.pool, replica.name, limit)
        for replica_id, limit in guard.limits.items()
        if (replica := replicas.get(replica_id)) is not None
    ]
