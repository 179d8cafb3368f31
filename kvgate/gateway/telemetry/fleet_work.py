"""The work signals, read off the live state: what is queued, pending and resident, per pool.

``FleetWork.pool_work`` is the ``PoolWorkSource`` that ``GatewayMetrics`` reads on every scrape of
``/metrics`` and ``/signals``: queued prompt tokens from the admission queue, pending prompt tokens
and resident sequences from the reservations ledger (each reservation counted in its replica's
pool), the KV occupancy estimate (reserved over capacity; with coordination, every gateway's
reservations, never their claims) beside the replica's scraped value, and
whether each replica is ready or still inside its warm-up window. Every model a pool serves has a
row, so an idle pool reports zeros rather than nothing. It reads; it never changes state.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from kvgate.gateway.replicas.fleet import Fleet
from kvgate.gateway.request_path.dispatcher import Dispatcher
from kvgate.gateway.state import GatewayState
from kvgate.gateway.telemetry.pool_work import ModelWork, PoolWork, ReplicaWork
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import Role


class FleetWork:
    def __init__(
        self,
        state: GatewayState,
        dispatcher: Dispatcher,
        fleet: Fleet,
        scrape_stale_s: float,
        warmup_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self._state = state
        self._dispatcher = dispatcher
        self._fleet = fleet
        self._scrape_stale_s = scrape_stale_s
        self._warmup_s = warmup_s
        self._clock = clock

    def pool_work(self) -> Iterable[PoolWork]:
        now_s = self._clock()
        state = self._state
        models: dict[str, dict[str, list[int]]] = {}
        for name, pool in state.pools.items():
            models[name] = defaultdict(lambda: [0, 0, 0, 0, 0])
            for model in state.pool_models(pool):
                models[name][model] = [0, 0, 0, 0, 0]
        for request in self._dispatcher.queued_requests():
            if request.admission is not None:
                row = models[self._fleet.pool_of(request.model)][request.model]
                row[0] += 1
                row[1] += request.admission.cost.prompt_tokens
        replicas: dict[str, list[ReplicaWork]] = {p: [] for p in state.pools}
        views = {v.replica_id: v for v in self._fleet.views(now_s)}
        others_used = self._fleet.others_used()
        for replica in state.replicas.values():
            held = state.ledger.resident(replica.replica_id)
            for reservation in held:
                row = models[replica.pool][reservation.cost.model]
                row[2] += reservation.pending_prompt_tokens
                row[3] += 1
                row[4] += max(0, reservation.remaining_decode_tokens)
            view = views[replica.replica_id]
            capacity = replica.kv_capacity_tokens
            reserved = state.ledger.load(replica.replica_id).reserved_kv_tokens
            reserved += others_used.get(replica.replica_id, 0)
            scraped = replica.scraped
            fresh = scraped is not None and now_s - scraped.scraped_at_s <= self._scrape_stale_s
            ready = view.healthy and view.ready_since_s is not None and view.ready_since_s <= now_s
            replicas[replica.pool].append(
                ReplicaWork(
                    replica=replica.replica_id,
                    kv_capacity_tokens=capacity,
                    kv_occupancy_estimate_ratio=reserved / capacity if capacity else 0.0,
                    kv_occupancy_scraped_ratio=scraped.kv_cache_usage_ratio if fresh and scraped else None,
                    ready=ready,
                    warming=ready
                    and view.ready_since_s is not None
                    and now_s - view.ready_since_s < self._warmup_s,
                )
            )
        return [
            PoolWork(
                pool=name,
                role=Role(state.pools[name].role),
                models=tuple(
                    ModelWork(m, row[0], row[1], row[2], row[3], row[4])
                    for m, row in sorted(models[name].items())
                ),
                replicas=tuple(replicas[name]),
            )
            for name in state.pools
        ]
