"""The simulator against real vLLM, side by side: every request below goes to both, and what comes
back must have the same structure: status, content type, every JSON key in vLLM's order with the
same kind of value, and the values clients branch on (``object``, ``finish_reason``, the error's
``type``, ``param`` and ``code``, ids' prefixes) equal. Streams are compared event by event (a real
replica may pack several tokens in one chunk, so runs of alike chunks count once). On ``/metrics``,
every ``vllm:`` family the simulator exports exists on vLLM with the same type and label names, and
kvgate's own scraper reads the same facts from both pages. Generated text and timings are not
compared: vLLM's weights here are random."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.replicas.scrape import parse_vllm_metrics, scraped_capacity_tokens
from kvgate.sim.calibration import read_facts
from kvgate.sim.fleet import SimFleet
from tests.vllm.servers import MAX_MODEL_LEN, SERVED_MODEL, VllmServer

pytestmark = pytest.mark.vllm

M = SERVED_MODEL
USER = [{"role": "user", "content": "Hello world"}]
IDS = [11, 22, 33, 44, 55]
EXACT_KEYS = frozenset({"object", "finish_reason", "role", "type", "param", "code", "owned_by", "detail"})
"""Keys whose values are part of the structure: what clients and the gateway branch on."""
JSON = {"content-type": "application/json"}
EVENT_STREAM = "text/event-stream; charset=utf-8"
TIMEOUT = aiohttp.ClientTimeout(total=120)
"""A simulator that never answers (as one did for an empty prompt) fails, not hangs."""

GENERATION = [
    ("/v1/chat/completions", {"model": M, "messages": USER, "max_tokens": 3, "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "n": 2, "ignore_eos": True}),
    ("/v1/completions", {"model": M, "prompt": IDS, "max_tokens": 3, "ignore_eos": True}),
    ("/v1/completions", {"model": M, "prompt": "Hello", "max_tokens": 2, "n": 2, "ignore_eos": True}),
    ("/v1/completions", {"model": M, "prompt": [IDS, IDS[:3]], "max_tokens": 2, "ignore_eos": True}),
    ("/v1/completions", {"model": M, "prompt": [7] * 4000, "max_tokens": 500, "ignore_eos": True}),
    ("/v1/completions", {"model": M, "prompt": "x", "max_tokens": "3", "best_of": 2, "ignore_eos": "yes"}),
]
STREAMS = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4}),
    (
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 3, "n": 2, "stream_options": {"include_usage": True}},
    ),
    ("/v1/completions", {"prompt": IDS, "max_tokens": 4, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "n": 2}),
]
BAD = [
    ("/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":"hi"}'),
    ("/v1/completions", b'{"model": tiny}'),
    ("/v1/completions", b""),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/chat/completions", {"model": M, "max_tokens": 2}),
    ("/v1/chat/completions", {"model": M, "messages": "hello"}),
    ("/v1/chat/completions", {"model": M, "messages": [1, 2]}),
    ("/v1/chat/completions", {"model": M, "messages": []}),
    ("/v1/chat/completions", {"model": 5, "messages": USER}),
    ("/v1/chat/completions", {"model": "nope", "messages": USER, "n": 0}),
    ("/v1/completions", {"model": "nope", "prompt": "hi"}),
    ("/v1/chat/completions", {"model": M, "messages": USER, "max_tokens": "abc"}),
    ("/v1/chat/completions", {"model": M, "messages": USER, "max_tokens": 2.5}),
    ("/v1/chat/completions", {"model": M, "messages": USER, "max_tokens": -1}),
    ("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 0}),
    ("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 5000}),
    ("/v1/chat/completions", {"model": M, "messages": USER, "max_completion_tokens": 5000}),
    ("/v1/chat/completions", {"model": M, "messages": USER, "n": 0}),
    ("/v1/completions", {"model": M, "prompt": "hi", "temperature": -1}),
    ("/v1/completions", {"model": M, "prompt": "hi", "top_p": 0}),
    ("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 5, "min_tokens": 6}),
    ("/v1/completions", {"model": M, "prompt": "hi", "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"model": M, "prompt": "hi", "stream": True, "stream_options": "x"}),
    ("/v1/completions", {"model": M, "prompt": "hi", "kv_transfer_params": 5}),
    ("/v1/completions", {"model": M, "max_tokens": 2}),
    ("/v1/completions", {"model": M, "prompt": ""}),
    ("/v1/completions", {"model": M, "prompt": []}),
    ("/v1/completions", {"model": M, "prompt": [[]]}),
    ("/v1/completions", {"model": M, "prompt": ["a", 1]}),
    ("/v1/completions", {"model": M, "prompt": [7] * (MAX_MODEL_LEN + 1), "max_tokens": 1}),
    ("/v1/completions", {"model": M, "prompt": [7] * MAX_MODEL_LEN, "max_tokens": 1}),
    ("/tokenize", {"model": "nope", "prompt": "hi"}),
    ("/tokenize", {"model": M}),
    ("/tokenize", {"model": M, "messages": []}),
]
ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("GET", "/version", None),
    ("POST", "/tokenize", {"model": M, "prompt": "Hello world"}),
    ("POST", "/tokenize", {"messages": USER}),
    ("GET", "/v1/nothing", None),
    ("GET", "/v1/completions", None),
    ("POST", "/v1/models", {}),
]


@pytest.fixture
async def twin(replica: VllmServer) -> AsyncIterator[str]:
    """A simulated replica configured as the real one says it is (model, window, KV cache)."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        facts = await read_facts(http, replica.url)
    overrides = {
        "kv_capacity_tokens": facts.kv_capacity_tokens,
        "block_size_tokens": facts.block_size_tokens,
        "max_model_len": facts.max_model_len,
        "warmup_s": 0,
    }
    async with SimFleet(replicas=1, model=facts.model, time_scale=0.0, overrides=overrides) as fleet:
        yield fleet.urls[0]


