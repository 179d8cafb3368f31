"""Production-shaped traces in the Mooncake format, each a way real traffic reuses prompts.

A router that wins on one trace only is not done, so routing is judged on several shapes, each
seeded and written as Mooncake JSONL (``kvgate.loadtest.mooncake``) so that every benchmark and
``kvgate loadtest --trace`` replay them the same way:

- ``chat-fleet``: every request opens with the same fleet-wide system prompt; a share of the
  requests continue an earlier conversation minutes after its last turn (its whole history, then a
  new message), the rest start one with a pasted text; prompts are long-tailed (a median of a few
  thousand tokens, a mean about twice that, up to the context).
- ``rag``: a system prompt, then the documents retrieved for the question (one to three of a
  library, the most relevant first, popular documents far more often), then the question: users
  share documents, not conversations.
- ``agent``: agents loop over tool calls, a turn every few seconds, each turn appending a tool's
  output and the model's next step to a prompt that grows to tens of thousands of tokens; every
  agent shares the tools' system prompt.

Blocks are 512 tokens; a block's id is shared only where the tokens before it and in it are (a
conversation's next turn shares its previous prompt's full blocks, not the last partial one).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvgate.loadtest.mooncake import BLOCK_TOKENS, MooncakeRequest

MAX_PROMPT_TOKENS = 120_000


def lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


class Blocks:
    """Hands out block ids: the blocks of a token stream, new ids for the tokens past its full blocks."""

    def __init__(self) -> None:
        self._ids = itertools.count()

    def fresh(self, count: int) -> list[int]:
        return [next(self._ids) for _ in range(count)]


@dataclass(slots=True)
class _Stream:
    """A prompt being built: its full blocks' ids and how many tokens sit past them."""

    ids: list[int]
    tail_tokens: int

    @property
    def tokens(self) -> int:
        return BLOCK_TOKENS * len(self.ids) + self.tail_tokens

    def extended(self, tokens: int, blocks: Blocks) -> _Stream:
        """The stream with ``tokens`` more: the partial block and what follows get new ids."""
        total = self.tail_tokens + tokens
        return _Stream([*self.ids, *blocks.fresh(total // BLOCK_TOKENS)], total % BLOCK_TOKENS)

    def request(self, at_ms: float, output_tokens: int, blocks: Blocks) -> MooncakeRequest:
        ids = list(self.ids)
        if self.tail_tokens:
            ids += blocks.fresh(1)
        return MooncakeRequest(at_ms, self.tokens, output_tokens, tuple(ids))


def _arrivals(rng: random.Random, rate_per_s: float, duration_s: float) -> Iterator[float]:
    at_s = rng.expovariate(rate_per_s)
    while at_s < duration_s:
        yield at_s
        at_s += rng.expovariate(rate_per_s)


def chat_fleet(
    rate_per_s: float, duration_s: float, seed: int, continuing: float = 0.39
) -> list[MooncakeRequest]:
    """New conversations arrive at ``(1 - continuing) * rate``; each comes back for another turn
    with a probability that makes ``continuing`` of all requests continuations, minutes later. The
    fleet has been serving for ``WARM_S`` before the trace starts, so conversations begun then come
    back inside it, as in any window cut from production."""
    everything = _chat_fleet(rate_per_s, duration_s + WARM_S, seed, continuing)
    return [
        MooncakeRequest(r.timestamp_ms - WARM_S * 1000.0, r.input_length, r.output_length, r.hash_ids)
        for r in everything
        if r.timestamp_ms >= WARM_S * 1000.0
    ]


WARM_S = 900.0
"""How long the chat fleet has served before a trace starts: several conversations' returns."""


def _chat_fleet(rate_per_s: float, duration_s: float, seed: int, continuing: float) -> list[MooncakeRequest]:
    rng = random.Random(f"chat-fleet:{seed}")
    blocks = Blocks()
    system = _Stream(blocks.fresh(4), 0)
    returns = continuing / (1.0 - continuing) if continuing < 1 else 0.0
    again = returns / (1.0 + returns)
    pending: list[tuple[float, int, _Stream]] = []
    order = itertools.count()
    out: list[MooncakeRequest] = []
    for at_s in _arrivals(rng, rate_per_s * (1.0 - continuing), duration_s):
        while pending and pending[0][0] <= at_s:
            turn_s, _, stream = heapq.heappop(pending)
            out.append(_turn(rng, blocks, stream, turn_s, again, pending, order, duration_s))
        pasted = lognormal(rng, 5_000, 1.1, 50, MAX_PROMPT_TOKENS // 2)
        stream = system.extended(pasted, blocks)
        out.append(_turn(rng, blocks, stream, at_s, again, pending, order, duration_s))
    while pending:
        turn_s, _, stream = heapq.heappop(pending)
        out.append(_turn(rng, blocks, stream, turn_s, again, pending, order, duration_s))
    return sorted(out, key=lambda r: r.timestamp_ms)


def _turn(
    rng: random.Random,
    blocks: Blocks,
    stream: _Stream,
    at_s: float,
    again: float,
    pending: list[tuple[float, int, _Stream]],
    order: Iterator[int],
    duration_s: float,
) -> MooncakeRequest:
    output = lognormal(rng, 250, 0.8, 10, 2_000)
    request = stream.request(at_s * 1000.0, output, blocks)
    if rng.random() < again:
        history = stream.extended(output + lognormal(rng, 300, 0.9, 10, 4_000), blocks)
        back_s = at_s + lognormal(rng, 120, 0.7, 20, 900)
        if back_s < duration_s and history.tokens < MAX_PROMPT_TOKENS:
            heapq.heappush(pending, (back_s, next(order), history))
    return request


def rag(rate_per_s: float, duration_s: float, seed: int, library: int = 400) -> list[MooncakeRequest]:
    rng = random.Random(f"rag:{seed}")
    blocks = Blocks()
    system = _Stream(blocks.fresh(2), 0)
    sizes = [lognormal(rng, 3_000, 0.5, 600, 12_000) for _ in range(library)]
    popularity = [1.0 / (rank + 1) ** 1.1 for rank in range(library)]
    prefixes: dict[tuple[int, ...], _Stream] = {(): system}
    out = []
    for at_s in _arrivals(rng, rate_per_s, duration_s):
        documents = rng.choices(range(library), popularity, k=rng.choice((1, 2, 2, 3)))
        key: tuple[int, ...] = ()
        stream = system
        for document in dict.fromkeys(documents):
            key = (*key, document)
            known = prefixes.get(key)
            if known is None:
                known = prefixes[key] = stream.extended(sizes[document], blocks)
            stream = known
        question = stream.extended(lognormal(rng, 80, 0.6, 10, 600), blocks)
        out.append(question.request(at_s * 1000.0, lognormal(rng, 300, 0.6, 20, 1_500), blocks))
    return out


def agent(rate_per_s: float, duration_s: float, seed: int) -> list[MooncakeRequest]:
    """Agents start at a rate that makes ``rate_per_s`` requests per second with their turns."""
    rng = random.Random(f"agent:{seed}")
    blocks = Blocks()
    tools = _Stream(blocks.fresh(8), 0)
    mean_turns = 14
    out = []
    for start_s in _arrivals(rng, rate_per_s / mean_turns, duration_s):
        stream = tools.extended(lognormal(rng, 400, 0.6, 50, 3_000), blocks)
        at_s = start_s
        for _ in range(rng.randint(6, 2 * mean_turns - 6)):
            if at_s >= duration_s or stream.tokens >= MAX_PROMPT_TOKENS:
                break
            output = lognormal(rng, 150, 0.6, 10, 1_000)
            out.append(stream.request(at_s * 1000.0, output, blocks))
            tool_output = lognormal(rng, 1_200, 0.8, 20, 8_000)
            stream = stream.extended(output + tool_output, blocks)
            at_s += output / 60.0 + lognormal(rng, 2.0, 0.7, 0, 30)
    return sorted(out, key=lambda r: r.timestamp_ms)


SHAPES: dict[str, Callable[[float, float, int], list[MooncakeRequest]]] = {
    "chat-fleet": chat_fleet,
    "rag": rag,
    "agent": agent,
}
"""Each shape by name: ``shape(rate_per_s, duration_s, seed)``."""
