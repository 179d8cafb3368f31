"""The gateway as one ASGI application: a raw dispatcher in front of the proxy and the admin app.

The proxied routes (``kvgate.gateway.request_path.surface.PROXIED``: the completion routes,
responses, embeddings, pooling, score, rerank, tokenize) go straight to ``Proxy.handle`` and
``GET /signals`` to the metrics' JSON document; every other path goes to FastAPI. The observability
routes pass the ``ObservabilityGuard`` first when ``auth.protect_observability`` (unset:
``auth.enabled``) says so. The dispatcher also owns the lifespan: the completion routes'
replica client, the aiohttp session of every other upstream call, the first
health probe and ``/metrics`` scrape round (so readiness is known before the first request) and
the background tasks: health probes, vLLM metrics scraping, DNS,
the admission pump, Redis coordination and the autoscaling recommender when configured.
It says whether it can serve (``/readyz``: started, pump alive, not draining, coordination per its
fail mode) and, in a drain (``kvgate.gateway.edge.server``), answers new completions with a 503 and closes
every connection after its response.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp
import orjson

from kvgate.admission.claims import ReplicaDemand
from kvgate.admission.coordination_gate import FailMode
from kvgate.admission.decision import RefusalReason
from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.asgi import Message, Receive, Scope, Send
from kvgate.gateway.coordination.coordinator import RedisCoordinator, fleet_demands
from kvgate.gateway.edge.admin import OBSERVABILITY_PATHS, ObservabilityGuard, build_admin_app
from kvgate.gateway.edge.errors import GatewayError, MethodNotAllowed
from kvgate.gateway.replicas.discovery import discoveries_for
from kvgate.gateway.replicas.kv_event_streams import KvEventStreams
from kvgate.gateway.replicas.probes import HealthMonitor
from kvgate.gateway.replicas.replica_http import ReplicaClient
from kvgate.gateway.replicas.scrape import Scraper
from kvgate.gateway.replicas.upstream import create_session
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.forwarding import request_id_of
from kvgate.gateway.request_path.proxy import Proxy, send_error, shutting_down
from kvgate.gateway.request_path.surface import PROXIED
from kvgate.gateway.state import GatewayState
from kvgate.gateway.telemetry.access_log import AccessLog
from kvgate.gateway.telemetry.fleet_work import FleetWork
from kvgate.gateway.telemetry.loop_lag import watch_loop_lag
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.gateway.telemetry.objectives import configured_objectives
from kvgate.gateway.telemetry.recommender import GatewayRecommender
from kvgate.vocabulary.clock import Clock

if TYPE_CHECKING:
    from kvgate.gateway.telemetry.tracing import Tracing

COMPLETION_PATHS = PROXIED
"""The proxied routes (completions, responses, embeddings, pooling, score, rerank, tokenize)."""
SIGNALS_PATH = "/signals"


class Gateway:
    def __init__(self, config: GatewayConfig, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.state = GatewayState.from_config(config)
        autoscaler = config.autoscaler
        window_s = 60.0 if autoscaler is None else autoscaler.signals_window_s
        self._clock = clock
        tenant_label = config.metrics.tenant_label
        self.metrics = GatewayMetrics(clock=clock, window_s=window_s, tenant_label=tenant_label)
        self.path = DecisionPath.build(self.state, config, self.metrics, clock)
        """The decision path's parts (pricing, fleet, dispatcher, accounting), over ``clock``."""
        routing = config.routing
        work = FleetWork(
            self.state, self.path.dispatcher, self.path.fleet, routing.scrape_stale_s, routing.warmup_s, clock
        )
        self.metrics.bind(work)
        objectives = configured_objectives(config)
        self.metrics.bind_objectives(objectives)
        self.path.accounting.objectives = objectives
        cache = self.path.dispatcher.router.cache
        self.metrics.bind_prefix_cache_sources(
            lambda: [
                (r.pool, "events" if cache.follows(r.replica_id) else "routed")
                for r in self.state.replicas.values()
            ]
        )
        auth = config.auth
        protect = auth.protect_observability
        self._guard: ObservabilityGuard | None = None
        if protect or (protect is None and auth.enabled):
            tokens = [t.get_secret_value() for t in (auth.admin_token, auth.observability_token) if t]
            self._guard = ObservabilityGuard(tokens)
        self.coordinator: RedisCoordinator | None = None
        coordination = config.coordination
        if coordination is not None:
            self.coordinator = RedisCoordinator(
                coordination.redis_url.get_secret_value(),
                self._demands,
                interval_s=coordination.interval_s,
                lease_s=coordination.lease_s,
                namespace=coordination.namespace,
                fail_mode=FailMode(coordination.fail_mode),
                metrics=self.metrics,
                clock=clock,
                promises=self.path.dispatcher.controller.promises,
                tenants=self.path.dispatcher.controller.tenants,
            )
            self.metrics.bind_coordination(self.coordinator.status)
            if self.coordinator.gate.may_refuse:
                self.path.dispatcher.coordination_refusal = self.coordinator.refusal
            self.path.dispatcher.on_unmet = self.coordinator.top_up
            self.path.dispatcher.top_up = self.coordinator.top_up_now
        self.admin = build_admin_app(
            self.state,
            self.metrics.render,
            admin_token=None if auth.admin_token is None else auth.admin_token.get_secret_value(),
            unready_reason=self._unready_reason,
            client_allowed=lambda key: self.path.dispatcher.controller.tenants.identify(key) is not None,
        )
        self._session: aiohttp.ClientSession | None = None
        self._client: ReplicaClient | None = None
        self._proxy: Proxy | None = None
        self._access_log: AccessLog | None = None
        self.tracing: Tracing | None = None
        if config.tracing.enabled:
            from kvgate.gateway.telemetry.tracing import Tracing

            self.tracing = Tracing(config.tracing)
        self._tasks: list[asyncio.Task[None]] = []
        self._tick_task: asyncio.Task[None] | None = None
        self.draining = False
        """Set on SIGTERM (``kvgate.gateway.edge.server``): readiness fails from then on."""
        self._refusing = False

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "gateway not started"
        return self._session

    def _demands(self) -> dict[str, ReplicaDemand]:
        return fleet_demands(self.state, self.path.dispatcher.controller, self._clock())

    def _unready_reason(self) -> str | None:
        """Why this gateway cannot serve, or None. The fleet's health is not a reason: with every
        replica down the gateway still answers (a 503 with Retry-After), which a client can act
        on, while a Service with no ready gateway gives it connection errors (``/fleetz`` is the
        fleet's endpoint)."""
        if self._proxy is None:
            return "starting"
        if self.draining:
            return "draining"
        if self._tick_task is None or self._tick_task.done():
            return "admission_pump_stopped"
        if self.coordinator is not None and self.coordinator.status().refusing:
            return RefusalReason.COORDINATION_UNAVAILABLE.value
        return None

    def refuse_new(self) -> None:
        """The drain's second phase: new completion requests get a 503 with Retry-After, and every
        response from now on closes its connection."""
        self.draining = True
        self._refusing = True

    def end_requests(self) -> None:
        """The drain time is up: requests cancelled from now on end cleanly for their clients."""
        if self._proxy is not None:
            self._proxy.stopping = True

    async def start(self) -> None:
        self._session = create_session(self.config.server)
        self.path.pricer.session = self._session
        server = self.config.server
        self._client = ReplicaClient(
            connect_s=server.timeouts.connect_s,
            first_byte_s=server.timeouts.first_byte_s,
            idle_s=server.timeouts.idle_s,
            keepalive_s=server.keepalive_s,
            limit=server.upstream_connections,
        )
        access_log = self._access_log = (
            AccessLog(self.config.access_log, self.path.fleet.pool_of)
            if self.config.access_log.enabled
            else None
        )
        cap_s = self.config.admission.retry_after_cap_s
        self._proxy = Proxy(
            self.state, self.path, self._client, server, self.config.auth, cap_s, access_log, self.tracing
        )
        discoveries = discoveries_for(self.state, self.config.pools, self._session)
        for discovery in discoveries:
            await discovery.refresh()
        monitor = HealthMonitor(self.state, self._session, self.config.health, self.path.fleet)
        scraper = Scraper(self.state, self._session, self.config.health.interval_s, clock=self._clock)
        await asyncio.gather(monitor.probe_all(), scraper.scrape_all())
        self._tick_task = asyncio.create_task(self.path.dispatcher.run(), name="kvgate-admission-pump")
        self._tasks = [
            asyncio.create_task(monitor.run(), name="kvgate-health"),
            asyncio.create_task(scraper.run(), name="kvgate-scrape"),
            self._tick_task,
        ]
        self._tasks += [asyncio.create_task(d.run(), name="kvgate-dns") for d in discoveries]
        lag = watch_loop_lag(self.metrics.observe_loop_lag)
        self._tasks.append(asyncio.create_task(lag, name="kvgate-loop-lag"))
        streams = KvEventStreams(
            self.state,
            self.path.dispatcher.router.cache,
            self.config.pools,
            self._session,
            self.metrics,
            self.config.health.interval_s,
        )
        if streams.enabled:
            await streams.reconcile()
            self._tasks.append(asyncio.create_task(streams.run(), name="kvgate-kv-events"))
        if self.config.autoscaler is not None:
            recommender = GatewayRecommender(self.metrics, self.config.autoscaler, self._clock)
            self._tasks.append(asyncio.create_task(recommender.run(), name="kvgate-autoscaler"))
        if self.coordinator is not None:
            await self.coordinator.start()
            self.path.fleet.foreign_loads = self.coordinator.foreign_loads
            self.path.fleet.others_used = self.coordinator.others_used

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.path.dispatcher.cancel_all()
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.tracing is not None:
            self.tracing.shutdown()
        if self._access_log is not None:
            self._access_log.flush()

    def hot_route(self) -> Callable[[Scope, Receive, Send], Awaitable[None]] | None:
        """What serves a completion ``POST`` the edge takes straight off the parser
        (``kvgate.gateway.edge.hot_route.HOT_PATHS``): the proxy once started, and nothing while new
        requests are refused, so that this application's dispatch answers them."""
        if self._refusing:
            return None
        return None if self._proxy is None else self._proxy.handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._refusing and scope["type"] == "http":
            send = _closing(send)
            if scope["path"] in COMPLETION_PATHS:
                await send_error(send, shutting_down(), request_id_of(scope))
                return
        if scope["type"] == "http" and scope["path"] in COMPLETION_PATHS:
            if scope["method"] != "POST":
                error = MethodNotAllowed(
                    f"method {scope['method']} is not allowed on {scope['path']}; use POST"
                )
                self.metrics.count_error(error, route=scope["path"])
                await send_error(send, error, request_id_of(scope))
                return
            assert self._proxy is not None, "gateway not started"
            await self._proxy.handle(scope, receive, send)
        elif scope["type"] == "http" and (refusal := self._observability_refusal(scope)) is not None:
            await send_error(send, refusal, request_id_of(scope))
        elif scope["type"] == "http" and scope["path"] == SIGNALS_PATH and scope["method"] == "GET":
            body = orjson.dumps(self.metrics.signals_doc())
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.admin(scope, receive, send)

    def _observability_refusal(self, scope: Scope) -> GatewayError | None:
        if self._guard is None or scope["path"] not in OBSERVABILITY_PATHS:
            return None
        client = scope.get("client")
        return self._guard.refusal(scope["headers"], client[0] if client else "")

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


def _closing(send: Send) -> Send:
    """``send`` with ``connection: close`` on the response: no request follows on a draining
    connection."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (b"connection", b"close")]
        await send(message)

    return closing_send