def shape(value: Any, key: str = "") -> Any:
    """The structure of a JSON value: keys in order, kinds of values, and the values that matter."""
    if isinstance(value, dict):
        return [(k, shape(v, k)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", sorted({repr(shape(item)) for item in value})]
    if key in EXACT_KEYS:
        return value
    if key == "id" and isinstance(value, str):
        return value.split("-", 1)[0] + "-"
    return type(value).__name__


async def call(
    http: aiohttp.ClientSession, base: str, method: str, path: str, body: Any, headers: dict[str, str] = JSON
) -> tuple[int, str, str | None, bytes]:
    data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    async with http.request(method, base + path, data=data, headers=headers) as response:
        media = response.headers.get("content-type", "")
        return response.status, media, response.headers.get("allow"), await response.read()


def json_shape(raw: bytes) -> Any:
    return shape(orjson.loads(raw)) if raw else "empty"


def stream_shapes(raw: bytes) -> list[Any]:
    """Each event's shape, runs of alike events counted once."""
    shapes: list[Any] = []
    for event in raw.split(b"\n\n"):
        if not event:
            continue
        data = event.removeprefix(b"data: ")
        current = "[DONE]" if data == b"[DONE]" else shape(orjson.loads(data))
        if not shapes or shapes[-1] != current:
            shapes.append(current)
    return shapes


async def test_responses_and_errors_have_vllms_structure(replica: VllmServer, twin: str) -> None:
    requests: list[tuple[str, str, Any, dict[str, str]]] = [
        ("POST", path, body, JSON) for path, body in GENERATION + BAD
    ]
    requests += [(method, path, body, JSON) for method, path, body in ROUTES]
    requests.append(("POST", "/v1/completions", {"prompt": "hi"}, {"content-type": "text/plain"}))
    differences: list[str] = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for method, path, body, headers in requests:
            real, sim = [await call(http, url, method, path, body, headers) for url in (replica.url, twin)]
            if real[:3] != sim[:3] or json_shape(real[3]) != json_shape(sim[3]):
                differences.append(
                    f"{method} {path} {body!r}:\n  vLLM {real[:3]} {json_shape(real[3])}\n"
                    f"  sim  {sim[:3]} {json_shape(sim[3])}"
                )
    assert not differences, "\n".join(differences)


async def test_streams_have_vllms_events(replica: VllmServer, twin: str) -> None:
    differences: list[str] = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for path, extra in STREAMS:
            body = {"model": M, "stream": True, "ignore_eos": True, **extra}
            (real_status, real_type, _, real), (sim_status, sim_type, _, sim) = [
                await call(http, url, "POST", path, body) for url in (replica.url, twin)
            ]
            assert (real_status, real_type) == (sim_status, sim_type) == (200, EVENT_STREAM)
            real_events, sim_events = stream_shapes(real), stream_shapes(sim)
            alike = real_events == sim_events
            if "n" in extra:  # choices may interleave otherwise: the same events, the same ends
                alike = (
                    {repr(e) for e in real_events} == {repr(e) for e in sim_events}
                    and real_events[:1] == sim_events[:1]
                    and real_events[-2:] == sim_events[-2:]
                )
            if not alike:
                differences.append(f"{path} {extra!r}:\n  vLLM {real_events}\n  sim  {sim_events}")
    assert not differences, "\n".join(differences)


async def test_token_id_prompts_are_counted_alike(replica: VllmServer, twin: str) -> None:
    body = {"model": M, "prompt": [IDS, [7] * 3000], "max_tokens": 1500, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        answers = [await call(http, url, "POST", "/v1/completions", body) for url in (replica.url, twin)]
    usages = [orjson.loads(answer[3]) for answer in answers]
    real, sim = ({k: u["usage"][k] for k in ("prompt_tokens", "completion_tokens")} for u in usages)
    assert real == sim == {"prompt_tokens": 3005, "completion_tokens": 1500 + MAX_MODEL_LEN - 3000}
    assert [c["finish_reason"] for c in usages[0]["choices"]] == ["length", "length"]


def label_names(family: Metric) -> set[frozenset[str]]:
    """The label names of a family's samples (``le`` aside; vLLM's ``_created`` twins aside)."""
    return {frozenset(s.labels) - {"le"} for s in family.samples if not s.name.endswith("_created")}


async def test_the_metrics_kvgate_reads_are_vllms(replica: VllmServer, twin: str) -> None:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        pages = [(await call(http, url, "GET", "/metrics", None))[3].decode() for url in (replica.url, twin)]
    real, sim = ({f.name: f for f in text_string_to_metric_families(page)} for page in pages)
    differences = []
    for name, family in sim.items():
        if not name.startswith("vllm:"):
            continue
        if name not in real or real[name].type != family.type:
            theirs = real[name].type if name in real else "absent"
            differences.append(f"{name}: {family.type} in the simulator, {theirs} in vLLM")
            continue
        labels = [label_names(f) for f in (real[name], family)]
        if labels[0] != labels[1]:
            differences.append(f"{name}: labels {labels[0]} in vLLM, {labels[1]} in the simulator")
    assert not differences, "\n".join(differences)
    scraped = [parse_vllm_metrics(page, 0.0) for page in pages]
    assert all(s is not None for s in scraped)
    (real_facts, sim_facts) = scraped
    assert real_facts is not None and sim_facts is not None
    assert (real_facts.block_size_tokens, scraped_capacity_tokens(real_facts)) == (
        sim_facts.block_size_tokens,
        scraped_capacity_tokens(sim_facts),
    )
