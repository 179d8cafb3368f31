"""Fuzz the HTTP edge: whatever a client sends, the gateway answers cleanly and its accounting ends at 0.

One gateway in front of a two-replica simulated fleet (instant time, short natural outputs so that
even ``n = 200`` stays cheap) serves every example of the module. Each example sends one to three
requests at once over both completion routes: a valid body mutated (wrong types, huge, negative,
float and boolean numbers, missing fields, nested junk, unicode, long strings, prompt lists and
token ids, streams with junk ``stream_options``, duplicate keys, non-object JSON, invalid JSON and
UTF-8) with mutated headers (``X-Request-Id``, ``Authorization``, ``Content-Type``, retry-count and
deadline headers), read whole, abandoned after the first chunk or abandoned at once. Invariants:

- no status >= 500 other than a 502/503/504 whose message names a replica (a replica fault or no
  replica to serve);
- every 4xx/5xx body is OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``);
- a 200 that was read to its end is a JSON object, or an SSE stream ending in ``data: [DONE]``;
- an ``X-Request-Id`` echoed back is at most 128 printable ASCII characters (issue 12, item 1);
- after every example each work gauge is back to 0 (``assert_idle``) and ``/metrics`` parses.

Huge ``n`` and ``best_of`` (up to 10**9, the value that once took the simulator down) are in: the
gateway prices and bounds them, so none reaches a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config
from tests.integration.processes import WORK_GAUGES

ROUTES = ("/v1/chat/completions", "/v1/completions")
ANSWER_TIMEOUT_S = 15.0
KV_CAPACITY_TOKENS = 12000
ERROR_KEYS = frozenset({"message", "type", "param", "code"})

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[RunningGateway]:
    overrides = {"output_len_median_tokens": 6.0, "output_len_sigma": 0.5}
    async with SimFleet(replicas=2, time_scale=0.0, seed=0, overrides=overrides) as fleet:
        config = fuzz_config(fleet.urls)
        async with running_gateway(config) as running:
            yield running


def fuzz_config(urls: list[str]) -> GatewayConfig:
    """A small fleet in the gateway's eyes (the replicas have more room): two sequences per replica
    and a long queue budget, so that batches queue, not only take the straight path."""
    pool = {"name": "default", "replicas": urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_sequences": 2}
    server = {"port": 0, "timeouts": {"first_byte_s": 10.0}}
    return gateway_config(urls, server=server, pools=[pool], admission={"max_queue_wait_s": 300.0})


# -- bodies -------------------------------------------------------------------------------------

_INTS = st.sampled_from(
    [-(2**63), -1, 0, 1, 2, 7, 16, 129, 4096, 30000, 131072, 2**31, 2**53 + 1, 2**63, 2**64, 10**30]
)
_FLOATS = st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, -2.5, 1e-300, 1e308, 8.0])
_SCALARS = st.one_of(
    _INTS,
    _FLOATS,
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(["8", "1e9", "", "NaN", "\u0663", "\U0001f600"]),
)
_JUNK = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_COUNTS = st.sampled_from([-1, 0, 1, 2, 3, 128, 129, 200, 256, 10_000, 10**9])
_LONG_TEXT = st.sampled_from([1_000, 33_000, 120_000]).map(lambda size: "word " * (size // 5))
_TEXT = st.one_of(st.text(max_size=40), _LONG_TEXT, st.just(""), st.just("\u202e\x00\ud7ff\ufffd"))
_TOKEN_IDS = st.lists(st.integers(min_value=-5, max_value=200_000), max_size=8)
_PROMPTS = st.one_of(
    _TEXT,
    st.lists(st.text(max_size=20), max_size=5),
    _TOKEN_IDS,
    st.lists(_TOKEN_IDS, max_size=3),
    _JUNK,
)
_CONTENT = st.one_of(
    _TEXT,
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=2),
    _JUNK,
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "robot", ""]), "content": _CONTENT}
)
_MESSAGES = st.one_of(st.lists(_MESSAGE, max_size=3), _JUNK)
_STREAM_OPTIONS = st.one_of(
    st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), _SCALARS)}),
    st.just({"continuous_usage_stats": True}),
    _JUNK,
)

_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.just(MODEL), st.just(MODEL + " "), _JUNK),
    "messages": _MESSAGES,
    "prompt": _PROMPTS,
    "max_tokens": st.one_of(_INTS, _FLOATS, _SCALARS),
    "max_completion_tokens": st.one_of(_INTS, _FLOATS, _SCALARS),
    "n": st.one_of(_COUNTS, _FLOATS, st.booleans(), st.text(max_size=3)),
    "best_of": st.one_of(_COUNTS, _FLOATS, st.booleans()),
    "use_beam_search": _SCALARS,
    "temperature": _SCALARS,
    "top_p": _SCALARS,
    "logprobs": _SCALARS,
    "stream": st.one_of(st.booleans(), _SCALARS),
    "stream_options": _STREAM_OPTIONS,
    "stop": _JUNK,
    "user": _SCALARS,
    "kv_transfer_params": _JUNK,
    "junk": _JUNK,
}


def _base_body(route: str) -> dict[str, Any]:
    if route == ROUTES[0]:
        return {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
    return {"model": MODEL, "prompt": "Say hi", "max_tokens": 8}


def _encode_pairs(pairs: list[tuple[str, Any]]) -> bytes:
    """A JSON object written key by key, so a key may appear twice (``json``: integers past 64 bits)."""
    return ("{" + ",".join(json.dumps(k) + ":" + json.dumps(v) for k, v in pairs) + "}").encode()


@st.composite
def bodies(draw: st.DrawFn, route: str) -> bytes:
    pairs = list(_base_body(route).items())
    for _ in range(draw(st.integers(0, 4))):
        field = draw(st.sampled_from(sorted(_FIELD_VALUES)))
        action = draw(st.sampled_from(["set", "set", "set", "delete", "duplicate"]))
        if action == "delete":
            pairs = [(k, v) for k, v in pairs if k != field]
            continue
        value = draw(_FIELD_VALUES[field])
        if action == "set":
            pairs = [(k, v) for k, v in pairs if k != field]
        pairs.append((field, value))
    if draw(st.booleans()):
        pairs.append(("stream", True))
    raw = _encode_pairs(pairs)
    form = draw(st.sampled_from(["object"] * 8 + ["not_object", "invalid", "bad_utf8", "literal", "deep"]))
    if form == "not_object":
        return draw(st.sampled_from([b"[1, 2]", b'"text"', b"1", b"null", b"true", b"[" + raw + b"]"]))
    if form == "invalid":
        cut = draw(st.integers(0, max(0, len(raw) - 1)))
        return draw(st.sampled_from([raw[:cut], raw + b"}", raw + b" trailing", b"", b"{,}"]))
    if form == "bad_utf8":
        return raw.replace(b"Say hi", b"Say \xff\xfe\xc3(")
    if form == "literal":
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b'"\\ud800"']))
        return raw[:-1] + b',"max_tokens":' + literal + b"}"
    depth = draw(st.sampled_from([100, 2000]))
    return raw[:-1] + b',"junk":' + b"[" * depth + b"]" * depth + b"}"


# -- headers ------------------------------------------------------------------------------------

_HEADER_VALUES: dict[bytes, st.SearchStrategy[bytes]] = {
    b"x-request-id": st.one_of(
        st.sampled_from([b"", b"abc", b"same-id", b'a "quoted" id', b"caf\xc3\xa9", b"\xff\xfe", b"x" * 200]),
        st.sampled_from([100, 4000, 60_000]).map(lambda n: b"r" * n),
        st.binary(max_size=16).filter(lambda b: all(c >= 0x21 and c != 0x7F for c in b)),
    ),
    b"authorization": st.sampled_from(
        [
            b"Bearer sk-test",
            b"sk-test",
            b"Bearer",
            b"Bearer\tx",
            b"Basic dXNlcjpwYXNz",
            b"bearer  x",
            b"B" * 9000,
        ]
    ),
    b"content-type": st.sampled_from(
        [b"application/json", b"text/plain", b"application/json; charset=utf-16", b"multipart/x", b"\xff"]
    ),
    b"x-stainless-retry-count": st.sampled_from(
        [b"0", b"1", b"-1", b"abc", b"1.5", b"99999999999999999999999", b"\xb2", b"\xb9", b"+1", b"9" * 5000]
    ),
    b"x-request-timeout-ms": st.sampled_from(
        [b"0", b"-5", b"abc", b"nan", b"inf", b"1e309", b"1e-300", b"0.001", b"10", b"1" * 400]
    ),
    b"x-stainless-read-timeout": st.sampled_from([b"0", b"-1", b"nan", b"1e-9", b"600", b"\xb2"]),
}


@st.composite
def header_sets(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    names = draw(st.lists(st.sampled_from(sorted(_HEADER_VALUES)), max_size=4))
    headers = [(name, draw(_HEADER_VALUES[name])) for name in names]
    if draw(st.booleans()) and headers:
        headers.append(headers[0])
    return headers


_HANG_UPS = st.sampled_from([0.0, 0.002, 0.01, 0.05, 0.1])


@dataclass(frozen=True, slots=True)
class Attempt:
    route: str
    body: bytes
    headers: list[tuple[bytes, bytes]]
    read: str
    """``whole``; ``first_chunk``: leave after the first chunk; ``none``: leave once the status came;
    ``hang_up``: leave after ``hang_up_s`` whatever is happening (sending, queued, streaming)."""
    chunked: bool
    hang_up_s: float = 0.0


@st.composite
def attempts(draw: st.DrawFn) -> Attempt:
    route = draw(st.sampled_from(ROUTES))
    return Attempt(
        route=route,
        body=draw(bodies(route)),
        headers=draw(header_sets()),
        read=draw(st.sampled_from(["whole", "whole", "whole", "first_chunk", "none", "hang_up"])),
        chunked=draw(st.booleans()),
        hang_up_s=draw(_HANG_UPS),
    )


# -- invariants ---------------------------------------------------------------------------------


def _check_error(status: int, body: bytes) -> None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AssertionError(f"{status} body is not JSON: {body[:300]!r}") from None
    assert isinstance(parsed, dict) and isinstance(parsed.get("error"), dict), (
        f"{status} body is not OpenAI-shaped: {body[:300]!r}"
    )
    error = parsed["error"]
    assert set(error) >= ERROR_KEYS, f"{status} error lacks {sorted(ERROR_KEYS - set(error))}: {error}"
    assert isinstance(error["message"], str), error
    if status >= 500:
        assert status in (502, 503, 504), f"{status} from the gateway: {error['message']}"
        assert "replica" in error["message"].lower(), f"{status} names no replica: {error['message']}"


def _check_answer(status: int, headers: httpx.Headers, body: bytes, whole: bool, stream: bool) -> None:
    echoed = headers.get_list("x-request-id")
    for value in echoed:
        assert len(value) <= 128 and value.isascii() and value.isprintable(), (
            f"x-request-id echoed unbounded: {value[:80]!r} ({len(value)} chars)"
        )
    if status >= 400:
        _check_error(status, body)
        return
    assert status == 200, status
    if not whole:
        return
    if stream:
        assert body.endswith(b"data: [DONE]\n\n"), f"stream did not end with [DONE]: {body[-300:]!r}"
        return
    parsed = orjson.loads(body)
    assert isinstance(parsed, dict) and "choices" in parsed, body[:300]


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 7000):
        yield data[start : start + 7000]
    if not data:
        yield b""


async def _send(http: httpx.AsyncClient, attempt: Attempt) -> None:
    try:
        if attempt.read != "hang_up":
            await _exchange(http, attempt)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(attempt.hang_up_s):
                await _exchange(http, attempt)
    except httpx.TimeoutException:
        raise AssertionError(
            f"no answer within {ANSWER_TIMEOUT_S:g} s on an instant fleet: stuck in the queue or stalled"
        ) from None


async def _exchange(http: httpx.AsyncClient, attempt: Attempt) -> None:
    content: bytes | AsyncIterator[bytes] = _chunks(attempt.body) if attempt.chunked else attempt.body
    request = http.build_request("POST", attempt.route, content=content, headers=attempt.headers)
    response = await http.send(request, stream=True)
    try:
        stream = response.headers.get("content-type", "").startswith("text/event-stream")
        if attempt.read == "none" and response.status_code == 200:
            _check_answer(response.status_code, response.headers, b"", False, stream)
            return
        if attempt.read == "first_chunk" and response.status_code == 200:
            async for _ in response.aiter_raw():
                break
            _check_answer(response.status_code, response.headers, b"", False, stream)
            return
        body = await response.aread()
        _check_answer(response.status_code, response.headers, body, True, stream)
    finally:
        await response.aclose()


async def _check_metrics(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    response = await http.get("/metrics")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    for name in WORK_GAUGES:
        family = families.get(name)
        assert family is not None, f"{name} missing from /metrics"
        for sample in family.samples:
            assert sample.value == 0 or math.isclose(sample.value, 0.0), f"{name} stays at {sample}"
    signals = await http.get("/signals")
    assert signals.status_code == 200
    orjson.loads(signals.content)


_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def _plain(headers: list[tuple[bytes, bytes]], route: str = ROUTES[0]) -> list[Attempt]:
    return [Attempt(route, orjson.dumps(_base_body(route)), headers, "whole", chunked=False)]


@_SETTINGS
@given(batch=st.lists(attempts(), min_size=1, max_size=3))
@example(batch=_plain([(b"x-stainless-retry-count", b"\xb2")]))
@example(batch=_plain([(b"x-stainless-retry-count", b"9" * 5000)]))
@example(batch=_plain([(b"x-request-id", b"caf\xc3\xa9")], ROUTES[1]))
@example(batch=_plain([(b"x-request-timeout-ms", b"1e-300")]))
async def test_mutated_requests_get_clean_answers_and_leave_nothing_held(
    gw: RunningGateway, batch: list[Attempt]
) -> None:
    timeout = httpx.Timeout(ANSWER_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=gw.url, timeout=timeout) as http:
        async with asyncio.timeout(ANSWER_TIMEOUT_S * 2):
            await asyncio.gather(*(_send(http, attempt) for attempt in batch))
        await assert_idle(gw)
        await _check_metrics(gw, http)


_CLIENT = st.tuples(
    st.sampled_from([b"victim", b"other", b""]),
    st.sampled_from([30, 64, 3000]),
    st.sampled_from(["whole", "first_chunk", "none", "hang_up", "hang_up"]),
    _HANG_UPS,
)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(route=st.sampled_from(ROUTES), clients=st.lists(_CLIENT, min_size=24, max_size=40))
async def test_concurrent_streams_sharing_ids_and_hanging_up_release_everything(
    gw: RunningGateway, route: str, clients: list[tuple[bytes, int, str, float]]
) -> None:
    """Up to 40 concurrent streams, several with one ``X-Request-Id`` (issue 12, item 1), more than
    the fleet's sequence limit so that most queue and the admission pump dispatches while clients
    hang up (item 2), some abandoned mid-stream: each is its own reservation and each is released."""
    batch = []
    for request_id, max_tokens, read, hang_up_s in clients:
        body = orjson.dumps({**_base_body(route), "stream": True, "max_tokens": max_tokens})
        headers = [(b"x-request-id", request_id)] if request_id else []
        batch.append(Attempt(route, body, headers, read, chunked=False, hang_up_s=hang_up_s))
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=gw.url, timeout=ANSWER_TIMEOUT_S, limits=limits) as http:
        async with asyncio.timeout(ANSWER_TIMEOUT_S * 2):
            await asyncio.gather(*(_send(http, attempt) for attempt in batch))
        await assert_idle(gw)
        await _check_metrics(gw, http)
