"""Which tokeniser and chat template count a model's prompts, and the count of one request body.

Both come from the model's entry in the top-level ``models[]`` (the one home of model facts). The
configured kind picks an implementation of the ``Tokenizer`` seam; nothing is fetched at run
time (a named tiktoken encoding comes from an installed package, files are local). The replica's
own ``/tokenize`` is exact but is a network round trip, so it lives at the edge: for that kind
``tokenizer_for`` returns None and the edge asks the replica; when no replica can count, the
request is answered 503 (``no_replica``), never priced by a guess. Encoding a large prompt is CPU
work; the edge counts it off its event loop, in pieces it can stop (``kvgate.admission.encode_job``).

A prompt over the model's context is refused whatever its exact count, so what refusing it costs is
bounded by the context, not by the body (``bounded_runs``): a lower bound taken slice by slice stops
as soon as it reaches the limit, and BPE runs on pieces of at most ``STRETCH_CHARS`` characters where
the text has no exact cut (one unbroken megabyte of letters is one pre-tokeniser piece, and BPE on a
piece costs more than linear time: 5 s for 1 MiB against 0.15 s for the 128k tokens that decide).
A count through such a cut may exceed the whole text's by a token or two per cut (measured at most 2
on random letters, digits and CJK), so it only decides a refusal with ``OVERCOUNT_PER_CUT_TOKENS``
to spare per cut; a text it does not refuse is counted again exactly, at most a context's worth.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from kvgate.admission.tokenizer import (
    RUN_CHARS,
    BytesEstimateTokenizer,
    ChatTemplate,
    HuggingFaceTokenizer,
    JinjaChatTemplate,
    TiktokenTokenizer,
    Tokenizer,
    prompt_text,
)
from kvgate.config.models import ChatTemplate as ChatTemplateConfig
from kvgate.config.models import TokenizerConfig

BOUND_SLICE_CHARS = 64 * 1024
"""The lower bound is summed over slices this long, each cut costing it one token (a token may
straddle the cut), so a scan stops within one slice of the limit instead of reading the whole body."""
STRETCH_CHARS = 4 * 1024
"""The most characters encoded at once where a text cannot be cut exactly: BPE of a 4 KiB piece of
letters costs about 0.6 s per MB of it, of a 1 MiB piece about 5 s."""
OVERCOUNT_PER_CUT_TOKENS = 8
"""What one inexact cut may add to a count, with room: measured at most 2."""
UTF8_MAX_BYTES_PER_CHAR = 4
_EXACT_CUT = re.compile(r"(?<=\S) ")
"""Where a tiktoken pre-tokeniser always starts a new piece (``TiktokenTokenizer.encode_runs``)."""


def tokenizer_for(config: TokenizerConfig) -> Tokenizer | None:
    """The configured tokeniser; None for kind 'replica' (counted by the replica's /tokenize)."""
    if config.kind == "tiktoken":
        return TiktokenTokenizer.from_name(config.encoding)
    if config.kind == "tiktoken_file":
        return TiktokenTokenizer.from_bpe_file(config.path)
    if config.kind == "huggingface":
        return HuggingFaceTokenizer.from_file(config.path)
    if config.kind == "bytes":
        return BytesEstimateTokenizer(config.bytes_per_token)
    return None


def template_for(config: ChatTemplateConfig) -> ChatTemplate:
    """The model's own Jinja template when the config names its file, otherwise the framing given."""
    if config.file is not None:
        return JinjaChatTemplate.from_file(config.file)
    return ChatTemplate(config.message_prefix, config.message_suffix, config.generation_prompt, config.bos)


def prompt_of(body: Mapping[str, Any], template: ChatTemplate) -> str | list[int]:
    """What to tokenise in a request body: a chat's ``messages`` after the template, a completions
    ``prompt`` as text, or the token ids a completions client sent itself (counted as they are).
    A batch of prompts (``batch_of``) is counted one prompt at a time, each given as its own body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        # ``type(m) is dict`` first: a parsed body's messages are dicts, and asking the ``Mapping``
        # ABC costs a Python-level ``__instancecheck__`` per message.
        return template.render([m for m in messages if type(m) is dict or isinstance(m, Mapping)])
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return [t for p in prompt for t in p if isinstance(t, int)]
    return prompt_text(prompt)


def batch_of(body: Mapping[str, Any]) -> list[str] | list[list[int]] | None:
    """The prompts of a completions batch (a list of two or more strings, or of token-id lists), or
    None for a request with one prompt. vLLM runs each prompt of a batch as its own request (with its
    own ``n`` sequences), so each is counted and priced on its own."""
    if "messages" in body:
        return None
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or len(prompt) < 2:
        return None
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        return [[t for t in p if isinstance(t, int)] for p in prompt]
    return None


Run = tuple[list[int], bool]
"""A run of ``bounded_runs``: ids, and whether they were encoded (False: zeros standing for the
tokens of a text known to be over the limit without all of them encoded, as many as a lower bound
or as a count through inexact cuts less its margin)."""


def bounded_runs(
    tokenizer: Tokenizer,
    text: str,
    limit_tokens: int,
    run_chars: int = RUN_CHARS,
    stretch_chars: int = STRETCH_CHARS,
) -> Iterator[Run]:
    """``text``'s ids in runs, for a caller that stops once their count reaches ``limit_tokens``: each
    run exactly the next ids of the whole text, while the text is under the limit. A text that is over
    it may end in a stand-in run (``Run``) that brings the count to at least ``limit_tokens``; it may
    yield empty runs meanwhile, so that the caller can stop between pieces of work. Only tiktoken's
    pieces can be cut exactly; other tokenisers count as ``Tokenizer.encode_runs`` does, after their
    whole text's lower bound."""
    if len(text) * UTF8_MAX_BYTES_PER_CHAR < limit_tokens:
        yield from _encoded(tokenizer.encode_runs(text, run_chars))
        return
    if not isinstance(tokenizer, TiktokenTokenizer):
        at_least = tokenizer.min_tokens(text)
        if at_least >= limit_tokens:
            yield [0] * at_least, False
            return
        yield from _encoded(tokenizer.encode_runs(text, run_chars))
        return
    at_least = 0
    for start in range(0, len(text), BOUND_SLICE_CHARS):
        at_least += tokenizer.min_tokens(text[start : start + BOUND_SLICE_CHARS]) - (start > 0)
        if at_least >= limit_tokens:
            yield [0] * at_least, False
            return
        yield [], True
    yielded = 0
    counted = 0
    exact_end = 0
    over_count_tokens = 0
    for start, end, exact in _slices(text, run_chars, stretch_chars):
        run = tokenizer.encode(text[start:end])
        counted += len(run)
        if exact and not over_count_tokens:
            exact_end = end
            yielded = counted
            yield run, True
            if counted >= limit_tokens:
                return
            continue
        over_count_tokens += OVERCOUNT_PER_CUT_TOKENS
        if counted - over_count_tokens >= limit_tokens:
            yield [0] * (counted - over_count_tokens - yielded), False
            return
        yield [], True
    yield from _encoded(tokenizer.encode_runs(text[exact_end:], run_chars))


def _encoded(runs: Iterator[list[int]]) -> Iterator[Run]:
    for run in runs:
        yield run, True


def _slices(text: str, run_chars: int, stretch_chars: int) -> Iterator[tuple[int, int, bool]]:
    """``text`` cut into (start, end, exact) slices: at the first exact cut after ``run_chars``, or
    the last before it, and where there is none within ``run_chars``, ``stretch_chars`` long with an
    inexact cut."""
    start = 0
    while start < len(text):
        if len(text) - start <= run_chars:
            yield start, len(text), True
            return
        cut = _EXACT_CUT.search(text, start + run_chars, start + run_chars + stretch_chars)
        end = cut.start() if cut is not None else _last_exact_cut(text, start, start + run_chars)
        if end > start:
            yield start, end, True
        else:
            end = start + stretch_chars
            yield start, end, end >= len(text)
        start = end


def _last_exact_cut(text: str, start: int, end: int, tries: int = 8) -> int:
    """The last exact cut after ``start`` and before ``end``, or ``start`` when there is none among
    the last ``tries`` spaces (a long run of whitespace is not walked back space by space)."""
    for _ in range(tries):
        space = text.rfind(" ", start + 1, end)
        if space < 0:
            return start
        if not text[space - 1].isspace():
            return space
        end = space
    return start
