"""Which headers cross the gateway, each way, and the request id both sides see.

Hop-by-hop headers (RFC 9110 section 7.6.1, and any that a ``Connection`` header names) go neither
way. The client's ``X-Request-Id`` is echoed and forwarded when it is 1 to 128 visible ASCII
characters; otherwise the gateway's own id stands in. The client's ``Authorization`` and
``Cookie`` reach replicas (``upstream_headers``), and a replica's ``Set-Cookie`` reaches the client
(``NOT_RELAYED``), only under ``auth.forward_client_credentials``; the client's key still
identifies its tenant at pricing. The gateway's own ids (``new_request_id``: 128 random bits as 32
hex digits) are cut from 4 KiB of ``os.urandom`` drawn at a time, one system call per 256 ids; a
forked child draws its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

import orjson

REQUEST_ID_HEADER = b"x-request-id"
_CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
"""A client's ``X-Request-Id`` that is echoed and forwarded: 1 to 128 visible ASCII characters."""
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"content-length",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-connection",
    }
)
"""Headers of one connection, never passed on (RFC 9110 section 7.6.1); the length is the
gateway's to write on each side."""
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"proxy-authorization", b"expect", REQUEST_ID_HEADER}
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})
"""Connection options that name no header: nothing more to drop for them."""
NOT_RELAYED = _HOP_BY_HOP | {b"proxy-authenticate", b"date", b"server", REQUEST_ID_HEADER}
SET_COOKIE = b"set-cookie"
_CLIENT_CREDENTIALS = frozenset({b"authorization", b"cookie"})


def scan_headers(raw: list[tuple[bytes, bytes]]) -> tuple[str, int | None, list[tuple[bytes, bytes]]]:
    """The client's usable ``X-Request-Id`` ("" when absent or unusable), the declared body length,
    and the headers to forward."""
    x_request_id = ""
    content_length: int | None = None
    connection = None
    forward = []
    for name, value in raw:
        if name == REQUEST_ID_HEADER:
            x_request_id = client_request_id(value)
        elif name == b"content-length":
            content_length = int(value) if value.isdigit() else None
        elif name not in _NOT_FORWARDED:
            forward.append((name, value))
        elif name == b"connection":
            connection = value
    if connection is not None:
        named = {token.strip().lower() for token in connection.split(b",")} - _PLAIN_CONNECTION
        if named:
            # Headers the client's Connection names are hop-by-hop (RFC 9110 section 7.6.1).
            forward = [header for header in forward if header[0] not in named]
    return x_request_id, content_length, forward


def upstream_headers(
    forward: list[tuple[bytes, bytes]], x_request_id: str, forward_credentials: bool
) -> list[tuple[bytes, bytes]]:
    """What is sent to a replica: the client's forwardable headers, without its ``Authorization``
    and ``Cookie`` unless ``auth.forward_client_credentials``, plus the request id (a pool's
    ``api_key`` is added per attempt, by the relay)."""
    if not forward_credentials:
        forward = [header for header in forward if header[0] not in _CLIENT_CREDENTIALS]
    return [*forward, (REQUEST_ID_HEADER, x_request_id.encode())]


def client_request_id(value: bytes) -> str:
    """The client's id when it may be echoed, logged and forwarded as it is; "" otherwise."""
    return value.decode() if _CLIENT_REQUEST_ID.fullmatch(value) else ""


_ID_HEX_DIGITS = 32
_IDS_PER_DRAW = 256


class _RandomIds:
    __slots__ = ("_at", "_hex")

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def __call__(self) -> str:
        at = self._at
        if at == len(self._hex):
            self._hex = os.urandom(_IDS_PER_DRAW * _ID_HEX_DIGITS // 2).hex()
            at = 0
        self._at = at + _ID_HEX_DIGITS
        return self._hex[at : at + _ID_HEX_DIGITS]

    def forget(self) -> None:
        self._hex = ""
        self._at = 0


new_request_id = _RandomIds()
"""A new request id: 32 random hex digits."""
os.register_at_fork(after_in_child=new_request_id.forget)


def request_id_of(scope: MutableMapping[str, Any]) -> str:
    """The ``X-Request-Id`` to answer with: the client's when usable, or a new random one."""
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER:
            return client_request_id(value) or new_request_id()
    return new_request_id()


def relay_headers(
    raw: list[tuple[bytes, bytes]], request_id: str, not_relayed: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The replica's headers the client gets: without ``not_relayed`` ones and any the replica's
    ``Connection`` header names as hop-by-hop."""
    headers = []
    connection = None
    for name, value in raw:
        low = name.lower()
        if low not in not_relayed:
            headers.append((low, value))
        elif low == b"connection":
            connection = value
    if connection is not None:
        named = {token.strip().lower() for token in connection.split(b",")}
        headers = [header for header in headers if header[0] not in named]
    headers.append((REQUEST_ID_HEADER, request_id.encode()))
    return headers


def forwarded_body(body: Mapping[str, Any]) -> bytes:
    """``body`` serialised for a replica, in a block its own size. ``orjson.dumps`` returns bytes
    in a block of at least 4 KiB whatever their length, and a rewritten body is held for as long
    as its request lasts: a 150-byte chat request held 4 KiB through every minute of its stream,
    16 % of what an open stream costs the gateway (docs/streams.md)."""
    return bytes(memoryview(orjson.dumps(body)))
