"""A whole (non-streamed) answer arrives when its generation has ended: through a real gateway in
front of the simulator, such answers teach neither the prefill rate admission forecasts with, nor
the replica's TTFT average (cold-replica detection), nor the TTFT histogram; a stream's first token
teaches all three."""

from __future__ import annotations

import re

import httpx

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config

LONG_PROMPT = "the prefix cache holds a block " * 120


def ttft_count(exposition: str) -> float:
    counts = re.findall(r"^kvgate_time_to_first_token_seconds_count\{[^}]*\} (\S+)$", exposition, re.M)
    return sum(float(c) for c in counts)


async def test_whole_answers_teach_no_ttft_and_a_stream_does() -> None:
    async with SimFleet(replicas=1, time_scale=0.01, seed=0, overrides={"warmup_s": 0}) as fleet:  # noqa: SIM117
        async with (
            running_gateway(gateway_config(fleet.urls)) as gw,
            httpx.AsyncClient(base_url=gw.url) as http,
        ):
            controller = gw.gateway.path.dispatcher.controller
            default_rate = controller.rates.prefill_tokens_per_s
            replica = next(iter(gw.state.replicas.values()))
            body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 64, "ignore_eos": True}
            for _ in range(3):
                answer = await http.post("/v1/completions", json=body, timeout=30)
                assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] >= 256
            await assert_idle(gw)
            assert controller.rates.prefill_tokens_per_s == default_rate, "a generation is no prefill"
            assert replica.ttft_ewma_s is None, "whole answers do not make a replica look cold"
            assert ttft_count((await http.get("/metrics")).text) == 0

            streamed = await http.post("/v1/completions", json={**body, "stream": True}, timeout=30)
            assert streamed.status_code == 200
            await assert_idle(gw)
            assert controller.rates.prefill_tokens_per_s != default_rate
            assert replica.ttft_ewma_s is not None
            assert ttft_count((await http.get("/metrics")).text) == 1
