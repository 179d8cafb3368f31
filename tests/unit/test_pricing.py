"""Pricing reads once, from the parsed request, everything admission and routing will need."""

from __future__ import annotations

import asyncio
import dataclasses
import tracemalloc
from typing import Any

from kvgate.config.loader import parse_config
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics


def priced(headers: list[tuple[bytes, bytes]], body: dict[str, Any] | None = None) -> ProxyRequest:
    config = parse_config(
        {
            "models": [
                {"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 1, "tokenizer": {"kind": "bytes"}}
            ],
            "pools": [{"name": "p", "replicas": ["http://10.0.0.1:8000"], "kv_capacity_tokens": 8000}],
        },
        {},
    )
    path = DecisionPath.build(GatewayState.from_config(config), config, GatewayMetrics())
    body = body or {"model": "m", "prompt": "hello there", "max_tokens": 16}
    request = ProxyRequest("r", "r", "/v1/completions", "m", False, body, b"{}", headers, [])
    assert asyncio.run(path.pricer.price(request)) is None
    return request


def test_the_clients_own_request_key_and_retry_count_reach_admission() -> None:
    request = priced([(b"idempotency-key", b"req-7f3a"), (b"x-stainless-retry-count", b"2")])
    assert request.admission is not None
    assert (request.admission.request_key, request.admission.retry_count) == ("req-7f3a", 2)
    assert request.routing is not None and request.routing.max_output_tokens == 16


def test_a_request_without_them_is_priced_all_the_same() -> None:
    request = priced([])
    assert request.admission is not None
    assert (request.admission.request_key, request.admission.retry_count) == (None, None)


def test_a_rewritten_body_is_held_in_a_block_its_own_size() -> None:
    """The body is rewritten (a default output cap) and kept for the request's whole life, a
    stream's included: orjson's bytes sit in a 4 KiB block whatever their length. The block is
    measured as the traced memory its release gives back, whichever frame allocated it, so the
    check means the same for the sources and the compiled build."""
    tracemalloc.start()
    try:
        request = priced([], {"model": "m", "prompt": "hello there"})
        length = len(request.raw_body)
        assert request.admission is not None and request.admission.body is request.raw_body
        request.admission = dataclasses.replace(request.admission, body=None)  # its only other holder
        held_bytes = tracemalloc.get_traced_memory()[0]
        request.raw_body = b""
        held_bytes -= tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert length < 200
    assert length - 64 < held_bytes <= length + 64, f"{held_bytes} bytes held for a {length}-byte body"
