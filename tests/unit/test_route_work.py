"""Each served route's body, read into the chat or completion shape pricing counts."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.admission.cost import InvalidRequest
from kvgate.admission.route_work import MAX_PAIR_CHARS, Work, WorkView, work_view


@pytest.mark.parametrize(
    ("work", "body", "want"),
    [
        (Work.RESPONSES, {"input": "hi", "max_output_tokens": 8},
         WorkView({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}, True)),
        (Work.RESPONSES, {"instructions": "be brief", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]},
         WorkView({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}],
                   "max_completion_tokens": None}, True)),
        (Work.EMBEDDING, {"input": "one"}, WorkView({"prompt": "one"}, False)),
        (Work.EMBEDDING, {"input": ["a", "b"]}, WorkView({"prompt": ["a", "b"]}, False)),
        (Work.EMBEDDING, {"input": [1, 2, 3]}, WorkView({"prompt": [1, 2, 3]}, False)),
        (Work.EMBEDDING, {"messages": [{"role": "user", "content": "x"}]},
         WorkView({"messages": [{"role": "user", "content": "x"}]}, True)),
        (Work.SCORE, {"text_1": "q", "text_2": ["a", "b"]}, WorkView({"prompt": ["qa", "qb"]}, False)),
        (Work.SCORE, {"text_1": ["q", "r"], "text_2": ["a", "b"]}, WorkView({"prompt": ["qa", "rb"]}, False)),
        (Work.RERANK, {"query": "q", "documents": ["a", {"text": "b"}]},
         WorkView({"prompt": ["qa", "qb"]}, False)),
        (Work.RERANK, {"query": "q", "documents": ["a"]}, WorkView({"prompt": "qa"}, False)),
        (Work.TOKENS, {"prompt": "anything"}, WorkView({"prompt": ""}, False)),
    ],
)  # fmt: skip
def test_each_route_reads_into_a_shape_pricing_counts(
    work: Work, body: dict[str, Any], want: WorkView
) -> None:
    assert work_view(work, body) == want


@pytest.mark.parametrize(
    ("work", "body", "param"),
    [
        (Work.RESPONSES, {"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        (Work.RESPONSES, {"input": "x", "max_output_tokens": True}, "max_output_tokens"),
        (Work.RESPONSES, {}, "input"),
        (Work.EMBEDDING, {}, "input"),
        (Work.EMBEDDING, {"input": [1, "a"]}, "input"),
        (Work.SCORE, {"text_2": ["a"]}, "text_1"),
        (Work.SCORE, {"text_1": ["q", "r"], "text_2": ["a", "b", "c"]}, "text_1"),
        (Work.RERANK, {"query": "q"}, "documents"),
    ],
)
def test_an_unreadable_body_names_its_field(work: Work, body: dict[str, Any], param: str) -> None:
    refused = work_view(work, body)
    assert isinstance(refused, InvalidRequest) and refused.param == param


def test_only_generation_decodes_and_only_tokens_count_no_prompt() -> None:
    assert {w for w in Work if w.decodes} == {Work.CHAT, Work.COMPLETION, Work.RESPONSES}
    assert {w for w in Work if not w.counts_prompt} == {Work.TOKENS}


def test_a_long_query_over_many_documents_is_refused_before_its_pairs_are_built() -> None:
    query = "q" * (1024 * 1024)
    refused = work_view(Work.RERANK, {"query": query, "documents": ["d"] * 64})
    assert isinstance(refused, InvalidRequest) and refused.param == "documents"
    assert str(MAX_PAIR_CHARS) in refused.message
    fits = work_view(Work.RERANK, {"query": query, "documents": ["d"] * 8})
    assert isinstance(fits, WorkView) and len(fits.body["prompt"]) == 8
