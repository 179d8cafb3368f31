"""Replaying a production trace in the Mooncake format: real arrival times and real prefix reuse.

One JSON object a line: ``timestamp`` (ms from the trace's start), ``input_length`` and
``output_length`` (tokens) and ``hash_ids``, one id per 512-token block of the prompt, chained: two
requests that share their first k ids share their first k x 512 prompt tokens. The format is what
Mooncake's traces, NVIDIA Dynamo's router benchmarks and AIPerf's ``mooncake_trace`` use.

Each id is rendered as the same block of text every time (``BlockText``): words that are one token
each under the tokeniser, counted to the block's length, opening with a space and closing with a
full stop, which the tokeniser's pre-split never joins across, so the blocks' tokens concatenate
exactly and requests sharing k ids share exactly k x 512 tokens. A request is a streamed
``/v1/completions`` call with ``ignore_eos`` and ``max_tokens`` the trace's output length, so every
answer is as long as the trace says. ``salt`` changes every text and nothing else, so a second
replay against the same fleet does not hit what the first left cached.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kvgate.admission.tokenizer import Tokenizer
from kvgate.loadtest.prompt_text import WORDS
from kvgate.loadtest.workload import Trace, TraceRequest, Workload

BLOCK_TOKENS = 512
"""Tokens per hash id in the Mooncake format."""


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def block_lengths(self) -> list[int]:
        """Tokens of each of the prompt's blocks: 512 each, the last what is left."""
        count = len(self.hash_ids)
        return [BLOCK_TOKENS] * (count - 1) + [self.input_length - BLOCK_TOKENS * (count - 1)]


def read_mooncake(path: Path) -> list[MooncakeRequest]:
    """The trace's requests in file order; a ``ValueError`` naming the line for a bad one."""
    requests = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            requests.append(_request(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests


def _request(raw: Any) -> MooncakeRequest:
    if not isinstance(raw, dict):
        raise ValueError("want a JSON object")
    timestamp, inputs, outputs, ids = (
        raw.get(k) for k in ("timestamp", "input_length", "output_length", "hash_ids")
    )
    if not isinstance(timestamp, int | float) or timestamp < 0:
        raise ValueError(f"timestamp: want milliseconds >= 0, got {timestamp!r}")
    if not isinstance(inputs, int) or inputs <= 0 or not isinstance(outputs, int) or outputs <= 0:
        raise ValueError(
            f"input_length and output_length: want positive integers, got {inputs!r}, {outputs!r}"
        )
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError("hash_ids: want a list of integers")
    if len(ids) != -(-inputs // BLOCK_TOKENS):
        raise ValueError(
            f"hash_ids: {inputs} tokens make {-(-inputs // BLOCK_TOKENS)} blocks, got {len(ids)} ids"
        )
    return MooncakeRequest(float(timestamp), inputs, outputs, tuple(ids))


def window(
    requests: Sequence[MooncakeRequest], start_s: float, window_s: float | None
) -> list[MooncakeRequest]:
    """The requests arriving in ``[start_s, start_s + window_s)`` of the trace's own time."""
    end_s = float("inf") if window_s is None else start_s + window_s
    return [r for r in requests if start_s <= r.timestamp_ms / 1000.0 < end_s]


class BlockText:
    """The text of each (hash id, length) block: the same every time, exactly ``length`` tokens."""

    def __init__(self, tokenizer: Tokenizer, salt: int = 0) -> None:
        self._tokenizer = tokenizer
        self._salt = salt
        self._cache: dict[tuple[int, int], str] = {}

    def text(self, hash_id: int, length_tokens: int) -> str:
        key = (hash_id, length_tokens)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._render(hash_id, length_tokens)
        return cached

    def _render(self, hash_id: int, length_tokens: int) -> str:
        rng = random.Random((self._salt << 64) ^ (hash_id << 20) ^ length_tokens)
        words = [rng.choice(WORDS) for _ in range(max(0, length_tokens - 1))]
        text = " " + " ".join(words) + "."
        count = self._tokenizer.count(text)
        while count != length_tokens:
            if count > length_tokens and words:
                words.pop()
            else:
                words.append(rng.choice(WORDS))
            text = " " + " ".join(words) + "."
            count = self._tokenizer.count(text)
        return text

    def prompt(self, request: MooncakeRequest) -> str:
        return "".join(
            self.text(h, n) for h, n in zip(request.hash_ids, request.block_lengths(), strict=True)
        )


def mooncake_trace(
    requests: Sequence[MooncakeRequest],
    workload: Workload,
    blocks: BlockText,
    *,
    speed: float = 1.0,
    seed: int = 0,
) -> Trace:
    """The replay as a ``Trace``: send offsets from the first request's timestamp, divided by
    ``speed``; each request's prompt rendered by ``blocks``."""
    if speed <= 0:
        raise ValueError(f"speed: want > 0, got {speed}")
    if not requests:
        raise ValueError("no requests in the window")
    first_ms = requests[0].timestamp_ms
    out: list[TraceRequest] = []
    for index, request in enumerate(requests):
        payload: dict[str, Any] = {
            "prompt": blocks.prompt(request),
            "max_tokens": request.output_length,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        out.append(
            TraceRequest(
                index=index,
                class_name=_class_name(request),
                at_s=(request.timestamp_ms - first_ms) / 1000.0 / speed,
                api="completions",
                prompt_tokens=request.input_length,
                max_tokens=request.output_length,
                payload=payload,
            )
        )
    duration_s = (requests[-1].timestamp_ms - first_ms) / 1000.0 / speed
    return Trace(workload=workload, seed=seed, requests=tuple(out), duration_s=duration_s, salt=0)


def _class_name(request: MooncakeRequest) -> str:
    """Requests grouped by prompt length, for the report's per-class table."""
    if request.input_length < 4096:
        return "short"
    if request.input_length < 32768:
        return "medium"
    return "long"


def total_tokens(requests: Iterable[MooncakeRequest]) -> int:
    return sum(r.input_length for r in requests)
