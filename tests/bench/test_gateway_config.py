"""The one gateway config builder: what every benchmark shares, written once, valid for the gateway;
sections a benchmark gives are merged over the server's address or taken as given."""

from __future__ import annotations

from bench.harness.gateway_config import Model, Pool, gateway_config
from kvgate.config.loader import parse_config

URLS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


def test_one_pool_on_loopback_with_the_default_model() -> None:
    data = gateway_config(Pool(URLS, max_sequences=64), port=9000, server={"max_connections": 100})
    assert data["server"] == {"host": "127.0.0.1", "port": 9000, "drain_delay_s": 0, "max_connections": 100}
    assert data["pools"] == [
        {"name": "default", "replicas": URLS, "kv_capacity_tokens": 450_000, "max_sequences": 64}
    ]
    config = parse_config(data, {})
    assert config.models[0].max_model_len == 131072 and config.pools[0].max_sequences == 64


def test_a_prefill_decode_pair_and_sections_as_given() -> None:
    pools = [Pool(URLS[:1], name="prefill", role="prefill"), Pool(URLS[1:], name="decode", role="decode")]
    data = gateway_config(
        pools,
        model=Model("m", max_model_len=8192, kv_bytes_per_token=1, tokenizer={"kind": "bytes"}),
        routing={"policy": "round_robin"},
    )
    assert data["routing"] == {"policy": "round_robin"}
    config = parse_config(data, {})
    assert [pool.role for pool in config.pools] == ["prefill", "decode"]
    assert config.models[0].name == "m"
