"""Who may read ``/metrics``, ``/signals``, ``/docs`` and ``/openapi.json``.

``auth.protect_observability`` unset follows ``auth.enabled``: a gateway that asks
clients for keys also closes its observability routes, to the bearer of the admin token or of
``auth.observability_token``; a tenant's key is not enough (they show the whole fleet)."""

from __future__ import annotations

from typing import Any

import httpx

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import assert_idle, gateway_config

ADMIN = "admin-token-1"
SCRAPER = "scraper-token-2"
TENANT = "sk-tenant-3"
PATHS = ("/metrics", "/signals", "/docs", "/openapi.json")
AUTH_ON = {"enabled": True, "tenants": [{"name": "team", "api_keys": [TENANT]}]}


async def statuses(fleet: SimFleet, authorization: str | None, **sections: Any) -> set[int]:
    config = gateway_config(fleet.urls, **sections)
    headers = {} if authorization is None else {"authorization": authorization}
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        answers = [await http.get(path, headers=headers) for path in PATHS]
        for answer in answers:
            if answer.status_code == 401:
                assert answer.json()["error"]["type"] == "AuthenticationError"
                assert answer.headers["www-authenticate"] == "Bearer"
        await assert_idle(gw)
    return {answer.status_code for answer in answers}


async def test_with_auth_on_they_need_the_admin_or_observability_token(fleet: SimFleet) -> None:
    auth = {**AUTH_ON, "admin_token": ADMIN, "observability_token": SCRAPER}
    for authorization in (None, f"Bearer {TENANT}", SCRAPER, "Bearer wrong"):
        assert await statuses(fleet, authorization, auth=auth) == {401}, authorization
    for authorization in (f"Bearer {ADMIN}", f"Bearer {SCRAPER}"):
        assert await statuses(fleet, authorization, auth=auth) == {200}


async def test_protection_is_a_setting(fleet: SimFleet) -> None:
    opened = {**AUTH_ON, "admin_token": ADMIN, "protect_observability": False}
    assert await statuses(fleet, None, auth=opened) == {200}
    closed = {"admin_token": ADMIN, "protect_observability": True}
    assert await statuses(fleet, None, auth=closed) == {401}
    assert await statuses(fleet, None, auth={"admin_token": ADMIN}) == {200}
