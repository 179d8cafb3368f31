"""Who may call ``/admin/*``: the bearer of the admin token, or loopback clients when none is set;
the token comes from ``auth.admin_token`` (or ``KVGATE_AUTH__ADMIN_TOKEN``) of a running gateway."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from kvgate.config.loader import parse_config
from kvgate.gateway.edge.admin import build_admin_app
from kvgate.gateway.edge.server import running_gateway
from kvgate.gateway.state import GatewayState
from tests.integration.conftest import gateway_config

TOKEN = "s3cret-admin-token"
REPLICA = "http://127.0.0.1:9"


def admin_app(admin_token: str | None) -> tuple[FastAPI, GatewayState]:
    state = GatewayState.from_config(gateway_config([REPLICA]))
    return build_admin_app(state, lambda: b"", admin_token=admin_token), state


def client(app: FastAPI, host: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://kvgate")


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token", f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN}x"]
)
async def test_with_a_token_admin_routes_refuse_anything_but_its_bearer(authorization: str | None) -> None:
    app, state = admin_app(TOKEN)
    headers = {} if authorization is None else {"authorization": authorization}
    async with client(app) as http:
        listing = await http.get("/admin/pools", headers=headers)
        change = await http.put("/admin/pools/default/replicas", json={"urls": []}, headers=headers)
    for response in (listing, change):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "AuthenticationError"
    assert list(state.replicas) == [REPLICA]


async def test_the_bearer_of_the_token_gets_in_from_anywhere() -> None:
    app, state = admin_app(TOKEN)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with client(app, host="10.1.2.3") as http:
        assert (await http.get("/admin/pools", headers=headers)).status_code == 200
        change = await http.put("/admin/pools/default/replicas", json={"urls": []}, headers=headers)
    assert change.status_code == 200 and change.json()["replicas"] == []
    assert state.replicas == {}


@pytest.mark.parametrize(("host", "status"), [("127.0.0.1", 200), ("::1", 200), ("10.1.2.3", 403)])
async def test_without_a_token_only_loopback_clients_get_in(host: str, status: int) -> None:
    app, _ = admin_app(None)
    async with client(app, host=host) as http:
        response = await http.get("/admin/pools")
    assert response.status_code == status
    if status == 403:
        assert response.json()["error"]["type"] == "PermissionDeniedError"


async def test_routes_outside_admin_stay_open() -> None:
    app, _ = admin_app(TOKEN)
    async with client(app, host="10.1.2.3") as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/v1/models")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200


async def test_a_running_gateway_takes_its_admin_token_from_the_config() -> None:
    config = gateway_config([REPLICA], auth={"admin_token": TOKEN})
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        anonymous = await http.get("/admin/pools")
        wrong = await http.get("/admin/pools", headers={"authorization": "Bearer nope"})
        bearer = await http.put(
            "/admin/pools/default/replicas",
            json={"urls": ["http://127.0.0.1:10"]},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert anonymous.status_code == 401 and wrong.status_code == 401
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert bearer.status_code == 200
        assert list(gw.state.replicas) == ["http://127.0.0.1:10"]


async def test_an_all_digit_token_from_the_environment_is_text() -> None:
    base = {
        "server": {"port": 0},
        "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}],
        "pools": [{"name": "default", "replicas": [REPLICA], "kv_capacity_tokens": 100000}],
    }
    config = parse_config(base, {"KVGATE_AUTH__ADMIN_TOKEN": "123456"})
    assert config.auth.admin_token is not None and config.auth.admin_token.get_secret_value() == "123456"
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        assert (await http.get("/admin/pools")).status_code == 401
        granted = await http.get("/admin/pools", headers={"authorization": "Bearer 123456"})
        assert granted.status_code == 200
