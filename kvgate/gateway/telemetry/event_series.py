"""The series kvgate records event by event on ``/metrics``: each one's name, help, labels and
buckets, and the bounded sets its labels take.

Names follow Prometheus conventions: ``kvgate_<thing>_<unit>``, base units, ``_total`` counters.
Labels are ``pool`` and ``model``; ``replica`` (its name, never its URL) only on per-replica series;
``reason``, ``kind`` and ``outcome`` only from bounded sets (the decision cores' reasons, or the
tuples below), so no client can grow the label space. ``EventSeries`` creates the families in the
order ``/metrics`` writes them: the exposition is a contract (dashboards, alerts and the decision
replay's golden file read it), so a new series goes at the end. The gauges read off the gateway's
state at scrape time are in ``kvgate/gateway/telemetry/gauges.py``.
"""

from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry

from kvgate.gateway.edge.errors import GatewayError, ModelNotFound
from kvgate.gateway.replicas.replica_errors import ReplicaConnectError, ReplicaDisconnected, ReplicaHTTPError
from kvgate.gateway.telemetry.collectors import BucketHistogram, Counter

POOL_MODEL = ("pool", "model")
"""The labels of the per-pool, per-model series."""
TTFT_BUCKETS_S = (
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
ITL_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
QUEUE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
TOKENIZER_RATIO_BUCKETS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0)
FORECAST_ERROR_BUCKETS_S = (
    -30.0,
    -10.0,
    -5.0,
    -2.0,
    -1.0,
    -0.5,
    -0.25,
    -0.1,
    0.0,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
LOOP_LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
WAIT_BUDGET_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)

HISTOGRAMS = (
    "kvgate_time_to_first_token_seconds",
    "kvgate_inter_token_latency_seconds",
    "kvgate_queue_wait_seconds",
    "kvgate_request_duration_seconds",
    "kvgate_tokenizer_estimate_ratio",
    "kvgate_queue_wait_forecast_error_seconds",
    "kvgate_queue_wait_budget_ratio",
)
"""Every histogram, without its ``_bucket`` / ``_sum`` / ``_count`` suffixes."""
COUNTERS = (
    "kvgate_admission_decisions_total",
    "kvgate_prompt_tokens_total",
    "kvgate_output_tokens_total",
    "kvgate_responses_total",
    "kvgate_upstream_errors_total",
    "kvgate_retries_total",
    "kvgate_replica_ejections_total",
    "kvgate_reservations_expired_total",
)
"""Every counter exported whatever the configuration (``kvgate_coordination_errors_total`` is
exported only with coordination, see ``gateway/state_gauges.COORDINATION_SERIES``)."""
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "disconnected", "protocol", "status_5xx", "status_429", "other")
"""How an attempt on a replica failed: no connection, a connect/first-byte/idle timeout, the
connection closed mid-response, an answer that was not HTTP/1.1, a 5xx or 429 answer, anything else."""
RETRY_OUTCOMES = ("retry", "no_replica", "max_retries", "retry_budget")
"""What became of a request whose replica failed before the first byte: retried on another replica,
no other replica could take it, or refused by ``routing.max_retries`` or the retry budget."""
RELAYED = "replica"
"""The ``reason`` of an answer whose status the replica chose (a success or its own 4xx)."""
_REASON_OF_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    429: "upstream_saturated",
    500: "internal",
    502: "upstream_error",
    503: "upstream_unavailable",
    504: "upstream_timeout",
}
"""The reason of a gateway error that carries none: an admission error always does, so a reasonless
429 or 503 is a replica's own answer passed on."""
KV_EVENT_OUTCOMES = ("stored", "removed", "cleared", "unlinked", "gap", "undecodable")
"""What the replicas' KV cache events did to the cache index: blocks stored and removed, a cache
cleared, blocks left out (their parent unknown, or another block size), a message missed (the
replica's entry starts over), a message that was not a KV event batch."""
COORDINATION_ERROR_KINDS = ("connection", "authentication", "timeout", "response", "bad_value", "internal")
"""How a Redis coordination call failed (``kvgate/gateway/coordination/coordinator.py`` names each failure's
kind)."""


