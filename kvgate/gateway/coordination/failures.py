"""What a Redis failure is, in one word, and a log that does not flood while Redis stays down."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("kvgate.coordination")


def error_kind(exc: BaseException) -> str:
    """The one place a Redis failure becomes a kind (``COORDINATION_ERROR_KINDS``)."""
    if isinstance(exc, AuthenticationError | AuthenticationWrongNumberOfArgsError):
        return "authentication"
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, RedisConnectionError | OSError):
        return "connection"
    if isinstance(exc, ResponseError):
        return "response"
    return "internal"


@dataclass
class Throttled:
    """Log lines per kind, at most one per ``interval_s``; the next says how many were held back."""

    interval_s: float
    _last_s: dict[str, float] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)

    def warn(self, kind: str, now_s: float, message: str, *, exc_info: bool = False) -> None:
        last_s = self._last_s.get(kind)
        if last_s is not None and now_s - last_s < self.interval_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._last_s[kind] = now_s
        held = self._held.pop(kind, 0)
        suffix = f" ({held} more since the last report)" if held else ""
        log.warning("coordination: %s%s", message, suffix, exc_info=exc_info)
