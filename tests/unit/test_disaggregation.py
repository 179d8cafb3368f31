"""Prefill/decode disaggregation in the pure core and the config: what each pool holds for a
request, where its decode may go, why it is refused, and how an incomplete pair is explained."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest

from kvgate.admission.controller import AdmissionController
from kvgate.admission.cost import CostEstimate
from kvgate.admission.decision import AdmissionRequest, Refusal, RefusalReason
from kvgate.admission.disaggregation import handoff_candidates, prefill_cost
from kvgate.admission.ledger import InMemoryLedger
from kvgate.admission.tenants import Tenant
from kvgate.cli import main
from kvgate.config.admission import AdmissionConfig
from kvgate.config.loader import ConfigError, parse_config
from kvgate.gateway.request_path.handoff import decode_body, prefill_body
from kvgate.gateway.state import ProxyRequest, ReplicaState, retries
from kvgate.vocabulary.capacity import routable, takes_handoff
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role
from kvgate.vocabulary.snapshot import FleetSnapshot

MODEL = "m"
COST = CostEstimate(MODEL, 1000, 2 * 500, 131072, 2)


def view(rid: str, role: Role, capacity: int = 10_000, **fields: Any) -> ReplicaView:
    base = ReplicaView(
        rid, f"http://{rid}", role.value, role, frozenset({MODEL}), capacity, 256, True, 0.0, ReplicaLoad()
    )
    return dataclasses.replace(base, **fields)


def test_the_prefill_replica_holds_the_prompts_and_one_token_a_sequence() -> None:
    held = prefill_cost(COST)
    assert (held.prompt_tokens, held.max_output_tokens, held.sequences, held.kv_tokens) == (1000, 2, 2, 1002)


def test_a_decode_replica_takes_work_only_by_hand_off_and_a_prefill_one_only_first_hand() -> None:
    decode, prefill = view("d", Role.DECODE), view("p", Role.PREFILL)
    assert takes_handoff(decode, MODEL, 1.0) and not routable(decode, MODEL, 1.0)
    assert routable(prefill, MODEL, 1.0) and not takes_handoff(prefill, MODEL, 1.0)
    assert not takes_handoff(dataclasses.replace(decode, backoff_until_s=2.0), MODEL, 1.0)


def test_decode_candidates_fit_the_whole_worst_case_under_the_guard_most_room_first() -> None:
    fleet = FleetSnapshot(
        1.0,
        (
            view("p", Role.PREFILL, 50_000),
            view("small", Role.DECODE, 1_500),
            view("roomy", Role.DECODE, 9_000),
            view("roomier", Role.DECODE, 20_000),
            view("busy", Role.DECODE, 50_000, load=ReplicaLoad(0, 7, 0, 0)),
        ),
    )
    serving, fitting = handoff_candidates(COST, fleet, lambda v: 8)
    assert [v.replica_id for v in serving] == ["small", "roomy", "roomier", "busy"]
    assert [v.replica_id for v in fitting] == ["roomier", "roomy"]


def request(cost: CostEstimate = COST) -> AdmissionRequest:
    return AdmissionRequest("r1", Tenant("t"), cost)


@pytest.mark.parametrize(
    ("replicas", "status", "reason"),
    [
        ((view("p", Role.PREFILL),), 503, RefusalReason.NO_REPLICA),
        ((view("d", Role.DECODE, 1_500),), 400, RefusalReason.KV_CAPACITY),
        (
            (view("d", Role.DECODE, 4_000, load=ReplicaLoad(0, 1, 2_000, 3_000)),),
            429,
            RefusalReason.KV_CAPACITY,
        ),
    ],
)
def test_no_decode_room_is_a_refusal_that_names_the_decode_pool_as_the_bottleneck(
    replicas: tuple[ReplicaView, ...], status: int, reason: RefusalReason
) -> None:
    controller = AdmissionController(AdmissionConfig(), InMemoryLedger())
    room = controller.decode_room(request(), FleetSnapshot(1.0, replicas))
    assert isinstance(room, Refusal) and (room.status, room.reason) == (status, reason)
    if status == 429:
        assert "decode replicas" in room.message and room.retry_after is not None


def test_the_prefill_body_asks_for_one_token_and_a_remote_decode_the_decode_body_carries_the_hand_off() -> (
    None
):
    body = {
        "model": MODEL,
        "messages": [],
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "min_tokens": 3,
    }
    prefill = orjson.loads(prefill_body(body))
    assert prefill["max_tokens"] == prefill["max_completion_tokens"] == 1 and prefill["stream"] is False
    assert "stream_options" not in prefill and "min_tokens" not in prefill
    assert prefill["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    handoff = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1]}
    decode = orjson.loads(decode_body(body, handoff))
    assert decode == {**body, "kv_transfer_params": handoff}


def pools(*roles: str) -> list[dict[str, Any]]:
    return [{"name": role, "role": role, "replicas": [f"http://{role}:8000"]} for role in roles]


def config_data(*roles: str) -> dict[str, Any]:
    return {
        "models": [{"name": MODEL, "max_model_len": 8192, "kv_bytes_per_token": 1}],
        "pools": pools(*roles),
    }


@pytest.mark.parametrize(
    ("roles", "missing"), [(("prefill",), "no decode pool"), (("decode",), "no prefill pool")]
)
def test_half_a_pair_is_refused_with_what_to_add(roles: tuple[str, ...], missing: str) -> None:
    with pytest.raises(ConfigError) as failure:
        parse_config(config_data(*roles), {})
    assert missing in str(failure.value) and f"models.{MODEL}" in str(failure.value)


def test_a_model_is_disaggregated_with_a_pair_alone_or_beside_a_mixed_pool() -> None:
    assert parse_config(config_data("prefill", "decode"), {}).disaggregated(MODEL)
    both = parse_config(config_data("mixed", "prefill", "decode"), {})
    assert both.disaggregated(MODEL) and both.serving(MODEL)["mixed"] == ("mixed",)
    assert not parse_config(config_data("mixed"), {}).disaggregated(MODEL)


def test_config_check_explains_an_incomplete_pair_and_names_a_complete_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pd.yaml"
    path.write_text(orjson.dumps(config_data("prefill")).decode())
    assert main(["config", "check", str(path)]) == 2
    assert "a prefill replica computes only the prompt's KV" in capsys.readouterr().err
    path.write_text(orjson.dumps(config_data("mixed", "prefill", "decode")).decode())
    assert main(["config", "check", str(path)]) == 0
    assert (
        f"{MODEL}: prefill ['prefill'] hands off to decode ['decode'], 1 of its requests"
        in capsys.readouterr().out
    )


def test_the_hand_off_to_the_decode_replica_is_a_hop_not_a_retry() -> None:
    request = ProxyRequest(
        "r", "r", "/v1/completions", MODEL, False, {}, b"", [], [], tried=["p1", "p2", "d1"]
    )
    assert retries(request) == 2
    request.prefill_replica = ReplicaState(
        "p2", "http://p2", "prefill", Role.PREFILL, frozenset({MODEL}), 1, 1
    )
    assert retries(request) == 1
