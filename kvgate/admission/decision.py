"""The values the admission decision speaks in: what is asked, and the three possible answers.

``Admit`` carries the replicas that can take the request (routing picks one), ``Queue`` a ticket
the edge waits on, ``Refusal`` an HTTP status, a reason from a closed set (metrics count by it), a
message for the client and, for overload, a Retry-After. Overload is an expected outcome, so it is
a value, never an exception; the edge renders it in one place (``kvgate.gateway.edge.errors.refusal_error``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kvgate.admission.cost import CostEstimate
from kvgate.admission.retry_after import RetryAfter
from kvgate.admission.tenants import Tenant
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.value import frozen_value


class RefusalReason(StrEnum):
    KV_CAPACITY = "kv_capacity"
    QUEUE_FULL = "queue_full"
    TENANT_BUDGET = "tenant_budget"
    TENANT_REQUESTS = "tenant_requests"
    TENANT_CONCURRENCY = "tenant_concurrency"
    DEADLINE = "deadline"
    TTFT_SLO = "ttft_slo"
    NO_REPLICA = "no_replica"
    COORDINATION_UNAVAILABLE = "coordination_unavailable"
    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"


@frozen_value
class AdmissionRequest:
    request_id: str
    tenant: Tenant
    cost: CostEstimate
    client_timeout_s: float | None = None
    """The client's own timeout from a deadline header (``client_timeout_s`` in kvgate.admission.deadline)."""
    body: bytes | None = field(default=None, repr=False, compare=False)
    """The request body as sent: with the tenant, its digest (``kvgate.admission.promises.fingerprint``)
    recognises a refused request coming back to claim its promised slot. Digested only when a
    promise is booked or may be claimed, which most requests never need. None: never promised."""
    retry_count: int | None = None
    """The client's own count of earlier attempts (openai SDKs' ``x-stainless-retry-count``), when
    sent: 0 marks a first attempt, which never claims a promise even if an identical body holds one."""
    request_key: str | None = None
    """The client's own identity for this request (``Idempotency-Key``, the same on every attempt),
    when it sends one: what its promise is booked under (``kvgate.admission.promises.promise_key``)."""
    prompt_blocks: tuple[int, ...] = field(default=(), repr=False, compare=False)
    """The prompt's chained block hashes (routing's, computed once at the edge): the part of them a
    replica already holds for resident requests needs no room there (``kvgate.vocabulary.sharing``)."""

    @property
    def model(self) -> str:
        return self.cost.model


@frozen_value
class Admit:
    candidates: tuple[ReplicaView, ...]
    """Replicas with room for the worst case and a free sequence slot, most room first."""


@dataclass(frozen=True, slots=True)
class Queue:
    ticket: int
    expected_wait_s: float
    expires_at_s: float
    """The request leaves the queue with a 429 (``expire``) if not dispatched by then."""


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    reason: RefusalReason
    message: str
    retry_after: RetryAfter | None = None
    param: str | None = None
    """For a 400: the request field the client should change, as OpenAI errors name it."""


Decision = Admit | Queue | Refusal


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A queued request that may now go: route it among ``candidates`` and reserve."""

    ticket: int
    request: AdmissionRequest
    candidates: tuple[ReplicaView, ...]
    enqueued_at_s: float
    expires_at_s: float
    waited_s: float
    promised_due_s: float | None = None


@dataclass(frozen=True, slots=True)
class Expired:
    ticket: int
    request: AdmissionRequest
    refusal: Refusal
