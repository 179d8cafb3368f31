"""What a replica's ``/v1/models`` says against the config: refused models, both windows named."""

from __future__ import annotations

import logging

from kvgate.gateway.replicas.model_facts import Served, block_size_finding, compare, parse_models
from kvgate.gateway.state import ReplicaState
from kvgate.vocabulary.replica import Role


def replica(*models: str) -> ReplicaState:
    return ReplicaState(
        replica_id="http://r:8000",
        url="http://r:8000",
        pool="chat",
        role=Role("mixed"),
        models=frozenset(models),
        kv_capacity_tokens=0,
        max_sequences=8,
        name="chat-0",
    )


def test_the_body_vllm_sends_is_read() -> None:
    data = [{"id": "m", "max_model_len": 4096}, {"id": "lora", "max_model_len": None}]
    body = {"object": "list", "data": data}
    assert parse_models(body) == Served({"m": 4096, "lora": None})
    assert parse_models({"detail": "Not Found"}) is None


def test_a_model_the_replica_does_not_serve_is_refused_on_it() -> None:
    kept, findings = compare(replica("m", "other"), Served({"m": 8192}), {"m": 8192, "other": 8192})
    assert kept == {"m"}
    assert [f.level for f in findings] == [logging.ERROR]
    assert "http://r:8000 (chat-0) of pool chat does not serve ['other']" in findings[0].message
    assert "it serves ['m']" in findings[0].message
    kept, findings = compare(replica("other"), Served({"m": 8192}), {"other": 8192})
    assert kept == frozenset() and "it takes no requests at all" in findings[0].message


def test_both_context_windows_are_named_when_they_differ() -> None:
    _, findings = compare(replica("m"), Served({"m": 4096}), {"m": 8192})
    assert findings[0].level == logging.ERROR
    assert "max_model_len 4096 tokens but models.m.max_model_len is 8192" in findings[0].message
    _, findings = compare(replica("m"), Served({"m": 16384}), {"m": 8192})
    assert findings[0].level == logging.WARNING and "16384" in findings[0].message
    assert compare(replica("m"), Served({"m": 8192}), {"m": 8192})[1] == []


def test_a_block_size_other_than_routings_is_warned_about() -> None:
    finding = block_size_finding(replica("m"), 32, 16)
    assert finding is not None and "blocks of 32 tokens" in finding.message and "is 16" in finding.message
    assert block_size_finding(replica("m"), 16, 16) is None
