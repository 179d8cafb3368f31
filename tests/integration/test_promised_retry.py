"""A Retry-After the gateway stands behind, through the real gateway in front of the simulator: a
client refused for room and told when to come back is admitted when it comes back then, and the
promise is counted kept."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from kvgate.gateway.edge.server import running_gateway
from tests.integration.conftest import assert_idle, eventually
from tests.integration.test_admission_gateway import completion, config_for, small_fleet

HOLDERS = 7
"""Seven requests of ~560 KV tokens fill the 4000-token replica."""


async def test_a_client_back_at_its_promised_time_is_admitted() -> None:
    async with (
        small_fleet(time_scale=0.05) as fleet,
        running_gateway(
            config_for(fleet, max_queue_wait_s=30, promise_max_share=1.0, default_inter_token_s=0.003)
        ) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60) as http,
    ):
        holders = [
            asyncio.create_task(http.post("/v1/completions", json=completion())) for _ in range(HOLDERS)
        ]
        assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == HOLDERS)
        body = orjson.dumps(completion())
        sdk = {"content-type": "application/json", "x-stainless-retry-count": "0"}
        # This attempt may not wait at all (its own deadline), so it is refused with a promise.
        first = await http.post("/v1/completions", content=body, headers={**sdk, "x-request-timeout-ms": "1"})
        assert first.status_code == 429, first.text
        assert "x-should-retry" not in first.headers, "the gateway stands behind the time it gave"
        controller = gw.gateway.path.dispatcher.controller
        assert controller.promise_counts.made == 1
        await asyncio.sleep(int(first.headers["retry-after-ms"]) / 1000.0)
        again = await http.post(
            "/v1/completions", content=body, headers={**sdk, "x-stainless-retry-count": "1"}
        )
        assert again.status_code == 200, again.text
        assert all(a.status_code == 200 for a in await asyncio.gather(*holders))
        counts = controller.promise_counts
        assert (counts.made, counts.kept, counts.broken, counts.lapsed) == (1, 1, 0, 0)
        assert counts.errors.count == 1
        metrics = (await http.get("/metrics")).text
        assert 'kvgate_promises_total{outcome="kept"} 1.0' in metrics
        assert 'kvgate_promise_forecast_error_seconds_bucket{le="+Inf"} 1.0' in metrics
        await assert_idle(gw)
