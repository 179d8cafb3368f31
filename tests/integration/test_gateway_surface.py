"""The OpenAI and vLLM routes beyond completions, through a real gateway in front of the simulator:
the official SDK's embeddings, responses (streamed and not) and model retrieval; vLLM's pooling,
score, rerank, tokenize and detokenize; a 404 that lists what is served; and, after each, the
gateway holds nothing."""

from __future__ import annotations

import httpx
import openai
import pytest

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_the_sdk_embeds_responds_streamed_and_not_and_retrieves_a_model(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, client(gw.url) as sdk:
        embedded = await sdk.embeddings.create(model=MODEL, input=["the cache", "the cache", "a GPU"])
        vectors = [e.embedding for e in embedded.data]
        assert [e.index for e in embedded.data] == [0, 1, 2]
        assert len(vectors[0]) > 0 and vectors[0] == vectors[1] != vectors[2], "equal texts embed equally"
        assert embedded.usage.prompt_tokens > 0
        await assert_idle(gw)

        answer = await sdk.responses.create(model=MODEL, input="Say hello", max_output_tokens=8)
        assert answer.status == "completed" and answer.output_text
        assert answer.usage is not None and answer.usage.output_tokens == 8
        assert answer.usage.input_tokens > 0
        await assert_idle(gw)

        stream = await sdk.responses.create(
            model=MODEL, instructions="Be brief.", input=[{"role": "user", "content": "Count"}],
            max_output_tokens=6, stream=True,
        )  # fmt: skip
        events = [event async for event in stream]
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) == 6
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "".join(deltas)
        await assert_idle(gw)

        model = await sdk.models.retrieve(MODEL)
        assert model.id == MODEL
        with pytest.raises(openai.NotFoundError):
            await sdk.models.retrieve("no-such-model")
        await assert_idle(gw)


async def test_vllm_pooling_score_rerank_and_tokens_routes(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        pooled = await http.post("/pooling", json={"model": MODEL, "input": "the block"})
        assert pooled.status_code == 200 and pooled.json()["data"][0]["object"] == "pooling"
        for path in ("/score", "/v1/score"):
            scored = await http.post(path, json={"model": MODEL, "text_1": "q", "text_2": ["a", "b"]})
            assert scored.status_code == 200, scored.text
            assert [d["index"] for d in scored.json()["data"]] == [0, 1]
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            body = {"model": MODEL, "query": "q", "documents": ["a", "b", "c"], "top_n": 2}
            ranked = await http.post(path, json=body)
            assert ranked.status_code == 200, ranked.text
            results = ranked.json()["results"]
            assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"]
        tokens = await http.post("/tokenize", json={"model": MODEL, "prompt": "the prefix cache"})
        assert tokens.status_code == 200 and tokens.json()["count"] > 0
        text = await http.post("/detokenize", json={"model": MODEL, "tokens": tokens.json()["tokens"]})
        assert text.status_code == 200 and isinstance(text.json()["prompt"], str)
        missing = await http.post("/v1/embeddings", json={"model": MODEL})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "input"
        unknown = await http.post("/v1/audio/speech", json={"model": MODEL})
        assert unknown.status_code == 404
        message = unknown.json()["error"]["message"]
        assert "POST /v1/embeddings" in message and "POST /v1/responses" in message
        await assert_idle(gw)
        metrics = (await http.get("/metrics")).text
        assert "kvgate_responses_total{" in metrics


async def test_pooling_and_tokens_are_served_by_a_prefill_replica_and_responses_by_the_pair() -> None:
    from tests.integration.test_gateway_pd import pd_config, pd_fleet

    async with (
        pd_fleet(prefill=1, decode=1) as fleet,
        running_gateway(pd_config(fleet, prefill=1)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        decode = fleet.replicas[1]
        embedded = await http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
        assert embedded.status_code == 200 and len(embedded.json()["data"]) == 2
        tokens = await http.post("/tokenize", json={"model": MODEL, "prompt": "the cache"})
        assert tokens.status_code == 200 and tokens.json()["count"] > 0
        assert sum(decode.engine.stats.request_success.values()) == 0, "nothing to decode went to decode"
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 4}
        answer = await http.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["output_tokens"] == 4
        assert sum(decode.engine.stats.request_success.values()) == 1, "a response decodes on the pair"
        await assert_idle(gw)
