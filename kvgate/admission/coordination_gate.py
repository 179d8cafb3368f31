"""Whether a gateway may admit while it shares its fleet with other gateways it may not see.

Gateways in front of one fleet see each other's reservations through Redis
(``kvgate.gateway.coordination.coordinator``). A gateway *sees the others* while its latest sync reached Redis
and its last good sync is at most one lease old: that is exactly while the claims it decides within are still
its own (``kvgate.admission.claims``). When it does not, ``fail_mode`` says what happens to new requests:
``open`` admits them on the gateway's own ledger alone (the others' reservations are invisible, so the fleet
may be over-committed by them), ``closed`` refuses them with a 503 whose Retry-After is the next sync. The
gate decides on values only (the time and the sync's outcome are handed in), so every transition is a
table-driven test.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvgate.admission.decision import Refusal, RefusalReason
from kvgate.admission.retry_after import retry_after


class FailMode(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class CoordinationStatus:
    """What the gateway knows of the other gateways at one instant: for metrics and readiness."""

    up: bool
    """True while the gateway sees the others (``CoordinationGate.sees_others``)."""
    last_sync_age_s: float | None
    """Seconds since the last good sync; None before the first."""
    refusing: bool
    """True while new requests are refused for it (``fail_mode: closed`` and not up)."""
    gateways: int = 1
    """Live gateways in the namespace, this one included, as the last sync saw them."""
    claims: tuple[tuple[str, int, int], ...] = ()
    """(replica id, KV tokens, sequence slots) this gateway holds a claim on (``kvgate.admission.claims``)."""


@dataclass(frozen=True, slots=True)
class CoordinationGate:
    fail_mode: FailMode
    lease_s: float
    """Seconds a sync's view of the other gateways stays valid (their keys' lease)."""
    retry_after_s: float
    """What a refused client is told to wait: the next sync may restore the view."""

    @property
    def may_refuse(self) -> bool:
        """False when ``refusal`` is always None, so the edge need not ask it on every request."""
        return self.fail_mode is FailMode.CLOSED

    def sees_others(self, now_s: float, reachable: bool, last_sync_s: float | None) -> bool:
        """``reachable``: the latest sync attempt reached Redis; ``last_sync_s``: when the last good
        one ended (None: never)."""
        return reachable and last_sync_s is not None and now_s - last_sync_s <= self.lease_s

    def refusal(self, now_s: float, reachable: bool, last_sync_s: float | None) -> Refusal | None:
        """The 503 for a new request, or None when it may go on to admission."""
        if self.fail_mode is FailMode.OPEN or self.sees_others(now_s, reachable, last_sync_s):
            return None
        return Refusal(
            503,
            RefusalReason.COORDINATION_UNAVAILABLE,
            "The gateway cannot see the other gateways' reservations (Redis coordination is down) "
            "and is configured to refuse requests until it can.",
            retry_after(self.retry_after_s, self.retry_after_s),
        )

    def status(self, now_s: float, reachable: bool, last_sync_s: float | None) -> CoordinationStatus:
        up = self.sees_others(now_s, reachable, last_sync_s)
        age_s = None if last_sync_s is None else max(0.0, now_s - last_sync_s)
        return CoordinationStatus(up, age_s, not up and self.fail_mode is FailMode.CLOSED)
