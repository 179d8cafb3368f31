"""DNS discovery with names that resolve here: new addresses start cold, a failed lookup keeps
the pool, and a DNS pool is not resized by hand."""

from __future__ import annotations

import httpx

from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import parse_config
from kvgate.config.pools import DnsReplicas
from kvgate.gateway.edge.server import running_gateway
from kvgate.gateway.replicas.discovery import DnsDiscovery
from kvgate.gateway.state import GatewayState
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config


def dns_config(name: str, port: int) -> GatewayConfig:
    return parse_config(
        {
            "server": {"port": 0},
            "health": {"interval_s": 0.2, "timeout_s": 1.0},
            "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
            "pools": [
                {
                    "name": "dns",
                    "dns": {"name": name, "port": port, "refresh_s": 0.2},
                    "kv_capacity_tokens": 450000,
                }
            ],
        },
        {},
    )


async def test_localhost_pool_is_discovered_probed_and_served(fleet: SimFleet) -> None:
    port = fleet.replicas[0].port
    async with (
        running_gateway(dns_config("localhost", port)) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
    ):
        url = f"http://127.0.0.1:{port}"
        assert url in gw.state.replicas
        assert await eventually(lambda: gw.state.replicas[url].healthy)
        body = {"model": MODEL, "prompt": "Say hi", "max_tokens": 2}
        response = await http.post("/v1/completions", json=body, headers={"x-request-id": "dns-1"})
        assert response.status_code == 200
        assert fleet.replicas[0].recorded("dns-1")

        (pool,) = (await http.get("/admin/pools")).json()["data"]
        assert pool["discovery"] == f"dns:localhost:{port}"
        refused = await http.put("/admin/pools/dns/replicas", json={"urls": fleet.urls})
        assert refused.status_code == 409
        assert refused.json()["error"]["type"] == "ConflictError"
        assert list(gw.state.replicas) == [url]
        await assert_idle(gw)


async def test_discovered_addresses_start_cold_and_a_failed_lookup_keeps_the_pool() -> None:
    state = GatewayState.from_config(gateway_config(["http://127.0.0.1:9"]))
    await DnsDiscovery(state, "default", DnsReplicas(name="localhost", port=8000)).refresh()
    assert list(state.replicas) == ["http://127.0.0.1:8000"]
    discovered = state.replicas["http://127.0.0.1:8000"]
    assert not discovered.healthy
    discovered.healthy = True

    await DnsDiscovery(state, "default", DnsReplicas(name="kvgate-no-such-host.invalid", port=8000)).refresh()
    assert state.replicas == {"http://127.0.0.1:8000": discovered}
    assert discovered.healthy


async def test_ipv6_addresses_are_bracketed() -> None:
    state = GatewayState.from_config(gateway_config(["http://127.0.0.1:9"]))
    urls = await DnsDiscovery(state, "default", DnsReplicas(name="::1", port=8000, scheme="https")).resolve()
    assert urls == ["https://[::1]:8000"]
