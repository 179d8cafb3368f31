"""``PUT /admin/pools/{pool}/replicas`` stores exactly the URL it validated, normalised, or refuses."""

from __future__ import annotations

import httpx
import pytest

from kvgate.gateway.edge.server import running_gateway
from tests.integration.conftest import gateway_config

REPLICA = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    "url",
    [
        "http://x:1\n",
        "http://x:1\r\nx-injected: 1",
        "http://x\t:1",
        " http://x:1",
        "ftp://x:1",
        "file:///etc/passwd",
        "http://user:pw@x:1",
        "http://x:1/v1",
        "http://x:99999",
        "",
    ],
)
async def test_a_bad_replica_url_is_an_openai_shaped_400_and_changes_nothing(url: str) -> None:
    async with running_gateway(gateway_config([REPLICA])) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        response = await http.put("/admin/pools/default/replicas", json={"urls": [url]})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "BadRequestError" and error["param"] == "urls" and error["code"] == 400
        assert list(gw.state.replicas) == [REPLICA]


async def test_a_good_replica_url_is_stored_normalised() -> None:
    async with running_gateway(gateway_config([REPLICA])) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        urls = ["HTTP://Replica-A.Example:8000/", "https://[::1]:8443", "http://10.0.0.5"]
        response = await http.put("/admin/pools/default/replicas", json={"urls": urls})
        assert response.status_code == 200, response.text
        stored = ["http://replica-a.example:8000", "https://[::1]:8443", "http://10.0.0.5"]
        assert sorted(gw.state.replicas) == sorted(stored)
        assert sorted(r["url"] for r in response.json()["replicas"]) == sorted(stored)
