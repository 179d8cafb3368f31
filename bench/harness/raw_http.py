"""The request side of the benchmarks' raw HTTP/1.1 backends (``bench_proxy``'s zero-delay replicas,
``paced_backend``): one keep-alive connection parsed by httptools, each request's URL and body
collected; a subclass answers in ``on_message_complete``. Raw asyncio keeps a backend's own CPU per
request and per token small beside the gateway it measures."""

from __future__ import annotations

import asyncio
from typing import cast

import httptools


class RequestProtocol(asyncio.Protocol):
    __slots__ = ("_body", "_parser", "_transport", "_url")

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._body = bytearray()
        self._url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_message_begin(self) -> None:
        self._body = bytearray()

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_body(self, body: bytes) -> None:
        self._body += body
