"""Run the gateway under uvicorn (uvloop, httptools with the client-side limits of
``gateway.http_protocol``): in the foreground, or as an async context manager on a port-0 socket
for tests and for ``kvgate up``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn

from config.schema import GatewayConfig
from gateway.app import Gateway
from gateway.http_protocol import edge_protocol
from gateway.state import GatewayState


@dataclass(frozen=True, slots=True)
class RunningGateway:
    url: str
    gateway: Gateway
    server: uvicorn.Server
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
    """uvicorn with the gateway's client-side limits (``gateway.http_protocol``); raises the
    process's descriptor limit to fit them."""
    return uvicorn.Config(
        gateway,
        host=host,
        port=port,
        loop="uvloop",
        http=edge_protocol(gateway.config.server),
        ws="none",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(gateway.config.server.client_keepalive_s),
        proxy_headers=False,
    )


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
    """The gateway serving on ``config.server.host`` and ``port`` (0: a free one) until exit."""
    gateway = Gateway(config)
    sock = bind_socket(config.server.host, port)
    server = uvicorn.Server(uvicorn_config(gateway, config.server.host, port))
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
        server.should_exit = True
        await task
        sock.close()


def serve(config: GatewayConfig, log_level: str = "info") -> None:
    """Serve in the foreground until interrupted."""
    uvicorn.Server(uvicorn_config(Gateway(config), config.server.host, config.server.port, log_level)).run()
