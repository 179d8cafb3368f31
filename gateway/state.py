"""The gateway's live state: the replicas it knows, their health, and the requests in flight.

One ``GatewayState`` per process, mutated only on the event loop thread (no locks). In-flight
counters go up when a request is routed to a replica and down exactly once in the proxy's
``finally``, so with no requests in flight every counter is zero; integration tests assert that.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from admission.decision import AdmissionRequest
from admission.ledger import InMemoryLedger
from config.schema import GatewayConfig, Model, Pool
from routing.replica import ReplicaLoad, Role, ScrapedMetrics
from routing.request import RoutingRequest


def replica_name(pool: str, url: str) -> str:
    """The name a replica goes by in what clients see (error messages): ``<pool>-<8 hex digits of
    SHA-256 of its URL>``. Stable across restarts and identical on every gateway of a fleet, and it
    gives away no address; ``/admin/pools`` and the logs pair it with the URL."""
    return f"{pool}-{hashlib.sha256(url.encode()).hexdigest()[:8]}"


@dataclass(slots=True, eq=False)
class ReplicaState:
    replica_id: str
    url: str
    pool: str
    role: Role
    models: frozenset[str]
    kv_capacity_tokens: int
    max_sequences: int
    name: str = ""
    """What clients may be told (``replica_name``); never the URL."""
    authorization: bytes | None = field(default=None, repr=False)
    """``Bearer <pool api_key>``, sent on every call to the replica, when its pool has a key (a
    secret: left out of the repr)."""
    healthy: bool = False
    probe_successes: int = 0
    probe_failures: int = 0
    in_flight: int = 0
    scraped: ScrapedMetrics | None = None
    """The last scrape of the replica's own ``/metrics``; routing checks its age."""
    ttft_ewma_s: float | None = None
    """Smoothed time to first token of requests kvgate sent here."""


@dataclass(slots=True, eq=False)
class ProxyRequest:
    """One client request, from parsed body to release. Never shared between requests."""

    request_id: str
    endpoint: str
    model: str
    stream: bool
    body: dict[str, Any]
    raw_body: bytes
    headers: list[tuple[bytes, bytes]]
    """The client's headers, as received (minus hop-by-hop ones)."""
    upstream_headers: list[tuple[bytes, bytes]]
    """What is sent to the replica: the client's headers plus ``x-request-id``, without its
    ``Authorization`` and ``Cookie`` unless ``server.forward_client_credentials``."""
    replica: ReplicaState | None = None
    response_started: bool = False
    disconnected: bool = False
    finished: bool = False
    arrived_s: float = 0.0
    admission: AdmissionRequest | None = None
    routing: RoutingRequest | None = None
    tried: list[str] = field(default_factory=list)
    """Replicas this request was sent to, in order; a retry excludes them."""
    usage_injected: bool = False
    """The gateway added ``stream_options.include_usage``: strip the usage-only chunk it brings."""
    prompt_tokens: int | None = None
    """The replica's own count, from ``usage``."""
    completion_tokens: int | None = None
    ttft_s: float | None = None
    """A non-streamed response's time to first token, until the metrics hear it (with the rest of
    the response's measurements, or at release when sending it to the client failed)."""


@dataclass(slots=True, eq=False)
class GatewayState:
    models: dict[str, Model]
    pools: dict[str, Pool]
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    in_flight: int = 0
    served: int = 0
    ledger: InMemoryLedger = field(default_factory=InMemoryLedger)
    queued: int = 0
    """Requests waiting in the admission queue."""
    removal_listeners: list[Callable[[str], None]] = field(default_factory=list)
    """Called with the id of each replica that leaves the set (its prefix and health state go)."""

    @classmethod
    def from_config(cls, config: GatewayConfig) -> GatewayState:
        state = cls(models={m.name: m for m in config.models}, pools={p.name: p for p in config.pools})
        for pool in config.pools:
            state.set_pool_urls(pool.name, pool.replicas)
        return state

    def pool_models(self, pool: Pool) -> frozenset[str]:
        return frozenset(pool.models or self.models)

    def set_pool_urls(self, pool_name: str, urls: Iterable[str]) -> None:
        """Make ``urls`` the pool's replica set: new ones start unprobed (not routable), missing ones
        are forgotten (requests in flight to them finish and release on their own objects)."""
        pool = self.pools[pool_name]
        wanted = {url.rstrip("/") for url in urls}
        for replica_id in [r.replica_id for r in self.replicas.values() if r.pool == pool_name]:
            if replica_id not in wanted:
                del self.replicas[replica_id]
                for listener in self.removal_listeners:
                    listener(replica_id)
        for url in sorted(wanted):
            if url not in self.replicas:
                self.replicas[url] = ReplicaState(
                    replica_id=url,
                    url=url,
                    pool=pool_name,
                    role=Role(pool.role),
                    models=self.pool_models(pool),
                    kv_capacity_tokens=pool.kv_capacity_tokens,
                    max_sequences=pool.max_sequences,
                    name=replica_name(pool_name, url),
                    authorization=None
                    if pool.api_key is None
                    else b"Bearer " + pool.api_key.get_secret_value().encode("latin-1"),
                )

    def routable(self, model: str) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.healthy and model in r.models]

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas.values())

    def ledger_totals(self) -> ReplicaLoad:
        return self.ledger.totals()

    def in_flight_by_replica(self) -> dict[str, int]:
        return {r.replica_id: r.in_flight for r in self.replicas.values()}
