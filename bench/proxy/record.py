"""A finished request's record, timed in this process: its access-log line and, with tracing on, its
spans (``Proxy._done`` builds both on the event loop, once per request).

The access log is timed against what it chose not to be, so the choice stays checkable: the floor
(orjson and one ``write``, no library) and structlog through a bound logger. Every line goes to
``/dev/null``. Each figure is the best of ``repeats`` rounds of CPU time: a shared machine only ever
adds to it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import IO, TYPE_CHECKING

import orjson
import structlog

from kvgate.config.observability import AccessLog as AccessLogConfig
from kvgate.config.observability import Tracing as TracingConfig
from kvgate.gateway.state import ProxyRequest, ReplicaState
from kvgate.gateway.telemetry.access_log import AccessLog

if TYPE_CHECKING:
    from kvgate.gateway.telemetry.tracing import Tracing


def time_access_log(request: ProxyRequest, total: int, repeats: int = 5) -> dict[str, float]:
    """CPU microseconds per access-log line of ``request`` (a success), by how the line is written."""
    captured = io.BytesIO()
    with _stderr_into(captured):
        AccessLog(AccessLogConfig(), _no_pool).write(request, time.monotonic())
    fields = orjson.loads(captured.getvalue())
    event = fields.pop("event")
    with open(os.devnull, "wb") as sink, _stderr_into(sink):
        kvgate_json = AccessLog(AccessLogConfig(format="json"), _no_pool)
        kvgate_text = AccessLog(AccessLogConfig(format="text"), _no_pool)
        sampled_out = AccessLog(AccessLogConfig(sample_ratio=0.0), _no_pool)
        bound = structlog.wrap_logger(
            structlog.BytesLogger(sink),
            processors=[
                structlog.processors.TimeStamper(fmt=None),
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        )

        def floor() -> None:
            fields["timestamp"] = time.time()
            sink.write(orjson.dumps(fields) + b"\n")
            sink.flush()

        variants: dict[str, Callable[[], object]] = {
            "orjson + one `write`, no library (the floor)": floor,
            "kvgate, json (orjson, one `write`)": lambda: kvgate_json.write(request, time.monotonic()),
            "structlog through a bound logger (`make_filtering_bound_logger`), json": lambda: bound.info(
                event, **fields
            ),
            "kvgate, text (logfmt)": lambda: kvgate_text.write(request, time.monotonic()),
            "kvgate, a success sampled out": lambda: sampled_out.write(request, time.monotonic()),
        }
        return {label: _best_cpu_us(write, total, repeats) for label, write in variants.items()}


def time_tracing(request: ProxyRequest, total: int, repeats: int = 3) -> dict[str, float]:
    """CPU microseconds per request for its spans, sampled (request, admit, route, upstream) and
    sampled out (its root only), with nothing exported."""
    from kvgate.gateway.telemetry.tracing import Tracing

    replica = request.replica
    assert replica is not None, "the request was never sent"
    figures: dict[str, float] = {}
    for label, ratio in (("sampled: four SDK spans", 1.0), ("sampled out: its root span only", 0.0)):
        tracing = Tracing(TracingConfig(enabled=True, exporter="none", sample_ratio=ratio))
        figures[label] = _best_cpu_us(partial(_spans, tracing, request, replica), total, repeats)
        tracing.shutdown()
    request.trace = None
    return figures


def _spans(tracing: Tracing, request: ProxyRequest, replica: ReplicaState) -> None:
    request.trace = None
    tracing.upstream(request, replica, request.upstream_headers)
    tracing.finish(request, time.monotonic())


def _best_cpu_us(work: Callable[[], object], total: int, repeats: int) -> float:
    """CPU microseconds per call of ``work``, ``total`` calls a round, the best of ``repeats`` rounds."""
    best_s = math.inf
    for _ in range(repeats):
        start_s = time.process_time()
        for _ in range(total):
            work()
        best_s = min(best_s, time.process_time() - start_s)
    return best_s / total * 1e6


@contextlib.contextmanager
def _stderr_into(sink: IO[bytes]) -> Iterator[None]:
    """``sys.stderr`` writes into ``sink`` meanwhile: where an ``AccessLog`` made now writes."""
    text = io.TextIOWrapper(sink, write_through=True)
    try:
        with contextlib.redirect_stderr(text):
            yield
    finally:
        text.detach()


def _no_pool(model: str) -> str:
    return ""
