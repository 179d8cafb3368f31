"""Every refusal of the decision path reaches the client through one renderer, with a capped hint.

A ``no_replica`` refusal used to carry ``no_replica_retry_after_s`` as it was configured on the
gateway's own paths (admission off, no replica taking an admitted request, a prompt a replica could
not count) while admission's paths capped it: now each goes through ``kvgate.admission.refusals`` and
``errors.refusal_error``, so the Retry-After a client sees is capped on every path.
"""

from __future__ import annotations

import asyncio

from kvgate.admission.decision import Refusal, RefusalReason
from kvgate.config.loader import parse_config
from kvgate.gateway.edge.errors import (
    ServiceUnavailable,
    TooManyRequests,
    refusal_error,
    upstream_status_error,
)
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics


def test_a_refusal_renders_its_status_reason_and_retry_after_once() -> None:
    from kvgate.admission.retry_after import retry_after

    refusal = Refusal(429, RefusalReason.QUEUE_FULL, "The admission queue is full.", retry_after(2.5, 60.0))
    error = refusal_error(refusal)
    assert isinstance(error, TooManyRequests) and error.reason == "queue_full"
    assert dict(error.headers()) == {
        b"content-type": b"application/json",
        b"retry-after": b"3",
        b"retry-after-ms": b"2500",
    }


def test_no_replica_with_admission_off_sends_a_capped_retry_after() -> None:
    config = parse_config(
        {
            "models": [
                {"name": "m", "max_model_len": 4096, "kv_bytes_per_token": 1, "tokenizer": {"kind": "bytes"}}
            ],
            "pools": [{"name": "p", "replicas": ["http://10.0.0.1:8000"], "kv_capacity_tokens": 8000}],
            "admission": {"enabled": False, "no_replica_retry_after_s": 600, "retry_after_cap_s": 60},
        },
        {},
    )
    state = GatewayState.from_config(config)
    path = DecisionPath.build(state, config, GatewayMetrics())
    body = {"model": "m", "prompt": "hello", "max_tokens": 8}
    request = ProxyRequest("r", "r", "/v1/completions", "m", False, body, b"{}", [], [])

    async def admit() -> object:
        assert await path.pricer.price(request) is None
        return await path.dispatcher.admit(request)

    refusal = asyncio.run(admit())
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.NO_REPLICA
    error = refusal_error(refusal)
    assert isinstance(error, ServiceUnavailable)
    assert dict(error.headers())[b"retry-after"] == b"60", "capped like every other Retry-After"


def test_a_replicas_own_retry_after_is_capped_too() -> None:
    error = upstream_status_error(429, "p-0", "http://10.0.0.1:8000", b"{}", 3600.0, 60.0)
    headers = dict(error.headers())
    assert (error.status, headers[b"retry-after"], headers[b"x-should-retry"]) == (429, b"60", b"false")
    quick = dict(upstream_status_error(429, "p-0", "http://10.0.0.1:8000", b"{}", 2.5, 60.0).headers())
    assert (quick[b"retry-after"], quick[b"retry-after-ms"]) == (b"3", b"2500")
    assert b"x-should-retry" not in quick


def test_a_refusal_of_an_unknown_status_is_a_bug_not_a_429() -> None:
    import pytest

    with pytest.raises(KeyError):
        refusal_error(Refusal(413, RefusalReason.INVALID_REQUEST, "too large"))
