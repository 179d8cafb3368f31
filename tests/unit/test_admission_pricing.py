"""Pricing what the replica will really run: the cap each route honours, ``n``/``best_of`` sequences,
each prompt of a completions batch on its own, the fields that cannot be priced refused, and the
body forwarded so that the replica cannot generate more than was priced."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.admission.controller import AdmissionController
from kvgate.admission.cost import (
    CostEstimate,
    InvalidRequest,
    Requested,
    capped_body,
    estimate_cost,
    requested_max_tokens,
    requested_work,
)
from kvgate.admission.counting import batch_of
from kvgate.admission.decision import AdmissionRequest, Admit, Refusal
from kvgate.admission.ledger import InMemoryLedger
from kvgate.admission.tenants import Tenant
from kvgate.config.admission import AdmissionConfig, ModelAdmissionConfig
from kvgate.config.models import Model
from kvgate.routing.filters import Gate
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.capacity import fits
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role
from kvgate.vocabulary.snapshot import FleetSnapshot

CHAT, COMPLETIONS = True, False
FACTS = Model(name="m", max_model_len=1000, kv_bytes_per_token=1)
CONFIG = AdmissionConfig(
    default_model=ModelAdmissionConfig(default_max_tokens=64), max_output_tokens_ceiling=512
)


@pytest.mark.parametrize(
    ("body", "chat", "expected"),
    [
        ({}, CHAT, None),
        ({"max_tokens": 10}, CHAT, 10),
        (
            {"max_completion_tokens": 20, "max_tokens": 10},
            CHAT,
            20,
        ),  # vLLM: max_completion_tokens or max_tokens
        ({"max_completion_tokens": None, "max_tokens": 10}, CHAT, 10),
        ({}, COMPLETIONS, None),
        ({"max_tokens": 30000, "max_completion_tokens": 1}, COMPLETIONS, 30000),  # vLLM reads max_tokens only
        ({"max_completion_tokens": 1}, COMPLETIONS, None),
    ],
)
def test_each_route_reads_the_cap_vllm_honours(
    body: dict[str, Any], chat: bool, expected: int | None
) -> None:
    assert requested_max_tokens(body, chat) == expected


@pytest.mark.parametrize(
    ("body", "chat", "prompts", "expected"),
    [
        ({}, CHAT, 1, Requested(None, 1)),
        ({"n": 4, "max_tokens": 10}, CHAT, 1, Requested(10, 4)),
        ({"n": None}, CHAT, 1, Requested(None, 1)),
        ({"n": 2, "best_of": 5}, COMPLETIONS, 1, Requested(None, 5)),  # best_of runs max(n, best_of)
        ({"n": 3, "best_of": 1}, COMPLETIONS, 1, Requested(None, 3)),
        ({"n": 2}, COMPLETIONS, 3, Requested(None, 2)),
        ({"n": 128}, CHAT, 1, Requested(None, 128)),
        ({"use_beam_search": False}, CHAT, 1, Requested(None, 1)),
        ({"prompt_embeds": None}, COMPLETIONS, 1, Requested(None, 1)),
    ],
)
def test_requested_work(body: dict[str, Any], chat: bool, prompts: int, expected: Requested) -> None:
    assert requested_work(body, chat, prompts, CONFIG) == expected


@pytest.mark.parametrize(
    ("body", "chat", "prompts", "param", "fragment"),
    [
        ({"n": 200}, CHAT, 1, "n", "at most 128"),
        ({"n": 1_000_000_000}, COMPLETIONS, 1, "n", "at most 128"),
        ({"n": 0}, CHAT, 1, "n", "positive integer"),
        ({"n": 1.5}, CHAT, 1, "n", "positive integer"),
        ({"n": True}, CHAT, 1, "n", "positive integer"),
        ({"n": "4"}, CHAT, 1, "n", "positive integer"),
        ({"best_of": 129}, COMPLETIONS, 1, "best_of", "at most 128"),
        ({"best_of": -1}, COMPLETIONS, 1, "best_of", "positive integer"),
        ({"n": 2}, COMPLETIONS, 65, "prompt", "130 sequences"),
        ({"use_beam_search": True}, CHAT, 1, "use_beam_search", "not supported"),
        ({"use_beam_search": True}, COMPLETIONS, 1, "use_beam_search", "not supported"),
        ({"prompt_embeds": ["AAAA"]}, COMPLETIONS, 1, "prompt_embeds", "not supported"),
        ({"max_tokens": 0}, COMPLETIONS, 1, "max_tokens", "positive integer"),
        ({"max_completion_tokens": "9"}, CHAT, 1, "max_completion_tokens", "positive integer"),
    ],
)
def test_work_that_cannot_be_priced_is_a_400(
    body: dict[str, Any], chat: bool, prompts: int, param: str, fragment: str
) -> None:
    invalid = requested_work(body, chat, prompts, CONFIG)
    assert isinstance(invalid, InvalidRequest)
    assert (invalid.status, invalid.param) == (400, param)
    assert fragment in invalid.message


def test_the_bound_on_sequences_is_configurable() -> None:
    config = AdmissionConfig(max_sequences_per_request=4)
    assert requested_work({"n": 4}, CHAT, 1, config) == Requested(None, 4)
    invalid = requested_work({"n": 5}, CHAT, 1, config)
    assert isinstance(invalid, InvalidRequest) and "at most 4" in invalid.message


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "per_prompt", "expected"),
    [
        # (prompt tokens, sequences, per-sequence cap, kv tokens)
        (100, 10, 1, (100, 1, 10, 110)),
        (100, None, 1, (100, 1, 64, 164)),  # the default cap
        (100, 10, 4, (100, 4, 10, 140)),  # n sequences share one prompt
        ([100, 50, 25], 10, 1, (175, 3, 10, 205)),  # each prompt is its own request
        ([100, 50], 10, 3, (150, 6, 10, 210)),  # prompts * n sequences
        ([950, 10], None, 2, (960, 4, 50, 1160)),  # the default cap shrinks to the longest prompt's room
        ([600, 600], 300, 1, (1200, 2, 300, 1800)),  # each fits the window though together they do not
    ],
)
def test_cost_of_sequences_and_batches(
    prompt_tokens: int | list[int],
    max_tokens: int | None,
    per_prompt: int,
    expected: tuple[int, int, int, int],
) -> None:
    cost = estimate_cost("m", prompt_tokens, max_tokens, CONFIG, FACTS, per_prompt)
    assert isinstance(cost, CostEstimate)
    assert (cost.prompt_tokens, cost.sequences, cost.max_tokens, cost.kv_tokens) == expected
    assert cost.max_output_tokens == cost.sequences * cost.max_tokens


def test_every_prompt_of_a_batch_must_fit_the_window() -> None:
    invalid = estimate_cost("m", [10, 950], 100, CONFIG, FACTS, 1)
    assert isinstance(invalid, InvalidRequest)
    assert invalid.param == "max_tokens" and "(100 > 1000 - 950)" in invalid.message


@pytest.mark.parametrize(
    ("body", "chat", "cap", "forwarded"),
    [
        # nothing to change: the raw bytes go as they came
        ({"max_tokens": 10}, CHAT, 10, None),
        ({"max_completion_tokens": 10}, CHAT, 10, None),
        ({"max_completion_tokens": 10, "max_tokens": None}, CHAT, 10, None),
        ({"max_tokens": 10}, COMPLETIONS, 10, None),
        # the cap priced is written
        ({"x": 1}, CHAT, 64, {"x": 1, "max_completion_tokens": 64, "max_tokens": 64}),
        (
            {"max_completion_tokens": 5, "max_tokens": 40},
            CHAT,
            5,
            {"max_completion_tokens": 5, "max_tokens": 5},
        ),
        ({"x": 1}, COMPLETIONS, 64, {"x": 1, "max_tokens": 64}),
        ({"max_tokens": None}, COMPLETIONS, 64, {"max_tokens": 64}),
        ({"max_completion_tokens": 1, "max_tokens": 40}, COMPLETIONS, 40, {"max_tokens": 40}),
    ],
)
def test_the_forwarded_body_says_exactly_the_cap_priced(
    body: dict[str, Any], chat: bool, cap: int, forwarded: dict[str, Any] | None
) -> None:
    assert capped_body(body, chat, cap) == forwarded


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": "one"}, None),
        ({"prompt": ["one"]}, None),
        ({"prompt": [1, 2, 3]}, None),
        ({"prompt": [[1, 2, 3]]}, None),
        ({"prompt": ["one", "two"]}, ["one", "two"]),
        ({"prompt": [[1, 2], [3]]}, [[1, 2], [3]]),
        ({"messages": [{"role": "user", "content": "x"}]}, None),
    ],
)
def test_a_batch_is_a_list_of_two_or_more_prompts(body: dict[str, Any], expected: list[Any] | None) -> None:
    assert batch_of(body) == expected


def _view(replica_id: str, load: ReplicaLoad, max_sequences: int = 8) -> ReplicaView:
    return ReplicaView(
        replica_id, "http://x", "p", Role.MIXED, frozenset({"m"}), 10_000, max_sequences, True, 0.0, load
    )


@pytest.mark.parametrize(
    ("resident", "sequences", "expected"),
    [(0, 8, True), (0, 9, False), (4, 4, True), (5, 4, False), (7, 1, True), (8, 1, False)],
)
def test_a_request_needs_a_slot_for_each_of_its_sequences(
    resident: int, sequences: int, expected: bool
) -> None:
    view = _view("a", ReplicaLoad(resident_sequences=resident))
    assert fits(view, 100, sequences, 8) is expected
    routing = RoutingRequest("m", 50, 50, (), sequences)
    assert (Gate(routing, 1.0).passing([view])[0] == [view]) is expected


def test_the_ledger_holds_every_sequence_and_all_their_output() -> None:
    ledger = InMemoryLedger()
    cost = CostEstimate("m", 100, 4 * 50, 1, sequences=4)
    assert ledger.reserve("a", "r0", cost, 0.0)
    # 300 tokens of KV in whole 16-token blocks.
    assert ledger.load("r0") == ReplicaLoad(100, 4, 200, 304, 100)
    assert ledger.produced("a", 120)
    assert ledger.load("r0") == ReplicaLoad(0, 4, 80, 304)
    assert ledger.release("a")
    assert ledger.totals() == ReplicaLoad()


def _request(cost: CostEstimate) -> AdmissionRequest:
    return AdmissionRequest("q", Tenant("t"), cost)


def test_more_sequences_than_any_replica_runs_is_a_400_not_a_wait() -> None:
    controller = AdmissionController(AdmissionConfig(max_active_sequences_per_replica=16), InMemoryLedger())
    views = [_view("a", ReplicaLoad(), max_sequences=32), _view("b", ReplicaLoad(), max_sequences=8)]
    decision = controller.admit(
        _request(CostEstimate("m", 10, 17 * 5, 1, sequences=17)), FleetSnapshot(0.0, tuple(views))
    )
    assert isinstance(decision, Refusal)
    assert (decision.status, decision.param) == (400, "n")
    assert "17 sequences" in decision.message and "at most 16" in decision.message
    assert isinstance(
        controller.admit(
            _request(CostEstimate("m", 10, 16 * 5, 1, sequences=16)), FleetSnapshot(0.0, tuple(views))
        ),
        Admit,
    )


def test_a_replica_short_of_slots_for_every_sequence_is_not_a_candidate() -> None:
    ledger = InMemoryLedger()
    ledger.reserve("held", "a", CostEstimate("m", 10, 6, 1, sequences=6), 0.0)
    controller = AdmissionController(AdmissionConfig(), ledger)
    views = [_view("a", ledger.load("a")), _view("b", ReplicaLoad())]
    decision = controller.admit(
        _request(CostEstimate("m", 10, 4, 1, sequences=4)), FleetSnapshot(0.0, tuple(views))
    )
    assert isinstance(decision, Admit)
    assert [v.replica_id for v in decision.candidates] == ["b"]
