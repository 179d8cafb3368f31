"""Run the gateway under uvicorn (uvloop, httptools with the client-side limits of
``kvgate.gateway.edge.http_protocol``): in the foreground, or as an async context manager on a port-0 socket
for tests and for ``kvgate up``.

Stopping is a drain (``DrainingServer``), in three phases:

1. **Delay.** On SIGTERM ``/readyz`` answers 503 (``draining``) at once, and for
   ``server.drain_delay_s`` everything else goes on as before: endpoints and load balancers take
   a while to stop sending, and a request that still comes is served. SIGINT skips this phase.
2. **Drain.** New completion requests get a 503 with Retry-After (reason ``draining``) and every
   response closes its connection; idle connections are closed now, busy ones after their
   response. The listener stays open, so a late client gets that 503 rather than a refused
   connection, and ``/metrics`` can be read to the end. Requests in flight, streams and queued
   requests (which may still be admitted) have ``server.drain_timeout_s`` to finish.
3. **End.** What remains is cancelled and ends cleanly: a stream with an error event and
   ``[DONE]``, any other request with a 503; every reservation is released on the way out, as
   for a client that leaves. Then uvicorn's own shutdown and the lifespan's, and the process
   exits 0 (the signal is not raised again).

A second SIGINT stops at once, as in uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import FrameType

import uvicorn

from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.edge.app import Gateway
from kvgate.gateway.edge.http_protocol import EdgeProtocol, edge_protocol
from kvgate.gateway.state import GatewayState

logger = logging.getLogger("kvgate.server")

TICK_S = 0.1
"""How often a drain looks at what is left (uvicorn's own main loop ticks as often)."""
END_GRACE_S = 5.0
"""Seconds the requests cancelled at the end of a drain have to send their last bytes."""


@dataclass(frozen=True, slots=True)
class RunningGateway:
    url: str
    gateway: Gateway
    server: DrainingServer
    serving: asyncio.Task[None]
    """Done when the server stops (on exit of the context, or on SIGINT/SIGTERM)."""

    @property
    def state(self) -> GatewayState:
        return self.gateway.state

    @property
    def client_connections(self) -> int:
        """Client connections open now, those being refused or closed included."""
        return len(self.server.server_state.connections)


def uvicorn_config(gateway: Gateway, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn with the gateway's client-side limits (``kvgate.gateway.edge.http_protocol``); raises the
    process's descriptor limit to fit them. Its graceful-shutdown timeout covers only what is
    left after a drain (connections closing, lingering refusals)."""
    return uvicorn.Config(
        gateway,
        host=host,
        port=port,
        loop="uvloop",
        http=edge_protocol(gateway.config.server, gateway.hot_route),
        ws="none",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=int(END_GRACE_S),
        timeout_keep_alive=int(gateway.config.server.client_keepalive_s),
        proxy_headers=False,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopping by a drain (see the module's docstring).

    ``freeze_heap``: once started, the process's heap so far (the config, the tokenizer, the web and
    metrics libraries: some 100,000 objects the collector tracks, none of which ever becomes
    garbage) is moved out of the garbage collector's sight (``gc.freeze``). A full collection walks
    every tracked object; under load one ran about once a second and held the event loop some
    27 ms walking start-up objects alone. Only for a process that is the gateway and nothing else
    (``serve``): frozen objects are never collected, which a test process starting many gateways
    must not do."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway, freeze_heap: bool = False) -> None:
        super().__init__(config)
        self.gateway = gateway
        self._freeze_heap = freeze_heap
        self._delay_s = 0.0
        self._timeout_s = gateway.config.server.drain_timeout_s

    def drain(self, delay_s: float, timeout_s: float) -> None:
        """Begin to stop: readiness fails now, new requests are refused after ``delay_s`` and
        what is in flight then has ``timeout_s`` to finish. A drain already begun goes on as it is."""
        if self.should_exit:
            return
        self.gateway.draining = True
        self._delay_s = delay_s
        self._timeout_s = timeout_s
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM drains after ``server.drain_delay_s``; SIGINT (a person at a terminal, no
        endpoints to wait for) without it; a second SIGINT stops at once. Unlike uvicorn's, the
        signal is not kept to be raised again: after a drain the process exits 0."""
        if self.should_exit:
            if sig == signal.SIGINT:
                self.force_exit = True
            return
        server = self.gateway.config.server
        self.drain(server.drain_delay_s if sig == signal.SIGTERM else 0.0, server.drain_timeout_s)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self._freeze_heap and self.started:
            gc.collect()
            gc.freeze()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.gateway.draining = True
        loop = asyncio.get_running_loop()
        if self._delay_s > 0:
            logger.info("draining: readiness fails now, new requests are refused in %g s", self._delay_s)
            await self._wait_until(loop.time() + self._delay_s, lambda: False)
        self.gateway.refuse_new()
        protocol = self.config.http_protocol_class
        if isinstance(protocol, type) and issubclass(protocol, EdgeProtocol):
            protocol.drain(list(self.server_state.connections))
        tasks = self.server_state.tasks
        if tasks:
            logger.info("draining: %d request(s) in flight, waiting up to %g s", len(tasks), self._timeout_s)
        if not await self._wait_until(loop.time() + self._timeout_s, lambda: not tasks):
            logger.warning("drain timeout: ending %d request(s) still in flight", len(tasks))
            self.gateway.end_requests()
            for task in list(tasks):
                task.cancel()
            await self._wait_until(loop.time() + END_GRACE_S, lambda: not tasks)
        await super().shutdown(sockets)

    async def _wait_until(self, deadline_s: float, done: Callable[[], bool]) -> bool:
        """Tick (uvicorn's ``on_tick`` keeps the Date header current) until ``done()``, the
        deadline on the loop's clock, or a forced exit; returns ``done()``."""
        loop = asyncio.get_running_loop()
        counter = 0
        while not done() and not self.force_exit and loop.time() < deadline_s:
            await asyncio.sleep(TICK_S)
            counter += 1
            await self.on_tick(counter)
        return done()


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def running_gateway(config: GatewayConfig, port: int = 0) -> AsyncIterator[RunningGateway]:
    """The gateway serving on ``config.server.host`` and ``port`` (0: a free one) until exit,
    which ends whatever is still in flight at once (``server.handle_exit`` drains as a signal
    would)."""
    gateway = Gateway(config)
    sock = bind_socket(config.server.host, port)
    server = DrainingServer(uvicorn_config(gateway, config.server.host, port), gateway)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("gateway exited during start-up")
            await asyncio.sleep(0.01)
        host, bound_port = sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        yield RunningGateway(url=f"http://{host}:{bound_port}", gateway=gateway, server=server, serving=task)
    finally:
        server.drain(0.0, 0.0)
        await task
        sock.close()


def serve(config: GatewayConfig, log_level: str = "info") -> None:
    """Serve in the foreground until interrupted; SIGTERM and SIGINT drain."""
    gateway = Gateway(config)
    server_config = uvicorn_config(gateway, config.server.host, config.server.port, log_level)
    DrainingServer(server_config, gateway, freeze_heap=True).run()
