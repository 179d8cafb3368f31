"""Every refusal the decision path can give, each built in one place with its wording and its hint.

A refusal is a value (``Refusal``): a status, a reason from a closed set, a message that tells the
client what to change or when to come back, and for overload a ``RetryAfter`` capped at
``retry_after_cap_s`` (the official SDKs ignore a longer one). The edge renders it to an
OpenAI-shaped body and headers in one place (``kvgate.gateway.edge.errors.refusal_error``) and never composes
one itself.
"""

from __future__ import annotations

import math

from kvgate.admission.cost import CostEstimate
from kvgate.admission.deadline import WaitBound
from kvgate.admission.decision import Refusal, RefusalReason
from kvgate.admission.queue import QueueStats
from kvgate.admission.retry_after import retry_after
from kvgate.admission.tenants import RequestLimit, Tenant
from kvgate.config.admission import AdmissionConfig
from kvgate.vocabulary.snapshot import FleetSnapshot


def too_large(cost: CostEstimate, largest_kv_tokens: int) -> Refusal:
    """No replica could ever hold the request's worst case: a 400 naming the field to change."""
    text = (
        f"This request needs {cost.kv_tokens} tokens of KV cache ({cost.prompt_tokens} prompt + "
        f"{cost.max_output_tokens} max output) but the largest replica serving '{cost.model}' "
        f"holds {largest_kv_tokens}. Reduce the prompt or max_tokens."
    )
    return Refusal(400, RefusalReason.KV_CAPACITY, text, param="max_tokens")


def too_many_sequences(cost: CostEstimate, most_slots: int) -> Refusal:
    """No replica could ever run all the request's sequences under the guard: a 400 too."""
    text = (
        f"This request runs {cost.sequences} sequences at once but a replica serving '{cost.model}' "
        f"runs at most {most_slots} (the inter-token-latency guard), so it could never be admitted. "
        "Reduce n or the number of prompts."
    )
    return Refusal(400, RefusalReason.KV_CAPACITY, text, param="n")


def over_budget(tenant: Tenant, kv_tokens: int, wait_s: float, config: AdmissionConfig) -> Refusal:
    text = (
        f"Tenant '{tenant.name}' is over its budget of {tenant.tokens_per_min} tokens per minute; "
        f"this request counts {kv_tokens} (prompt + max output)."
    )
    return _come_back(429, RefusalReason.TENANT_BUDGET, text, wait_s, config)


def over_request_limit(tenant: Tenant, limit: RequestLimit, config: AdmissionConfig) -> Refusal:
    """A tenant over its requests per minute or its requests at once
    (``kvgate.admission.tenants.TenantDirectory.open_request``)."""
    if limit.concurrent:
        text = (
            f"Tenant '{tenant.name}' already has {tenant.max_concurrent_requests} requests in flight, "
            "its limit of concurrent requests."
        )
        return _come_back(429, RefusalReason.TENANT_CONCURRENCY, text, limit.wait_s, config)
    text = f"Tenant '{tenant.name}' is over its limit of {tenant.requests_per_min} requests per minute."
    return _come_back(429, RefusalReason.TENANT_REQUESTS, text, limit.wait_s, config)


def queue_full(stats: QueueStats, expected_s: float, config: AdmissionConfig) -> Refusal:
    """The queue's bounds are reached, so no place is promised either: the wait is a forecast the
    gateway cannot stand behind (``x-should-retry: false``)."""
    text = (
        f"The admission queue is full ({stats.requests} requests, {stats.kv_tokens} tokens queued, "
        f"{stats.promised_requests} promised)."
    )
    return _come_back(429, RefusalReason.QUEUE_FULL, text, expected_s, config, promised=False)


def place_held(model: str, due_in_s: float, config: AdmissionConfig) -> Refusal:
    """A client back before the slot it was promised: told again when that slot is due."""
    text = (
        f"The servers for '{model}' are at KV-cache capacity; this request holds a place "
        f"due in {due_in_s:.1f} s."
    )
    return _come_back(429, RefusalReason.KV_CAPACITY, text, due_in_s, config)


def overload(
    model: str,
    expected_s: float,
    budget_s: float,
    bound: WaitBound,
    config: AdmissionConfig,
    promised: bool = True,
) -> Refusal:
    """The expected wait is longer than the request may wait: the queue's limit (``kv_capacity``),
    its client's timeout when that is shorter (``deadline``), or its time-to-first-token objective
    (its tenant's, else its model's) less its own prefill when that is shorter still (``ttft_slo``).
    ``promised``: room is held for it at that time; if not, it is told not to retry."""
    wait = (
        f"about {expected_s:.1f} s"
        if math.isfinite(expected_s)
        else "open-ended: new requests arrive faster than the servers take work"
    )
    if bound is WaitBound.CLIENT_TIMEOUT:
        text = (
            f"The expected wait for KV-cache capacity on '{model}' ({wait}) exceeds this "
            f"request's timeout of {budget_s:.1f} s."
        )
    elif bound is WaitBound.TTFT_SLO:
        text = (
            f"The expected wait for KV-cache capacity on '{model}' ({wait}) would leave this request "
            f"past its time-to-first-token objective: it may wait {budget_s:.1f} s."
        )
    else:
        text = (
            f"The servers for '{model}' are at KV-cache capacity: the expected wait ({wait}) "
            f"exceeds the {budget_s:.1f} s queue limit."
        )
    return _come_back(429, bound.value, text, expected_s, config, promised)


def decode_full(model: str, expected_s: float, config: AdmissionConfig) -> Refusal:
    """A disaggregated request whose decode pool has no room for its worst case: the decode pool is
    the bottleneck, so the wait is its own."""
    text = f"The decode replicas for '{model}' are at KV-cache capacity."
    return _come_back(429, RefusalReason.KV_CAPACITY, text, expected_s, config)


def none_serving(model: str, fleet: FleetSnapshot, config: AdmissionConfig) -> Refusal:
    """No replica can serve ``model`` now: back when the first backed-off one is due, if any."""
    now_s = fleet.now_s
    back_s = [
        v.backoff_until_s - now_s
        for v in fleet.replicas
        if model in v.models and v.healthy and v.ready_since_s is not None and v.backoff_until_s > now_s
    ]
    wait_s = min(back_s) if back_s else config.no_replica_retry_after_s
    return no_replica(f"No replica serving '{model}' is available.", wait_s, config)


def no_replica(message: str, wait_s: float, config: AdmissionConfig) -> Refusal:
    """No replica can serve the request now: a 503 whose Retry-After is capped like every other."""
    return _come_back(503, RefusalReason.NO_REPLICA, message, wait_s, config)


def _come_back(
    status: int,
    reason: RefusalReason,
    text: str,
    wait_s: float,
    config: AdmissionConfig,
    promised: bool = True,
) -> Refusal:
    """A refusal that says when to come back: the capped hint, in the headers and the message."""
    hint = retry_after(wait_s, config.retry_after_cap_s, promised)
    return Refusal(status, reason, f"{text} Retry after {hint.seconds} s.", hint)
