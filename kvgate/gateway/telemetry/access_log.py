"""The access log: one line per request on the completion routes, written to stderr when it is done.

The proxy calls ``AccessLog.write`` once per request, in its ``finally``, and the line is built from
what the ``ProxyRequest`` already holds: both ids (the gateway's ``request_id`` and the client's
``X-Request-Id`` label), tenant, model, pool, the replica by its name (never its URL), prompt
tokens as estimated and as the replica counted them, prompt tokens routing expected the replica
to find in its prefix cache and those it says it found, the output cap priced, tokens produced, queue
wait, time to first token, duration, status, reason and retries. It never holds a header value, a
body or a replica address, so no credential or prompt can reach it.

Sampling keeps ``sample_ratio`` of the successes; a refusal, an error and a request that ended with
a reason (the client left, the replica failed after the first byte) are always written. A json line
is orjson's serialisation of the fields with the time in seconds since the epoch last: the bytes
structlog's ``TimeStamper(fmt=None)`` and ``JSONRenderer(serializer=orjson.dumps)`` write, without
two processor calls per line; structlog renders text (logfmt, with an ISO 8601 time). The lines
of one event-loop turn are written together, with one ``write`` call, flushed, at the end of that
turn (``call_soon``) and at the gateway's stop: whole lines, never interleaved, and one system call
for the requests that ended together rather than one each. A process killed outright loses at most
the lines of the turn it was in.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from kvgate.config.observability import AccessLog as AccessLogConfig
from kvgate.gateway.edge.errors import (
    BadGateway,
    GatewayError,
    GatewayTimeout,
    InternalError,
    ModelNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
)
from kvgate.gateway.state import ProxyRequest, retries

CLIENT_CLOSED_REQUEST = 499
"""The status logged for a client that left before any answer (NGINX's convention)."""
_TEXT_ORDER = ["timestamp", "event", "status", "reason", "request_id", "x_request_id", "model", "replica"]
_REASON_OF_ERROR: tuple[tuple[type[GatewayError], str], ...] = (
    (GatewayTimeout, "upstream_timeout"),
    (BadGateway, "upstream_error"),
    (ServiceUnavailable, "upstream_unavailable"),
    (TooManyRequests, "upstream_saturated"),
    (PayloadTooLarge, "payload_too_large"),
    (ModelNotFound, "model_not_found"),
    (InternalError, "internal_error"),
)
"""The reason of an error the gateway gave none (it decided nothing: a replica's failure, a body it
could not read), by its class; any other is ``invalid_request``."""


def reason_of(error: GatewayError) -> str:
    if error.reason is not None:
        return error.reason
    for kind, reason in _REASON_OF_ERROR:
        if isinstance(error, kind):
            return reason
    return "invalid_request"


def outcome(request: ProxyRequest) -> tuple[int, str | None]:
    """The status the client got and why, if there is a why: the error's reason, or
    ``client_disconnected``. A client that left before any answer is 499; a request that ended
    without one otherwise (an exception in the gateway) is the 500 the server then sends."""
    reason = None if request.error is None else reason_of(request.error)
    if request.disconnected and reason is None:
        reason = "client_disconnected"
    status = request.status or (CLIENT_CLOSED_REQUEST if request.disconnected else 500)
    if status == 500 and reason is None:
        reason = "internal_error"
    return status, reason


class AccessLog:
    """No bound logger: its context binding and level filtering, neither of use to a line that is
    always the same event, about doubled the cost of a line (docs/proxy-report.md;
    ``python -m bench.bench_proxy --access-log N``). A json line is written by orjson alone,
    a text line by structlog's processors called directly."""

    def __init__(self, config: AccessLogConfig, pool_of: Callable[[str], str]) -> None:
        self._json = config.format == "json"
        self._stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
        self._render = structlog.processors.LogfmtRenderer(key_order=_TEXT_ORDER, bool_as_flag=False)
        self._file = sys.stderr.buffer
        self._pending: list[bytes] = []
        """Lines of this event-loop turn, each with its newline, not yet written."""
        self._sample_ratio = config.sample_ratio
        self._pool_of = pool_of

    def write(self, request: ProxyRequest, now_s: float) -> None:
        """Log the finished ``request`` (``now_s``: monotonic seconds), unless sampled out."""
        status, reason = outcome(request)
        ratio = self._sample_ratio
        if reason is None and status < 400 and ratio < 1.0 and random.random() >= ratio:
            return
        admission = request.admission
        replica = request.replica
        first_token_s = request.first_token_s
        event: dict[str, Any] = {
            "event": "access",
            "request_id": request.request_id,
            "x_request_id": request.x_request_id,
            "endpoint": request.endpoint,
            "stream": request.stream,
            "tenant": request.tenant,
            "model": request.model or None,
            "pool": replica.pool if replica is not None else (self._pool_of(request.model) or None),
            "replica": None if replica is None else replica.name,
            "prompt_tokens_estimated": None if admission is None else admission.cost.prompt_tokens,
            "prompt_tokens": request.prompt_tokens,
            "max_output_tokens": None if admission is None else admission.cost.max_output_tokens,
            "completion_tokens": request.completion_tokens,
            "cached_tokens_expected": request.cached_tokens_expected,
            "cached_tokens": request.cached_tokens,
            "queue_wait_s": request.queue_wait_s or 0.0,
            "ttft_s": None if first_token_s is None else first_token_s - request.arrived_s,
            "duration_s": now_s - request.started_s,
            "status": status,
            "reason": reason,
            "retries": retries(request),
        }
        pending = self._pending
        if self._json:
            event["timestamp"] = time.time()
            pending.append(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
        else:
            pending.append(self._render(None, "info", self._stamp(None, "info", event)).encode() + b"\n")
        if len(pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        """Write the lines not yet written, in one call."""
        if not self._pending:
            return
        lines, self._pending = self._pending, []
        self._file.write(b"".join(lines))
        self._file.flush()
