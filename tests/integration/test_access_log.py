"""Access logs through the real gateway: one line per completion request on stderr, with what an SRE
needs to follow it (ids, tenant, model, pool, replica name, tokens, queue wait, TTFT, duration,
status, reason, retries), refusals and errors always, and nothing secret: no credentials, no
bodies, no replica addresses."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.test_gateway_credentials import RecordingReplica, config_for

FIELDS = {
    "timestamp",
    "event",
    "request_id",
    "x_request_id",
    "endpoint",
    "stream",
    "tenant",
    "model",
    "pool",
    "replica",
    "prompt_tokens_estimated",
    "prompt_tokens",
    "max_output_tokens",
    "completion_tokens",
    "cached_tokens_expected",
    "cached_tokens",
    "queue_wait_s",
    "ttft_s",
    "duration_s",
    "status",
    "reason",
    "retries",
}


class Stderr:
    """What the gateway wrote to stderr so far (it accumulates across reads of ``capsys``)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys
        self.text = ""

    def read(self) -> str:
        self.text += self._capsys.readouterr().err
        return self.text

    def access(self) -> list[dict[str, Any]]:
        """The JSON access lines; every line that looks like JSON must parse as it."""
        records = [orjson.loads(line) for line in self.read().splitlines() if line.startswith("{")]
        return [r for r in records if r.get("event") == "access"]


def chat(max_tokens: int = 8, content: str = "hi") -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


async def test_each_completion_writes_one_json_line_with_its_fields(
    fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    err = Stderr(capsys)
    async with running_gateway(gateway_config(fleet.urls)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            whole = await http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "label-1"})
            stream = {"model": MODEL, "prompt": "count", "max_tokens": 8, "stream": True, "ignore_eos": True}
            streamed = await http.post("/v1/completions", json=stream)
        assert whole.status_code == streamed.status_code == 200
        assert await eventually(lambda: len(err.access()) >= 2)
        await assert_idle(gw)
        first, second = err.access()
        names = {r.name for r in gw.state.replicas.values()}
        for record, endpoint, is_stream in (
            (first, "/v1/chat/completions", False),
            (second, "/v1/completions", True),
        ):
            assert set(record) == FIELDS
            assert record["endpoint"] == endpoint and record["stream"] is is_stream
            assert len(record["request_id"]) == 32 and int(record["request_id"], 16) >= 0
            assert record["tenant"] == "anonymous"
            assert record["model"] == MODEL and record["pool"] == "default"
            assert record["replica"] in names
            assert record["prompt_tokens_estimated"] > 0 and record["prompt_tokens"] > 0
            assert record["max_output_tokens"] == 8
            assert record["completion_tokens"] > 0
            assert record["cached_tokens_expected"] == 0, "a prompt never seen is expected to miss"
            assert record["cached_tokens"] is None, "a replica that reports no prompt_tokens_details"
            assert record["queue_wait_s"] == 0.0
            assert 0.0 < record["ttft_s"] <= record["duration_s"]
            assert record["status"] == 200 and record["reason"] is None and record["retries"] == 0
        assert first["x_request_id"] == "label-1" != first["request_id"]
        assert second["x_request_id"] == streamed.headers["x-request-id"] == second["request_id"]
        assert second["completion_tokens"] == 8
        assert not any(url in err.text for url in fleet.urls), "replicas go by name, never by address"


