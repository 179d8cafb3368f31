"""Every error the gateway itself answers with, rendered as an OpenAI-shaped body.

::

    GatewayError                      {"error": {"message", "type", "param", "code"[, "reason"]}}
    ├── BadRequest          400       malformed JSON, missing/invalid fields, prompt + max_tokens too long
    ├── Unauthorized        401       auth on and the bearer key is unknown
    ├── ModelNotFound       404       "The model `X` does not exist." (vLLM's wording)
    ├── NotFound            404       no such route
    ├── MethodNotAllowed    405
    ├── RequestTimeout      408       request headers or body not received in time (the edge)
    ├── PayloadTooLarge     413
    ├── HeadersTooLarge     431       request line and headers over the byte or count limit (the edge)
    ├── TooManyRequests     429       admission turned it away (with Retry-After and retry-after-ms)
    ├── InternalError       500       a bug in the gateway; never a traceback to the client
    ├── BadGateway          502       replica refused, reset or answered 5xx
    ├── ServiceUnavailable  503       no routable replica (with Retry-After)
    └── GatewayTimeout      504       connect, first byte or idle timeout upstream

A decision's ``Refusal`` (admission's value: status, reason, message, Retry-After) becomes one of
these in exactly one place, ``refusal_error``; ``Retry-After`` and ``retry-after-ms`` are rendered
only by ``RetryAfter.headers``.
Failures of the completion routes' replica client (``kvgate.gateway.replicas.replica_http``) are translated
into this tree in exactly one place, ``translate_upstream``. Replica 4xx answers are not errors here: they
pass through as the replica wrote them. A message about a replica names it by ``ReplicaState.name``, never by
URL (clients do not learn the fleet's addresses); the log line of the same failure carries both.
"""

from __future__ import annotations

import logging
import math

import orjson

from kvgate.admission.decision import Refusal
from kvgate.admission.retry_after import RetryAfter
from kvgate.admission.retry_after import retry_after as retry_after_hint
from kvgate.gateway.replicas.replica_errors import (
    ReplicaConnectError,
    ReplicaDisconnected,
    ReplicaHTTPError,
    ReplicaTimeout,
)

logger = logging.getLogger("kvgate.upstream")


class GatewayError(Exception):
    status = 500
    error_type = "InternalServerError"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: float | None = None,
        reason: str | None = None,
        retry_after: RetryAfter | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        """When to come back: an admission refusal's hint, or ``retry_after_s`` as it was given."""
        if retry_after is None and retry_after_s is not None:
            self.retry_after = retry_after_hint(retry_after_s, math.inf)  # as given, uncapped
        self.reason = reason
        """Why the gateway decided so (an admission reason such as ``kv_capacity``), when it did."""

    def body(self) -> bytes:
        error: dict[str, object] = {
            "message": self.message,
            "type": self.error_type,
            "param": self.param,
            "code": self.status,
        }
        if self.reason is not None:
            error["reason"] = self.reason
        return orjson.dumps({"error": error})

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            headers += [(name.encode(), value.encode()) for name, value in self.retry_after.headers().items()]
        return headers

    def event(self) -> bytes:
        """How a stream that already started ends on this error: it as an event, then ``[DONE]``."""
        return b"data: " + self.body() + b"\n\ndata: [DONE]\n\n"


class BadRequest(GatewayError):
    status = 400
    error_type = "BadRequestError"


class Unauthorized(GatewayError):
    status = 401
    error_type = "AuthenticationError"


class NotFound(GatewayError):
    status = 404
    error_type = "NotFoundError"


class ModelNotFound(NotFound):
    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", param="model")


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "MethodNotAllowedError"


class RequestTimeout(GatewayError):
    status = 408
    error_type = "RequestTimeoutError"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "PayloadTooLargeError"


class HeadersTooLarge(GatewayError):
    status = 431
    error_type = "RequestHeaderFieldsTooLargeError"


class TooManyRequests(GatewayError):
    status = 429
    error_type = "RateLimitError"


class InternalError(GatewayError):
    status = 500
    error_type = "InternalServerError"


class BadGateway(GatewayError):
    status = 502
    error_type = "BadGatewayError"


class ServiceUnavailable(GatewayError):
    status = 503
    error_type = "ServiceUnavailableError"


class GatewayTimeout(GatewayError):
    status = 504
    error_type = "GatewayTimeoutError"


def translate_upstream(exc: BaseException, replica_name: str, replica_url: str) -> GatewayError:
    """The one place where a failure talking to a replica becomes a gateway error. The client's
    message keeps only text the gateway wrote (an OS error names the address it failed on)."""
    if isinstance(exc, GatewayError):
        return exc
    logger.warning("replica %s (%s) failed: %s: %s", replica_name, replica_url, type(exc).__name__, exc)
    if isinstance(exc, ReplicaTimeout):
        return GatewayTimeout(f"replica {replica_name} timed out: {exc}")
    if isinstance(exc, TimeoutError):
        return GatewayTimeout(f"replica {replica_name} timed out")
    if isinstance(exc, ReplicaConnectError):
        return BadGateway(f"cannot connect to replica {replica_name}")
    if isinstance(exc, ReplicaDisconnected):
        return BadGateway(f"replica {replica_name} closed the connection mid-response")
    if isinstance(exc, ReplicaHTTPError):
        return BadGateway(f"replica {replica_name} failed: {exc}")
    if isinstance(exc, OSError):
        return BadGateway(f"replica {replica_name} failed")
    return InternalError("internal gateway error")


def upstream_status_error(
    status: int,
    replica_name: str,
    replica_url: str,
    body: bytes,
    retry_after_s: float | None = None,
    retry_after_cap_s: float = math.inf,
) -> GatewayError:
    """A replica's 429 or 5xx answer as a gateway error, keeping the replica's own message when it
    has one. A 429 is the replica's backpressure: it stays a 429, with the replica's Retry-After
    capped like the gateway's own (``retry_after_cap_s``)."""
    detail = ""
    try:
        parsed = orjson.loads(body)
        if isinstance(parsed, dict):
            error = parsed.get("error", parsed)
            detail = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    except orjson.JSONDecodeError:
        detail = body[:200].decode(errors="replace")
    suffix = f": {detail}" if detail else ""
    if status == 429:
        message = f"replica {replica_name} is saturated (429){suffix}"
        hint = None if retry_after_s is None else retry_after_hint(retry_after_s, retry_after_cap_s)
        return TooManyRequests(message, retry_after=hint)
    logger.warning("replica %s (%s) answered %d%s", replica_name, replica_url, status, suffix)
    if status == 503:
        return ServiceUnavailable(f"replica {replica_name} is unavailable (503){suffix}", retry_after_s=1.0)
    if status == 504:
        return GatewayTimeout(f"replica {replica_name} timed out (504){suffix}")
    return BadGateway(f"replica {replica_name} answered {status}{suffix}")


_REFUSALS: dict[int, type[GatewayError]] = {
    400: BadRequest,
    401: Unauthorized,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def refusal_error(refusal: Refusal) -> GatewayError:
    """The one place a decision's refusal becomes what the client receives: its status's error,
    its message and reason, and its Retry-After (``RetryAfter.headers``)."""
    error_class = _REFUSALS[refusal.status]
    return error_class(
        refusal.message, param=refusal.param, reason=refusal.reason.value, retry_after=refusal.retry_after
    )
