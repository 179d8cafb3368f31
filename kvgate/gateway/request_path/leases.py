"""The reservations' leases: renewed while their requests are served, released when they run out.

Every reservation in the ledger has a lease (``admission.reservation_lease_s``). ``Leases`` holds
the requests the proxy is serving and renews their reservations every third of a lease, at most
``RENEWALS_PER_TICK`` an upkeep: a pass over ten thousand open streams at once held the event loop
22 to 25 ms (``docs/streams.md``), so a pass is spread over ticks (10,000 requests: 20 ticks, about
a second), far inside the lease. A request that finished but still holds a reservation leaked it (a
lost release: a bug), and its lease is left to run out. ``upkeep`` then releases what ran out,
counts it in ``kvgate_reservations_expired_total`` and logs it, so a leak costs capacity for one
lease, never for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvgate.admission.ledger import InMemoryLedger
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger("kvgate.leases")

RENEWALS_PER_TICK = 512


class Leases:
    def __init__(
        self, state: GatewayState, metrics: GatewayMetrics, pool_of: Callable[[str], str], now_s: float
    ) -> None:
        self._state = state
        self._ledger: InMemoryLedger = state.ledger
        self._metrics = metrics
        self._pool_of = pool_of
        self._lease_s = state.ledger.lease_s
        self._renewed_at_s = now_s
        self._held: dict[str, ProxyRequest] = {}
        """Requests holding a reservation, by id, until released."""
        self._due: list[str] = []
        """The current renewal pass: ids of held requests not renewed yet."""

    def hold(self, request: ProxyRequest) -> None:
        self._held[request.request_id] = request

    def drop(self, request: ProxyRequest) -> None:
        self._held.pop(request.request_id, None)

    def requests(self) -> list[ProxyRequest]:
        """Requests holding a reservation, each on ``request.replica`` once the proxy sent it."""
        return list(self._held.values())

    def upkeep(self, now_s: float) -> bool:
        """Renew what is due, release what ran out; True when something ran out (room freed)."""
        if not self._due and now_s - self._renewed_at_s >= self._lease_s / 3:
            self._renewed_at_s = now_s
            self._due = list(self._held)
        if self._due:
            self._renew_due(now_s)
        lapsed = self._ledger.expire(now_s)
        for held in lapsed:
            replica = self._state.replicas.get(held.replica_id)
            pool = replica.pool if replica is not None else self._pool_of(held.cost.model)
            self._metrics.count_expired(pool)
            log.warning(
                "reservation of request %s on replica %s (%d KV tokens) expired after its %g s lease "
                "and was released: its request never released it",
                held.request_id,
                held.replica_id,
                held.kv_tokens,
                self._lease_s,
            )
        return bool(lapsed)

    def _renew_due(self, now_s: float) -> None:
        """Renew the next ``RENEWALS_PER_TICK`` reservations of the pass whose requests the proxy
        still serves; a finished request that still holds one leaked it, and its lease runs out."""
        due = self._due
        batch = due[-RENEWALS_PER_TICK:]
        del due[-RENEWALS_PER_TICK:]
        held = self._held
        for request_id in batch:
            request = held.get(request_id)
            if request is None:
                continue  # released since the pass began
            if request.finished:
                del held[request_id]
            else:
                self._ledger.renew(request_id, now_s)
