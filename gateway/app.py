"""The gateway as one ASGI application: a raw dispatcher in front of the proxy and the admin app.

The two completion routes go straight to ``Proxy.handle``; every other path goes to FastAPI. The
dispatcher also owns the lifespan: the shared upstream session, the first health probe round
(so readiness is known before the first request) and the background health and DNS tasks.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from config.schema import GatewayConfig
from gateway.admin import build_admin_app
from gateway.decide import Decider, RoundRobin
from gateway.discovery import DnsDiscovery
from gateway.errors import MethodNotAllowed
from gateway.health import HealthMonitor
from gateway.metrics import GatewayMetrics
from gateway.proxy import Message, Proxy, Receive, Scope, Send, request_id_of, send_error
from gateway.state import GatewayState
from gateway.upstream import create_session

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.state = GatewayState.from_config(config)
        self.decider: Decider = RoundRobin(self.state, retry_after_s=config.health.interval_s)
        self.metrics = GatewayMetrics()
        self.admin = build_admin_app(self.state, self.metrics.render)
        self._session: aiohttp.ClientSession | None = None
        self._proxy: Proxy | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "gateway not started"
        return self._session

    async def start(self) -> None:
        self._session = create_session(self.config.server)
        self._proxy = Proxy(self.state, self.decider, self._session, self.config.server)
        discoveries = [
            DnsDiscovery(self.state, p.name, p.dns) for p in self.config.pools if p.dns is not None
        ]
        for discovery in discoveries:
            await discovery.refresh()
        monitor = HealthMonitor(self.state, self._session, self.config.health)
        await monitor.probe_all()
        self._tasks = [asyncio.create_task(monitor.run(), name="kvgate-health")]
        self._tasks += [asyncio.create_task(d.run(), name="kvgate-dns") for d in discoveries]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in COMPLETION_PATHS:
            if scope["method"] != "POST":
                error = MethodNotAllowed(
                    f"method {scope['method']} is not allowed on {scope['path']}; use POST"
                )
                await send_error(send, error, request_id_of(scope))
                return
            assert self._proxy is not None, "gateway not started"
            await self._proxy.handle(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.admin(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