async def test_refusals_and_errors_are_logged_even_when_sampling_keeps_no_success(
    fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    err = Stderr(capsys)
    auth = {"enabled": True, "tenants": [{"name": "team", "api_keys": ["sk-team"]}]}
    admission = {"tenants": [{"name": "team", "tokens_per_min": 60}], "max_queue_wait_s": 0}
    model = {"name": MODEL, "max_model_len": 1000, "kv_bytes_per_token": 131072}
    config = gateway_config(
        fleet.urls, auth=auth, admission=admission, models=[model], access_log={"sample_ratio": 0}
    )
    team = {"authorization": "Bearer sk-team"}
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        assert (await http.post("/v1/chat/completions", json=chat(4), headers=team)).status_code == 200
        unknown = await http.post("/v1/chat/completions", json=chat(4), headers={"authorization": "Bearer x"})
        too_long = await http.post("/v1/chat/completions", json=chat(2000), headers=team)
        not_json = await http.post("/v1/chat/completions", content=b"{not json", headers=team)
        over_budget = await http.post("/v1/chat/completions", json=chat(50), headers=team)
        statuses = [a.status_code for a in (unknown, too_long, not_json, over_budget)]
        assert statuses == [401, 400, 400, 429]
        assert await eventually(lambda: len(err.access()) >= 4)
        await asyncio.sleep(0.05)
        await assert_idle(gw)
    records = err.access()
    assert [r["status"] for r in records] == [401, 400, 400, 429], "the sampled-out 200 wrote nothing"
    assert [r["reason"] for r in records] == [
        "unauthorized",
        "invalid_request",
        "invalid_request",
        "tenant_budget",
    ]
    assert [r["tenant"] for r in records] == [None, "team", None, "team"]
    assert records[1]["model"] == MODEL and records[2]["model"] is None
    assert records[3]["x_request_id"] == over_budget.headers["x-request-id"]
    assert all(r["replica"] is None and r["retries"] == 0 for r in records)


async def test_no_credential_body_or_address_reaches_the_log(
    fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    err = Stderr(capsys)
    pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": 450000, "api_key": "sk-pool-key"}
    config = gateway_config(fleet.urls, pools=[pool])
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        headers = {"authorization": "Bearer sk-secret", "cookie": "session=cookie-secret"}
        body = chat(4, content="private-prompt-text")
        assert (await http.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200
        assert await eventually(lambda: len(err.access()) == 1)
        await assert_idle(gw)
    for secret in ("sk-secret", "sk-pool-key", "cookie-secret", "private-prompt-text", *fleet.urls):
        assert secret not in err.text


async def test_text_format_writes_one_key_value_line(
    fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    err = Stderr(capsys)
    config = gateway_config(fleet.urls, access_log={"format": "text"})
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        answer = await http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "label-2"})
        assert answer.status_code == 200
        lines = lambda: [line for line in err.read().splitlines() if "event=access" in line]  # noqa: E731
        assert await eventually(lambda: len(lines()) == 1)
        await assert_idle(gw)
    (line,) = lines()
    assert "x_request_id=label-2" in line and "status=200" in line and f"model={MODEL}" in line
    assert not err.access(), "no JSON line besides"


async def test_a_failing_replica_and_a_client_that_leaves_are_logged_with_their_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = Stderr(capsys)
    async with (
        RecordingReplica(mode="error") as replica,
        running_gateway(config_for(replica)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        assert (await http.post("/v1/chat/completions", json=chat())).status_code == 502
        assert await eventually(lambda: len(err.access()) == 1)
        await assert_idle(gw)
    (failed,) = err.access()
    assert failed["status"] == 502 and failed["reason"] == "upstream_error"
    assert failed["replica"] == next(iter(gw.state.replicas.values())).name
    slow = {"overrides": {"warmup_s": 0}}
    async with (
        SimFleet(replicas=1, time_scale=1.0, seed=0, **slow) as fleet,
        running_gateway(gateway_config(fleet.urls)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        stream = {"model": MODEL, "prompt": "go", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        async with http.stream("POST", "/v1/completions", json=stream) as answer:
            async for _ in answer.aiter_bytes():
                break
        assert await eventually(lambda: len(err.access()) == 2)
        await assert_idle(gw)
    left = err.access()[1]
    assert left["status"] == 200 and left["reason"] == "client_disconnected"
    assert left["completion_tokens"] is None or left["completion_tokens"] < 2000
