"""Admin and control routes, on FastAPI: models, liveness, readiness, fleet health, Prometheus
metrics, and ``/admin/*`` (pools and their replicas: list them, set a pool's replica set).

Nothing here is on the request hot path; FastAPI is used for its routing and OpenAPI document.
Every error it raises is rendered in the same OpenAI shape as the proxy's. ``/admin/*`` changes
what the gateway routes to, so it is authenticated: with an admin token, every call must carry
``Authorization: Bearer <token>`` (401 otherwise); without one, only loopback clients are let in
(403 otherwise), which keeps ``kvgate up`` usable on a laptop and a token-less deployment closed.
Setting a pool's replicas follows ``GatewayState.set_pool_urls``: a new replica is cold (not
routable until its health check passes) and a dropped one takes no new requests while the ones it
is serving finish; each URL is checked and stored in the normal form of ``kvgate.config.urls``.
The observability routes (``OBSERVABILITY_PATHS``) are guarded, when ``auth.protect_observability``
says so, by ``ObservabilityGuard`` in the gateway's dispatcher: the same rule as ``/admin/*``,
with ``auth.observability_token`` accepted besides the admin token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from kvgate.admission.tenants import bearer_key
from kvgate.config.models import Model
from kvgate.config.pools import Pool
from kvgate.config.urls import replica_base_url
from kvgate.gateway.edge.errors import (
    BadRequest,
    GatewayError,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    Unauthorized,
)
from kvgate.gateway.replicas.scrape import scraped_capacity_tokens
from kvgate.gateway.request_path.surface import SERVED
from kvgate.gateway.state import GatewayState, ReplicaState
from kvgate.vocabulary.clock import Clock

MetricsRenderer = Callable[[], bytes]
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OBSERVABILITY_PATHS = frozenset(
    {"/metrics", "/signals", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
logger = logging.getLogger("kvgate.admin")


class AdminUnauthorized(Unauthorized):
    def headers(self) -> list[tuple[bytes, bytes]]:
        return [*super().headers(), (b"www-authenticate", b"Bearer")]


class AdminForbidden(GatewayError):
    status = 403
    error_type = "PermissionDeniedError"


class AdminConflict(GatewayError):
    status = 409
    error_type = "ConflictError"


def _always_ready() -> str | None:
    return None


def build_admin_app(
    state: GatewayState,
    render_metrics: MetricsRenderer,
    admin_token: str | None = None,
    clock: Clock = time.monotonic,
    unready_reason: Callable[[], str | None] = _always_ready,
    client_allowed: Callable[[str | None], bool] = lambda _: True,
) -> FastAPI:
    """``clock`` must be the one scrapes are stamped with (it measures their age).
    ``client_allowed`` says whether a client's API key (None: none sent) may list the models, as it
    may send completions: with auth on, only a known tenant's key.
    ``unready_reason`` names why this gateway cannot serve (``draining``,
    ``coordination_unavailable``, ...), or None; it is ``/readyz``. The fleet's state is
    ``/fleetz``: 200 while every model has a routable replica, else 503."""
    app = FastAPI(title="kvgate", description="OpenAI-compatible gateway for vLLM fleets", version="0.1.0")
    created_s = int(time.time())
    if admin_token is None:
        logger.warning("no admin token (auth.admin_token): /admin/* accepts loopback clients only")

    public = {name: model for name, model in state.models.items()}
    public.update({alias: model for model in state.models.values() for alias in model.aliases})
    """Every name a client may send: the served names and their aliases (``models[].aliases``)."""

    def model_doc(name: str, model: Model) -> dict[str, object]:
        return {
            "id": name,
            "object": "model",
            "created": created_s,
            "owned_by": "kvgate",
            "root": model.name,
            "max_model_len": model.max_model_len,
        }

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, object]:
        if not client_allowed(bearer_key(request.headers.get("authorization"))):
            raise Unauthorized("Incorrect API key provided.", reason="unauthorized")
        return {"object": "list", "data": [model_doc(name, model) for name, model in public.items()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, object]:
        if not client_allowed(bearer_key(request.headers.get("authorization"))):
            raise Unauthorized("Incorrect API key provided.", reason="unauthorized")
        model = public.get(model_id)
        if model is None:
            raise ModelNotFound(model_id)
        return model_doc(model_id, model)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        reason = unready_reason()
        doc: dict[str, object] = {"ready": reason is None}
        if reason is not None:
            doc["reason"] = reason
        return _json_status(doc, reason is None)

    @app.get("/fleetz")
    async def fleetz() -> Response:
        models = {model: {"routable_replicas": len(state.healthy_replicas(model))} for model in state.models}
        ready = all(m["routable_replicas"] > 0 for m in models.values())
        return _json_status({"ready": ready, "models": models}, ready)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def authorize(request: Request) -> None:
        if admin_token is None:
            host = request.client.host if request.client is not None else ""
            if not _is_loopback(host):
                raise AdminForbidden(
                    "admin routes accept loopback clients only while no admin token is configured "
                    "(auth.admin_token)"
                )
            return
        if not _bearer_matches(request.headers.get("authorization", ""), [admin_token]):
            raise AdminUnauthorized("admin routes need the header `Authorization: Bearer <admin token>`")

    admin = APIRouter(prefix="/admin", dependencies=[Depends(authorize)])

    def pool_doc(pool: Pool) -> dict[str, Any]:
        now_s = clock()
        replicas = sorted(
            (r for r in state.replicas.values() if r.pool == pool.name), key=lambda r: r.replica_id
        )
        return {
            "name": pool.name,
            "role": pool.role,
            "models": sorted(state.pool_models(pool)),
            "discovery": "static" if pool.dns is None else f"dns:{pool.dns.name}:{pool.dns.port}",
            "kv_capacity_tokens": pool.kv_capacity_tokens,
            "max_sequences": pool.max_sequences,
            "replicas": [replica_doc(r, now_s) for r in replicas],
        }

    @admin.get("/pools")
    async def list_pools() -> dict[str, object]:
        return {"object": "list", "data": [pool_doc(pool) for pool in state.pools.values()]}

    @admin.get("/pools/{pool_name}")
    async def get_pool(pool_name: str) -> dict[str, object]:
        return pool_doc(_known_pool(state, pool_name))

    @admin.put("/pools/{pool_name}/replicas")
    async def set_replicas(pool_name: str, request: Request) -> dict[str, object]:
        pool = _known_pool(state, pool_name)
        if pool.dns is not None:
            raise AdminConflict(
                f"pool `{pool_name}` discovers its replicas from DNS name {pool.dns.name}; "
                "its replica set cannot be set by hand",
                param="pool",
            )
        urls = _replica_urls(await request.body())
        state.set_pool_urls(pool_name, urls)
        logger.info("pool %s replicas set to %s", pool_name, ", ".join(urls) or "none")
        return pool_doc(pool)

    app.include_router(admin)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> Response:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        error: GatewayError
        if exc.status_code == 404:
            served = ", ".join(SERVED)
            error = NotFound(f"no route for {request.method} {request.url.path}; this server serves {served}")
        elif exc.status_code == 405:
            error = MethodNotAllowed(f"method {request.method} is not allowed on {request.url.path}")
        else:
            error = GatewayError(str(exc.detail))
            error.status = exc.status_code
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(BadRequest(str(exc.errors())))

    return app


def _json_status(doc: dict[str, object], ok: bool) -> Response:
    return Response(orjson.dumps(doc), status_code=200 if ok else 503, media_type="application/json")


def error_response(error: GatewayError) -> Response:
    headers = {name.decode(): value.decode() for name, value in error.headers()}
    return Response(error.body(), status_code=error.status, headers=headers)


def replica_doc(replica: ReplicaState, now_s: float) -> dict[str, Any]:
    scraped = replica.scraped
    return {
        "id": replica.replica_id,
        "name": replica.name,
        "url": replica.url,
        "healthy": replica.healthy,
        "in_flight": replica.in_flight,
        "kv_capacity_tokens": replica.kv_capacity_tokens,
        "configured_kv_capacity_tokens": replica.configured_kv_capacity_tokens,
        "discovered_kv_capacity_tokens": replica.discovered_kv_capacity_tokens,
        "kv_capacity_disagrees": replica.capacity_disagrees,
        "scraped": None
        if scraped is None
        else {
            "age_s": round(now_s - scraped.scraped_at_s, 3),
            "kv_cache_usage_ratio": scraped.kv_cache_usage_ratio,
            "num_requests_running": scraped.num_requests_running,
            "num_requests_waiting": scraped.num_requests_waiting,
            "num_gpu_blocks": scraped.num_gpu_blocks,
            "block_size_tokens": scraped.block_size_tokens,
            "capacity_tokens": scraped_capacity_tokens(scraped),
        },
    }


def _known_pool(state: GatewayState, pool_name: str) -> Pool:
    pool = state.pools.get(pool_name)
    if pool is None:
        raise NotFound(f"pool `{pool_name}` does not exist", param="pool")
    return pool


def _replica_urls(raw: bytes) -> list[str]:
    """The ``urls`` of a ``{"urls": [...]}`` body in normal form (``kvgate.config.urls``); every
    problem at once."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from exc
    urls = body.get("urls") if isinstance(body, dict) else None
    if not isinstance(urls, list):
        raise BadRequest('the body must be {"urls": ["http://host:port", ...]}', param="urls")
    normal, problems = [], []
    for url in urls:
        try:
            normal.append(replica_base_url(url))
        except ValueError as exc:
            problems.append(f"{url!r}: {exc}")
    if problems:
        raise BadRequest("bad replica URLs: " + "; ".join(problems), param="urls")
    return normal


class ObservabilityGuard:
    """Who may read ``OBSERVABILITY_PATHS``: the bearer of one of ``tokens``; with no token at all,
    loopback clients only (as ``/admin/*``)."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = list(tokens)

    def refusal(self, headers: Iterable[tuple[bytes, bytes]], client_host: str) -> GatewayError | None:
        """None when the request may go on; otherwise the error to answer with."""
        if not self._tokens:
            if _is_loopback(client_host):
                return None
            return AdminForbidden(
                "observability routes accept loopback clients only while no admin or observability "
                "token is configured (auth.admin_token, auth.observability_token)"
            )
        authorization = next((v.decode("latin-1") for n, v in headers if n == b"authorization"), "")
        if _bearer_matches(authorization, self._tokens):
            return None
        return AdminUnauthorized(
            "observability routes need the header `Authorization: Bearer <admin or observability token>`"
        )


def _bearer_matches(authorization: str, tokens: Iterable[str]) -> bool:
    """Whether ``authorization`` is ``Bearer <one of tokens>`` (compared in constant time)."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = token.strip().encode()
    return any(hmac.compare_digest(given, expected.encode()) for expected in tokens)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
