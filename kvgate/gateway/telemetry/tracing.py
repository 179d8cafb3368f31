"""OpenTelemetry spans of the completion routes, when ``tracing.enabled`` (the ``otel`` extra).

A request is one SERVER span named after its route (``POST /v1/chat/completions``), continuing the
client's W3C trace context when it sent a ``traceparent``. Under it: ``admit`` (from arrival until
the request was routed or refused, with ``queue`` under it when it waited), ``route`` (each choice
of a replica) and ``upstream`` (each attempt on a replica, a CLIENT span). The replica receives a
``traceparent`` naming its attempt's span, so a vLLM started with ``--otlp-traces-endpoint``
continues the trace under it; the client's own ``traceparent`` and ``tracestate`` are replaced.

Only the upstream span is started while the request is served: its id must be known when the
attempt's headers are written. Every other span is built when the request is done (the proxy's
``finally``), from the times the ``ProxyRequest`` already keeps, with those times as its start and
end. A trace sampled out builds nothing beyond its root (the replica gets the root's context, not
sampled). With tracing off the proxy holds no ``Tracing``: no span objects, no header work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from kvgate.config.observability import Tracing as TracingConfig
from kvgate.gateway.state import ProxyRequest, ReplicaState, retries
from kvgate.gateway.telemetry.access_log import outcome

_CONTEXT_HEADERS = (b"traceparent", b"tracestate")


@dataclass(slots=True)
class RequestTrace:
    """The spans a request has open while it is served."""

    root: Span
    attempts: list[tuple[Span, ReplicaState, float]] = field(default_factory=list)
    """Each attempt's upstream span, its replica and when it started (monotonic seconds)."""


class Tracing:
    def __init__(self, config: TracingConfig) -> None:
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        resource = Resource.create({"service.name": config.service_name})
        self.provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
        if config.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint)))
        self._tracer = self.provider.get_tracer("kvgate")
        self._propagator = TraceContextTextMapPropagator()

    def shutdown(self) -> None:
        """Export what is left and stop the exporter."""
        self.provider.shutdown()

    def upstream(
        self, request: ProxyRequest, replica: ReplicaState, headers: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """Start an attempt's upstream span; ``headers`` with its ``traceparent`` (a new list)."""
        record = request.trace
        if record is None:
            root = self._root(request, _epoch_ns(request.started_s, _clock_offset_ns()))
            record = request.trace = RequestTrace(root)
        root = record.root
        if root.is_recording():
            span = self._tracer.start_span("upstream", trace.set_span_in_context(root), kind=SpanKind.CLIENT)
        else:
            span = root
        record.attempts.append((span, replica, time.monotonic()))
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, trace.set_span_in_context(span))
        sent = [h for h in headers if h[0] not in _CONTEXT_HEADERS]
        sent.extend((name.encode(), value.encode("latin-1")) for name, value in carrier.items())
        return sent

    def finish(self, request: ProxyRequest, now_s: float) -> None:
        """Build the request's other spans from its times and end them all (``now_s``: monotonic)."""
        offset_ns = _clock_offset_ns()

        def ns(monotonic_s: float) -> int:
            return _epoch_ns(monotonic_s, offset_ns)

        record = request.trace
        root = record.root if record is not None else self._root(request, ns(request.started_s))
        if not root.is_recording():
            return
        attempts = [] if record is None else record.attempts
        under_root = trace.set_span_in_context(root)
        arrived_s = request.arrived_s or request.started_s
        admitted_s = attempts[0][2] if attempts else now_s
        admit = self._tracer.start_span("admit", under_root, start_time=ns(arrived_s))
        if request.tenant is not None:
            admit.set_attribute("kvgate.tenant", request.tenant)
        if request.queue_wait_s is not None:
            queued = self._tracer.start_span(
                "queue", trace.set_span_in_context(admit), start_time=ns(arrived_s)
            )
            queued.end(ns(arrived_s + request.queue_wait_s))
        admit.end(ns(admitted_s))
        status, reason = outcome(request)
        for i, (span, replica, started_s) in enumerate(attempts):
            chosen: dict[str, AttributeValue] = {
                "kvgate.replica": replica.name,
                "kvgate.pool": replica.pool,
                "kvgate.attempt": i,
            }
            route = self._tracer.start_span("route", under_root, attributes=chosen, start_time=ns(started_s))
            route.end(ns(started_s))
            span.set_attributes(chosen)
            last = i == len(attempts) - 1
            if not last:
                span.set_status(Status(StatusCode.ERROR, "failed before the first byte; retried"))
            else:
                if request.response_started:
                    span.set_attribute("http.response.status_code", request.status)
                if request.error is not None:
                    span.set_status(Status(StatusCode.ERROR, reason))
            span.end(ns(now_s) if last else ns(attempts[i + 1][2]))
        root.set_attributes(_attributes(request, status, reason))
        if status >= 500:
            root.set_status(Status(StatusCode.ERROR, reason))
        root.end(ns(now_s))

    def _root(self, request: ProxyRequest, start_ns: int) -> Span:
        client: dict[str, str] = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in request.headers
            if name in _CONTEXT_HEADERS
        }
        parent: Context | None = self._propagator.extract(client) if client else None
        return self._tracer.start_span(
            f"POST {request.endpoint}", parent, kind=SpanKind.SERVER, start_time=start_ns
        )


def _clock_offset_ns() -> int:
    """Nanoseconds from the monotonic clock (the request's times) to the epoch (the spans')."""
    return time.time_ns() - time.monotonic_ns()


def _epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns


def _attributes(request: ProxyRequest, status: int, reason: str | None) -> dict[str, AttributeValue]:
    """The request span's attributes: HTTP and GenAI semantic conventions, then kvgate's own."""
    admission = request.admission
    values: dict[str, AttributeValue | None] = {
        "http.request.method": "POST",
        "url.path": request.endpoint,
        "http.response.status_code": status,
        "gen_ai.request.model": request.model or None,
        "gen_ai.request.max_tokens": None if admission is None else admission.cost.max_output_tokens,
        "gen_ai.usage.input_tokens": request.prompt_tokens,
        "gen_ai.usage.output_tokens": request.completion_tokens,
        "kvgate.request_id": request.request_id,
        "kvgate.x_request_id": request.x_request_id,
        "kvgate.tenant": request.tenant,
        "kvgate.replica": None if request.replica is None else request.replica.name,
        "kvgate.reason": reason,
        "kvgate.retries": retries(request),
    }
    return {key: value for key, value in values.items() if value is not None}
