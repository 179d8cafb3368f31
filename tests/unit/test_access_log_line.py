"""A json access-log line is the bytes structlog's ``TimeStamper(fmt=None)`` and
``JSONRenderer(serializer=orjson.dumps)`` wrote for the same fields and time: the fields in their
order, the time last, orjson's formatting."""

from __future__ import annotations

import io
import sys

import orjson
import pytest
import structlog

from kvgate.config.observability import AccessLog as AccessLogConfig
from kvgate.gateway.edge.errors import TooManyRequests
from kvgate.gateway.state import ProxyRequest, ReplicaState
from kvgate.gateway.telemetry.access_log import AccessLog
from kvgate.vocabulary.replica import Role


def _request(**fields: object) -> ProxyRequest:
    request = ProxyRequest("a1b2", "label", "/v1/chat/completions", "m", False, {}, b"", [], [])
    for name, value in fields.items():
        setattr(request, name, value)
    return request


REPLICA = ReplicaState(
    "r1", "http://10.0.0.1:8000", "pool-a", Role.MIXED, frozenset({"m"}), 1000, 8, name="r-one"
)
REQUESTS = {
    "success": _request(
        replica=REPLICA,
        tenant="team-a",
        prompt_tokens=17,
        completion_tokens=5,
        status=200,
        started_s=10.0,
        arrived_s=10.001,
        first_token_s=10.25,
        queue_wait_s=0.125,
    ),
    "refused stream": _request(stream=True, status=429, error=TooManyRequests("busy", retry_after_s=2.0)),
    "client left": _request(disconnected=True, model="", tenant='tenant \u00e9"quoted"'),
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_json_line_is_the_bytes_structlog_rendered(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(sink))
    log = AccessLog(AccessLogConfig(format="json"), lambda model: "pool-of-" + model)
    log.write(REQUESTS[name], 11.5)
    log.flush()
    line = sink.getvalue()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    fields = orjson.loads(line)
    assert list(fields)[-1] == "timestamp"
    moment = fields.pop("timestamp")
    stamped = structlog.processors.TimeStamper(fmt=None)(None, "info", fields)
    stamped["timestamp"] = moment
    rendered = structlog.processors.JSONRenderer(serializer=orjson.dumps)(None, "info", stamped)
    assert rendered + b"\n" == line