class EventSeries:
    """Every family recorded per event, registered on ``registry`` in exposition order."""

    __slots__ = (
        "coordination_errors",
        "decisions",
        "e2e",
        "ejections",
        "expired",
        "forecast_error",
        "itl",
        "kv_events",
        "loop_lag",
        "output_tokens",
        "prompt_tokens",
        "queue_wait",
        "responses",
        "retries",
        "tokenizer_ratio",
        "ttft",
        "upstream_errors",
        "wait_budget",
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        histogram = partial(BucketHistogram, registry=registry)
        counter = partial(Counter, registry=registry)
        self.ttft = histogram(
            "kvgate_time_to_first_token_seconds",
            "Seconds from the request reaching kvgate to its first output token reaching the client.",
            POOL_MODEL,
            TTFT_BUCKETS_S,
        )
        self.itl = histogram(
            "kvgate_inter_token_latency_seconds",
            "Seconds between consecutive output tokens of a streamed response.",
            POOL_MODEL,
            ITL_BUCKETS_S,
        )
        self.queue_wait = histogram(
            "kvgate_queue_wait_seconds",
            "Seconds a request waited in kvgate's admission queue before it was admitted or dropped.",
            POOL_MODEL,
            QUEUE_WAIT_BUCKETS_S,
        )
        self.e2e = histogram(
            "kvgate_request_duration_seconds",
            "Seconds from the request reaching kvgate to its last byte reaching the client.",
            POOL_MODEL,
            E2E_BUCKETS_S,
        )
        self.tokenizer_ratio = histogram(
            "kvgate_tokenizer_estimate_ratio",
            "kvgate's prompt token estimate divided by the replica's reported prompt tokens.",
            ["model"],
            TOKENIZER_RATIO_BUCKETS,
        )
        self.decisions = counter(
            "kvgate_admission_decisions",
            "Admission decisions by outcome (admit, queue, reject) and reason.",
            ["pool", "model", "decision", "reason"],
        )
        self.prompt_tokens = counter(
            "kvgate_prompt_tokens",
            "Prompt tokens of requests served (replica's count).",
            POOL_MODEL,
        )
        self.output_tokens = counter(
            "kvgate_output_tokens",
            "Output tokens streamed back to clients.",
            POOL_MODEL,
        )
        self.expired = counter(
            "kvgate_reservations_expired",
            "Reservations released because their lease ran out: their request never released them "
            "(a gateway bug, or a request stuck past its lease); any increase deserves an alert.",
            ["pool"],
        )
        self.coordination_errors = counter(
            "kvgate_coordination_errors",
            "Redis coordination failures by kind: connection, authentication, timeout, response (a "
            "Redis error reply), bad_value (an entry of another gateway skipped as unreadable), internal.",
            ["kind"],
        )
        self.responses = counter(
            "kvgate_responses",
            "Answers of the completion routes by HTTP code and reason: `replica` when the status is "
            "the replica's, else why the gateway answered so (an admission reason, invalid_request, "
            "unauthorized, model_not_found, payload_too_large, upstream_error, upstream_timeout, ...).",
            ["code", "reason", "model", "route", "tenant"],
        )
        self.upstream_errors = counter(
            "kvgate_upstream_errors",
            "Failed attempts on a replica by kind: " + ", ".join(UPSTREAM_ERROR_KINDS) + ".",
            ["pool", "replica", "kind"],
        )
        self.retries = counter(
            "kvgate_retries",
            "What became of requests whose replica failed before the first byte: retry (sent to "
            "another replica), no_replica, or refused by max_retries or the retry budget.",
            ["pool", "outcome"],
        )
        self.ejections = counter(
            "kvgate_replica_ejections",
            "Times a replica was ejected from routing by passive or active health checks.",
            ["pool", "replica"],
        )
        self.forecast_error = histogram(
            "kvgate_queue_wait_forecast_error_seconds",
            "A queued request's actual wait minus the wait admission predicted when it queued it "
            "(negative: it went sooner than predicted), observed when it leaves the queue.",
            POOL_MODEL,
            FORECAST_ERROR_BUCKETS_S,
        )
        self.loop_lag = histogram(
            "kvgate_event_loop_lag_seconds",
            "How late the gateway's event loop ran a timer due every 0.1 s: every socket read, write "
            "and decision of this process waited about as long. Growing: the process is CPU-bound or "
            "paused (a long garbage collection, a CPU limit throttling it).",
            [],
            LOOP_LAG_BUCKETS_S,
        )
        self.wait_budget = histogram(
            "kvgate_queue_wait_budget_ratio",
            "A queued request's wait over the wait it could afford (the queue limit, its client's "
            "timeout or its model's TTFT objective less its prefill); 1: refused at its deadline.",
            POOL_MODEL,
            WAIT_BUDGET_BUCKETS,
        )
        self.kv_events = counter(
            "kvgate_kv_events",
            "What the replicas' KV cache events did to routing's index of their caches, by outcome: "
            + ", ".join(KV_EVENT_OUTCOMES)
            + " (stored, removed and unlinked count blocks).",
            ["pool", "outcome"],
        )


def response_reason(error: GatewayError) -> str:
    """The ``reason`` label of an answer the gateway decided: the decision's, else its error class's."""
    if error.reason is not None:
        return error.reason
    if isinstance(error, ModelNotFound):
        return "model_not_found"
    return _REASON_OF_STATUS.get(error.status, "internal")


def upstream_error_kind(exc: BaseException) -> str:
    """One of ``UPSTREAM_ERROR_KINDS`` for a failed attempt: a replica client error, or the gateway
    error a replica's 5xx/429 answer became (``errors.upstream_status_error``)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ReplicaConnectError):
        return "connect"
    if isinstance(exc, ReplicaDisconnected):
        return "disconnected"
    if isinstance(exc, ReplicaHTTPError):
        return "protocol"
    if isinstance(exc, GatewayError) and exc.status >= 500:
        return "status_5xx"
    if isinstance(exc, GatewayError) and exc.status == 429:
        return "status_429"
    return "other"
