"""The OpenAI and vLLM routes the gateway serves, by path, and what each asks a replica to run.

Every route here is a ``POST`` with a JSON body naming its ``model``: the proxy parses, prices,
admits, routes and relays it as it does a completion (same auth, limits, metrics, access log),
pricing it by its ``Work`` (``kvgate.admission.route_work``). The table is a dict, looked up once
per request. ``SERVED`` lists every route a client may call, for the 404 of any other.
"""

from __future__ import annotations

from kvgate.admission.route_work import POOLING_ROUTES, Work

CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"

PROXIED: dict[str, Work] = {
    CHAT_PATH: Work.CHAT,
    "/v1/completions": Work.COMPLETION,
    RESPONSES_PATH: Work.RESPONSES,
    **POOLING_ROUTES,
    "/tokenize": Work.TOKENS,
    "/detokenize": Work.TOKENS,
}
"""Path → the work it asks for; every one a ``POST`` the proxy serves."""

USAGE_INJECTED = frozenset({CHAT_PATH, "/v1/completions"})
"""Routes whose streams take ``stream_options.include_usage`` (vLLM's chat and completions)."""

SERVED: tuple[str, ...] = (
    *(f"POST {path}" for path in PROXIED),
    "GET /v1/models",
    "GET /v1/models/{model}",
    "GET /healthz",
    "GET /readyz",
    "GET /fleetz",
    "GET /metrics",
    "GET /signals",
)
"""Every route a client may call (the admin routes aside), as a 404 lists them."""
