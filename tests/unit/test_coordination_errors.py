"""Every Redis failure the coordinator meets is counted and logged under one bounded kind."""

from __future__ import annotations

import pytest
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvgate.gateway.coordination.failures import error_kind
from kvgate.gateway.telemetry.event_series import COORDINATION_ERROR_KINDS


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (AuthenticationError("invalid username-password pair"), "authentication"),
        (AuthenticationWrongNumberOfArgsError("wrong number of arguments for 'auth'"), "authentication"),
        (RedisTimeoutError("Timeout reading from socket"), "timeout"),
        (TimeoutError(), "timeout"),
        (RedisConnectionError("Error 111 connecting to 127.0.0.1:1"), "connection"),
        (BusyLoadingError("Redis is loading the dataset in memory"), "connection"),
        (ConnectionResetError(), "connection"),
        (ReadOnlyError("You can't write against a read only replica."), "response"),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), "response"),
        (ValueError("a bug"), "internal"),
    ],
)
def test_each_failure_has_one_kind_from_the_exported_set(exc: Exception, kind: str) -> None:
    assert error_kind(exc) == kind
    assert kind in COORDINATION_ERROR_KINDS
