import random
import statistics
from pathlib import Path

import pytest

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.loadtest.distributions import Fixed, LogNormal, Uniform
from kvgate.loadtest.prompt_text import default_factory
from kvgate.loadtest.workload import build_trace
from kvgate.loadtest.workload_file import PRESETS, load_workload, parse_workload, with_overrides

TOKENIZER = TiktokenTokenizer.from_name()


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load(name: str) -> None:
    workload = load_workload(name)
    assert workload.name == name
    assert workload.classes


def test_same_seed_same_trace_byte_for_byte() -> None:
    workload = with_overrides(load_workload("shared-prefix"), duration_s=10.0)
    first = build_trace(workload, 11)
    second = build_trace(workload, 11)
    assert [r.at_s for r in first.requests] == [r.at_s for r in second.requests]
    assert [r.body("m") for r in first.requests] == [r.body("m") for r in second.requests]
    other = build_trace(workload, 12)
    assert [r.body("m") for r in first.requests] != [r.body("m") for r in other.requests]


def test_prompt_text_has_the_exact_token_length() -> None:
    factory = default_factory()
    for length in [0, 1, 2, 3, 7, 16, 50, 333, 2048, 30_000]:
        for key in range(3):
            assert TOKENIZER.count(factory.text(key * 1_000_003 + length, length)) == length


def test_prompts_of_different_requests_do_not_share_a_prefix() -> None:
    trace = build_trace(with_overrides(load_workload("chat"), duration_s=5.0), 3)
    openings = {TOKENIZER.encode(r.payload["messages"][-1]["content"])[:4].__repr__() for r in trace.requests}
    assert len(openings) == len(trace.requests)


def test_single_turn_prompt_tokens_match_the_text() -> None:
    trace = build_trace(with_overrides(load_workload("mixed"), duration_s=20.0), 2)
    for request in trace.requests:
        text = request.payload["messages"][-1]["content"]
        assert TOKENIZER.count(text) == request.prompt_tokens
    classes = {r.class_name for r in trace.requests}
    assert classes == {"short", "long"}
    short = [r for r in trace.requests if r.class_name == "short"]
    assert {(r.prompt_tokens, r.max_tokens) for r in short} == {(50, 20)}


def test_shared_prefix_sessions_reuse_system_prompts_and_grow_history() -> None:
    trace = build_trace(with_overrides(load_workload("shared-prefix"), duration_s=30.0), 5)
    systems = {r.payload["messages"][0]["content"] for r in trace.requests}
    assert 1 < len(systems) <= 4
    by_session: dict[int, list[int]] = {}
    for request in trace.requests:
        assert request.session is not None
        by_session.setdefault(request.session, []).append(len(request.payload["messages"]))
        counted = sum(TOKENIZER.count(m["content"]) for m in request.payload["messages"])
        assert counted == request.prompt_tokens
    assert any(len(turns) > 1 for turns in by_session.values())
    for turns in by_session.values():
        assert turns == [2 + 2 * i for i in range(len(turns))]


def test_requests_carry_max_tokens_streaming_usage_and_ignore_eos() -> None:
    trace = build_trace(with_overrides(load_workload("chat"), duration_s=3.0), 1)
    payload = trace.requests[0].payload
    assert payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True}
    assert payload["ignore_eos"] is True
    assert payload["max_tokens"] == trace.requests[0].max_tokens


def test_closed_loop_trace_has_no_send_times() -> None:
    workload = with_overrides(load_workload("chat"), concurrency=4, max_requests=20)
    trace = build_trace(workload, 0)
    assert len(trace.requests) == 20
    assert all(r.at_s is None for r in trace.requests)


def test_rate_override_makes_a_closed_loop_open() -> None:
    workload = with_overrides(load_workload("chat"), concurrency=4)
    assert workload.closed_loop
    assert not with_overrides(workload, rate_rps=3.0).closed_loop


def test_distributions_sample_within_bounds_and_around_the_median() -> None:
    rng = random.Random(0)
    lognormal = LogNormal(200.0, 0.6, 20, 1500)
    values = [lognormal.sample(rng) for _ in range(5000)]
    assert min(values) >= 20
    assert max(values) <= 1500
    assert statistics.median(values) == pytest.approx(200.0, rel=0.1)
    uniform = [Uniform(3, 6).sample(rng) for _ in range(1000)]
    assert set(uniform) == {3, 4, 5, 6}
    assert Fixed(50).sample(rng) == 50


def test_parse_collects_every_error() -> None:
    with pytest.raises(ValueError) as info:
        parse_workload(
            {
                "rate_rps": -1,
                "api": "grpc",
                "colour": "blue",
                "classes": [{"prompt_tokens": {"normal": 3}, "output_tokens": 5}],
            }
        )
    message = str(info.value)
    for fragment in ("rate_rps", "api", "colour", "classes[0].prompt_tokens"):
        assert fragment in message


def test_yaml_file_workload(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "rate_rps: 3\nduration_s: 5\napi: completions\nschedule: [[0, 1], [0.5, 2]]\n"
        "classes:\n  - name: a\n    prompt_tokens: {uniform: [10, 20]}\n    output_tokens: 8\n"
    )
    workload = load_workload(str(path))
    assert workload.name == "mine"
    trace = build_trace(workload, 0)
    assert trace.requests
    request = trace.requests[0]
    assert request.path == "/v1/completions"
    assert 10 <= TOKENIZER.count(request.payload["prompt"]) <= 20


def test_unknown_workload_names_the_presets() -> None:
    with pytest.raises(ValueError, match="shared-prefix"):
        load_workload("nope")


def test_salt_changes_texts_but_not_shape() -> None:
    workload = with_overrides(load_workload("shared-prefix"), duration_s=10.0)
    plain = build_trace(workload, 4)
    salted = build_trace(workload, 4, salt=1)
    shape = [(r.at_s, r.class_name, r.prompt_tokens, r.max_tokens, r.session) for r in plain.requests]
    assert shape == [
        (r.at_s, r.class_name, r.prompt_tokens, r.max_tokens, r.session) for r in salted.requests
    ]
    plain_texts = {m["content"] for r in plain.requests for m in r.payload["messages"]}
    salted_texts = {m["content"] for r in salted.requests for m in r.payload["messages"]}
    assert not plain_texts & salted_texts
