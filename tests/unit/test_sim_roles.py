"""Disaggregated prefill/decode in the simulated engine and its wire format, as relations."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.sim.engine import Engine
from kvgate.sim.metrics import render_metrics
from kvgate.sim.profile import resolve_profile
from kvgate.sim.protocol import ApiError
from kvgate.sim.replica import parse_role
from kvgate.sim.validation import GenerationRequest, parse_generation
from kvgate.vocabulary.replica import Role

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _engine(**overrides: Any) -> Engine:
    return Engine(resolve_profile(overrides={"warmup_s": 0, **overrides}))


def _drain(engine: Engine) -> int:
    """Step until idle; returns the tokens scheduled over the whole run."""
    now_s, scheduled = 0.0, 0
    while engine.has_work:
        result = engine.step(now_s)
        now_s, scheduled = result.end_s, scheduled + result.num_scheduled_tokens
    return scheduled


def test_transferred_kv_skips_the_prefill_but_takes_the_prompt_blocks() -> None:
    prompt = list(range(8000))
    local, remote = _engine(), _engine()
    computed = local.add_request("a", prompt, 4, 0.0, ignore_eos=True)
    pulled = remote.add_request("a", prompt, 4, 0.0, ignore_eos=True, kv_transferred=True)
    first = remote.step(0.0)
    assert first.num_scheduled_tokens == 1 and first.produced == (pulled,)
    assert len(pulled.blocks) * 16 >= len(prompt)
    assert remote.pool.num_free_blocks == remote.pool.num_blocks - len(pulled.blocks)
    _drain(local)
    _drain(remote)
    assert computed.first_token_s is not None and pulled.first_token_s is not None
    assert pulled.first_token_s * 10 < computed.first_token_s
    assert pulled.num_output_tokens == computed.num_output_tokens == 4
    assert remote.kv_cache_usage_ratio == 0.0


def test_a_preempted_transferred_sequence_prefills_itself() -> None:
    engine = _engine(kv_capacity_tokens=2048)
    for i in range(2):
        prompt = list(range(i * 10_000, i * 10_000 + 900))
        engine.add_request(f"r{i}", prompt, 600, 0.0, ignore_eos=True, kv_transferred=True)
    scheduled = _drain(engine)
    assert engine.stats.num_preemptions > 0
    # Had the victim come back still "transferred", every step would have run one token each.
    assert scheduled > 2 * 600


def _parse(body: dict[str, object]) -> GenerationRequest | ApiError:
    return parse_generation(orjson.dumps({"model": MODEL, "prompt": "x", **body}), False, MODEL, 4096)


def test_kv_transfer_params_are_parsed_and_checked() -> None:
    error = _parse({"kv_transfer_params": [1]})
    assert isinstance(error, ApiError) and error.status == 400 and error.param == "body.kv_transfer_params"
    remote = _parse({"kv_transfer_params": {"do_remote_prefill": True, "remote_port": 1}})
    producer = _parse({"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}})
    plain = _parse({})
    assert isinstance(remote, GenerationRequest) and remote.remote_prefill
    assert isinstance(producer, GenerationRequest) and not producer.remote_prefill
    assert (
        isinstance(plain, GenerationRequest) and not plain.remote_prefill and plain.kv_transfer_params is None
    )


def test_role_is_exported_as_an_info_metric_and_bad_roles_are_named() -> None:
    page = render_metrics(_engine(), MODEL, 0.0, Role.PREFILL).decode()
    family = next(f for f in text_string_to_metric_families(page) if f.name == "kvgate_sim_role_info")
    assert [(s.labels["role"], s.value) for s in family.samples] == [("prefill", 1.0)]
    assert parse_role("decode") is Role.DECODE
    with pytest.raises(ValueError, match="mixed, prefill, decode"):
        parse_role("both")
