"""OpenTelemetry tracing through the real gateway: a request's span with admit, route and upstream
children, the W3C ``traceparent`` the replica receives naming the upstream span, a client's own
trace continued, and nothing added when tracing is off."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.test_gateway_credentials import RecordingReplica, config_for

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACING = {"enabled": True, "exporter": "none"}


def recorded(gw: RunningGateway) -> InMemorySpanExporter:
    assert gw.gateway.tracing is not None
    exporter = InMemorySpanExporter()
    gw.gateway.tracing.provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def traceparent(headers: dict[str, str]) -> tuple[str, str, str, str]:
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    return version, trace_id, parent_id, flags


@pytest.mark.parametrize("client_trace", [False, True])
async def test_spans_nest_and_the_replica_continues_the_trace(client_trace: bool) -> None:
    headers: dict[str, Any] = {"x-request-id": "traced-1"}
    if client_trace:
        headers["traceparent"] = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
    async with (
        RecordingReplica() as replica,
        running_gateway(config_for(replica, tracing=TRACING)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        exporter = recorded(gw)
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
        assert await eventually(
            lambda: any(s.parent is None or s.parent.is_remote for s in exporter.get_finished_spans())
        )
        await assert_idle(gw)
    spans = by_name(exporter.get_finished_spans())
    (root,) = spans["POST /v1/chat/completions"]
    (admit,) = spans["admit"]
    (route,) = spans["route"]
    (upstream,) = spans["upstream"]
    trace_id = root.context.trace_id
    assert all(s.context.trace_id == trace_id for group in spans.values() for s in group)
    if client_trace:
        assert f"{trace_id:032x}" == CLIENT_TRACE_ID
        assert (
            parent_of(root) == int(CLIENT_SPAN_ID, 16) and root.parent is not None and root.parent.is_remote
        )
    else:
        assert root.parent is None
    assert parent_of(admit) == parent_of(route) == parent_of(upstream) == root.context.span_id
    assert "queue" not in spans, "a request admitted at once never waited"
    assert root.attributes is not None and root.attributes["http.response.status_code"] == 200
    assert root.attributes["kvgate.x_request_id"] == "traced-1"
    assert upstream.attributes is not None
    assert upstream.attributes["kvgate.replica"] == next(iter(gw.state.replicas.values())).name
    assert root.start_time is not None and admit.start_time is not None and upstream.end_time is not None
    assert root.start_time <= admit.start_time <= upstream.start_time <= upstream.end_time
    (sent,) = replica.seen("/v1/chat/completions")
    version, sent_trace, sent_parent, flags = traceparent(sent)
    assert version == "00" and int(flags, 16) & 1, "sampled"
    assert sent_trace == f"{trace_id:032x}", "the replica's spans join the gateway's trace"
    assert sent_parent == f"{upstream.context.span_id:016x}", "under the upstream attempt"


async def test_tracing_off_adds_no_traceparent_and_passes_a_clients_on() -> None:
    async with (
        RecordingReplica() as replica,
        running_gateway(config_for(replica)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        assert gw.gateway.tracing is None
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 200
        client = {"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"}
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=client)).status_code == 200
        await assert_idle(gw)
    plain, passed = replica.seen("/v1/chat/completions")
    assert "traceparent" not in plain and "tracestate" not in plain
    assert passed["traceparent"] == client["traceparent"], "unchanged, as any other header"


async def test_a_refused_request_is_one_span_with_its_status() -> None:
    auth = {"enabled": True, "tenants": [{"name": "team", "api_keys": ["sk-team"]}]}
    async with (
        RecordingReplica() as replica,
        running_gateway(config_for(replica, tracing=TRACING, auth=auth)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        exporter = recorded(gw)
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 401
        assert await eventually(lambda: len(exporter.get_finished_spans()) >= 2)
        await assert_idle(gw)
    spans = by_name(exporter.get_finished_spans())
    (root,) = spans["POST /v1/chat/completions"]
    assert set(spans) == {"POST /v1/chat/completions", "admit"}
    assert root.attributes is not None and root.attributes["http.response.status_code"] == 401
    assert root.attributes["kvgate.reason"] == "unauthorized"
    assert root.status.status_code is StatusCode.UNSET, "a 4xx is the client's error, not the server span's"
    assert replica.seen("/v1/chat/completions") == []


async def test_each_attempt_is_an_upstream_span_and_its_replica_gets_its_own_traceparent() -> None:
    async with (
        RecordingReplica(mode="error") as first,
        RecordingReplica(mode="error") as second,
    ):
        pool = {"name": "default", "replicas": [first.url, second.url], "kv_capacity_tokens": 450000}
        config = gateway_config([first.url, second.url], pools=[pool], tracing=TRACING)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            exporter = recorded(gw)
            assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 502
            assert await eventually(
                lambda: "POST /v1/chat/completions" in by_name(exporter.get_finished_spans())
            )
            await assert_idle(gw)
    spans = by_name(exporter.get_finished_spans())
    (root,) = spans["POST /v1/chat/completions"]
    attempts = sorted(spans["upstream"], key=lambda s: s.start_time or 0)
    assert len(attempts) == len(spans["route"]) == 2, "one retry on the other replica"
    assert all(s.status.status_code is StatusCode.ERROR for s in attempts)
    assert root.status.status_code is StatusCode.ERROR and root.attributes is not None
    assert root.attributes["kvgate.retries"] == 1 and root.attributes["kvgate.reason"] == "upstream_error"
    sent = [traceparent(h) for r in (first, second) for h in r.seen("/v1/chat/completions")]
    assert sorted(parent for _, _, parent, _ in sent) == sorted(f"{s.context.span_id:016x}" for s in attempts)


async def test_a_trace_sampled_out_records_nothing_and_tells_the_replica_so() -> None:
    tracing = {**TRACING, "sample_ratio": 0}
    async with (
        RecordingReplica() as replica,
        running_gateway(config_for(replica, tracing=tracing)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        exporter = recorded(gw)
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await assert_idle(gw)
    assert exporter.get_finished_spans() == ()
    (sent,) = replica.seen("/v1/chat/completions")
    version, trace_id, _, flags = traceparent(sent)
    assert version == "00" and int(trace_id, 16) != 0 and not int(flags, 16) & 1, "not sampled"
