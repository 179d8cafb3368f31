"""The proxied routes taken straight off the parser, without uvicorn's ASGI dispatch.

A ``POST`` to one of ``HOT_PATHS`` (every route of ``kvgate.gateway.request_path.surface.PROXIED``,
the URL exactly: no query, no escapes) goes to the route the application offers (``HotRoute``),
under uvicorn's own request cycle, with a scope of just what the route reads. Apart from
``http_protocol`` (the connection's limits and timers) because it is the one place that builds a
request's cycle and task itself; the protocol decides when, this module how.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from kvgate.gateway.asgi import ASGIApp
from kvgate.gateway.edge.request_edge import REQUEST_EDGE, RequestEdge
from kvgate.gateway.request_path.surface import PROXIED

if TYPE_CHECKING:
    from kvgate.gateway.edge.http_protocol import EdgeProtocol

HOT_PATHS = {path.encode(): path for path in PROXIED}
"""Raw request targets served by the hot route (every proxied route), and the path each is."""
HotRoute = Callable[[], ASGIApp | None]
"""What serves a hot path's ``POST`` now, or None when the application's own dispatch must (it is
starting, or refusing new requests in a drain)."""


def no_route() -> None:
    return None


def start_hot(protocol: EdgeProtocol, app: ASGIApp, path: str, http_version: str) -> None:
    """uvicorn's request cycle and task for a hot path's ``POST`` on ``protocol``, over a scope of
    what the route and the cycle (its log line of a request, when uvicorn's access log has a
    handler) read."""
    scope: dict[str, Any] = {
        "type": "http",
        "http_version": http_version,
        "method": "POST",
        "path": path,
        "raw_path": protocol.url,
        "query_string": b"",
        "client": protocol.client,
        "headers": protocol.headers,
    }
    cycle = protocol.cycle = RequestResponseCycle(
        scope=scope,  # type: ignore[arg-type]
        transport=protocol.transport,
        flow=protocol.flow,
        logger=protocol.logger,
        access_logger=protocol.access_logger,
        access_log=protocol.access_log,
        default_headers=protocol.server_state.default_headers,
        message_event=asyncio.Event(),
        expect_100_continue=protocol.expect_100_continue,
        keep_alive=http_version != "1.0" and protocol.parser.should_keep_alive(),
        on_response=protocol.on_response_complete,
    )
    protocol.scope = scope  # type: ignore[assignment]
    edge = RequestEdge(protocol, cycle)
    scope["extensions"] = {REQUEST_EDGE: {"edge": edge}}
    task = edge.task = protocol.loop.create_task(cycle.run_asgi(app))  # type: ignore[arg-type]
    task.add_done_callback(protocol.tasks.discard)
    protocol.tasks.add(task)
