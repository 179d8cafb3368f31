"""One sequence as the engine holds it, and what it knows of its own tokens and blocks.

The scheduler (``engine``) decides when a sequence runs; this module holds what does not depend on
that: the sequence's state, the ids of the text it generates, the length it would stop at by itself,
and the chain of block hashes over its prompt and generated text, extended as vLLM extends it so
generated blocks hash (and announce) as vLLM's do. Kept apart so the scheduler reads as scheduling,
and so a step's result (``StepResult``) can be read without the scheduler. Pure.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.routing.kv_events import KvEvent
from kvgate.routing.prefix_hash import block_hashes
from kvgate.sim.profile import Profile


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One sequence in the engine (a request with ``n > 1`` is ``n`` of these)."""

    request_id: str
    prompt_token_ids: Sequence[int]
    prompt_hashes: Sequence[int]
    max_tokens: int
    target_tokens: int
    arrival_s: float
    handle: Any = None
    kv_transferred: bool = False
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_registered_blocks: int = 0
    blocks: list[int] = field(default_factory=list)
    output_hashes: list[int] = field(default_factory=list)
    """Chained hashes of the blocks generated text filled, after ``prompt_hashes``."""
    num_cached_tokens: int = -1
    """Prompt tokens its first admission found computed (GPU hits, host loads, a transfer); -1 before."""
    num_external_tokens: int = 0
    """Of those, the ones that came from outside the GPU cache (host tier or a prefill instance)."""
    load_done_s: float = 0.0
    """While its prefix loads from the host tier: when the load ends."""
    loading: tuple[int, ...] = ()
    """While its prefix loads from the host tier: the hashes of the blocks that load brings in."""
    prefix_loaded: bool = False
    """Its prefix was just loaded from the host tier into the GPU cache, for its next admission."""
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_reason: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.num_output_tokens

    def hashes(self) -> Sequence[int]:
        """The chained hashes of every full block the sequence has filled so far, prompt then output."""
        if not self.output_hashes:
            return self.prompt_hashes
        return [*self.prompt_hashes, *self.output_hashes]

    def hash_generated_blocks(self, num_blocks: int, block_size: int) -> None:
        """Extend the chain over generated text up to ``num_blocks`` full blocks."""
        hashes = self.output_hashes
        num_prompt_blocks = len(self.prompt_hashes)
        for index in range(num_prompt_blocks + len(hashes), num_blocks):
            tokens = self.block_tokens(index, block_size)
            parent = hashes[-1] if hashes else self.prompt_hashes[-1] if num_prompt_blocks else None
            if parent is None:
                hashes.append(block_hashes(tokens, block_size)[0])
            else:
                hashes.append(hash((parent, tokens)))

    def block_tokens(self, index: int, block_size: int) -> tuple[int, ...]:
        """Block ``index``'s token ids."""
        return self.tokens(index * block_size, (index + 1) * block_size)

    def tokens(self, start: int, stop: int) -> tuple[int, ...]:
        """The ids of tokens ``start .. stop - 1``: its prompt's, then generated ones."""
        prompt = self.prompt_token_ids
        num_prompt = len(prompt)
        if stop <= num_prompt:
            return tuple(prompt[start:stop])
        head = tuple(prompt[start:num_prompt]) if start < num_prompt else ()
        return head + generated_token_ids(max(start, num_prompt) - num_prompt, stop - num_prompt)


@dataclass(frozen=True, slots=True)
class StepResult:
    start_s: float
    duration_s: float
    num_scheduled_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    produced: tuple[EngineRequest, ...]
    """Sequences that produced one token this step; those with ``finish_reason`` set are done."""
    kv_events: tuple[KvEvent, ...] = ()
    """What vLLM would publish for this step (empty unless the engine was given ``BlockDigests``)."""

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


_GENERATED_PERIOD = 997
_GENERATED_IDS = tuple(1000 + n * 7 % _GENERATED_PERIOD for n in range(2 * _GENERATED_PERIOD))
"""Two periods, so any run of up to one period is a single slice."""


def generated_token_id(position: int) -> int:
    """The id of the ``position``-th generated token. The simulator's text is a fixed cycle of words
    that no client turns back into ids; its ids only need to be fixed so generated blocks hash (and
    announce) as vLLM's do."""
    return _GENERATED_IDS[position % _GENERATED_PERIOD]


def generated_token_ids(first: int, stop: int) -> tuple[int, ...]:
    """``generated_token_id`` of positions ``first .. stop - 1``."""
    offset = first % _GENERATED_PERIOD
    if stop - first <= _GENERATED_PERIOD:
        return _GENERATED_IDS[offset : offset + stop - first]
    return tuple(generated_token_id(n) for n in range(first, stop))


def natural_length_tokens(profile: Profile, seed: int, request_id: str) -> int:
    """The length this sequence would stop at by itself: lognormal, drawn from its own seed."""
    rng = random.Random(f"{seed}:{request_id}")
    return max(
        1, round(rng.lognormvariate(math.log(profile.output_len_median_tokens), profile.output_len_sigma))
    )
