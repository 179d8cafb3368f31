"""Admin and control routes, on FastAPI: models, liveness, readiness, Prometheus metrics.

Nothing here is on the request hot path; FastAPI is used for its routing and OpenAPI document.
Every error it raises is rendered in the same OpenAI shape as the proxy's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from gateway.errors import BadRequest, GatewayError, MethodNotAllowed, NotFound
from gateway.state import GatewayState

MetricsRenderer = Callable[[], bytes]
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_admin_app(state: GatewayState, render_metrics: MetricsRenderer) -> FastAPI:
    app = FastAPI(title="kvgate", description="OpenAI-compatible gateway for vLLM fleets", version="0.1.0")
    created_s = int(time.time())

    @app.get("/v1/models")
    async def list_models() -> dict[str, object]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model.name,
                    "object": "model",
                    "created": created_s,
                    "owned_by": "kvgate",
                    "root": model.name,
                    "max_model_len": model.max_model_len,
                }
                for model in state.models.values()
            ],
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        routable = sum(1 for r in state.replicas.values() if r.healthy)
        body = f'{{"ready": {str(routable > 0).lower()}, "routable_replicas": {routable}}}'
        return Response(body, status_code=200 if routable else 503, media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        error: GatewayError
        if exc.status_code == 404:
            error = NotFound(f"no route for {request.method} {request.url.path}")
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


def error_response(error: GatewayError) -> Response:
    headers = {name.decode(): value.decode() for name, value in error.headers()}
    return Response(error.body(), status_code=error.status, headers=headers)
