"""One replica's scheduler, stepped by an injected clock: vLLM v1's continuous batching.

Each ``step(now_s)`` schedules one batch and returns how long it takes and which sequences
produced a token. Running sequences go first (a decode costs one token, an unfinished prefill
continues in chunks), then waiting ones in arrival order while ``max_num_seqs`` and
``max_num_batched_tokens`` allow. KV blocks are allocated only for the tokens scheduled now, so the
cache is over-committed; when a running sequence cannot get a block, the last running sequence is
preempted by recompute (its blocks freed, back to the front of the queue) and nothing new is
admitted in that step. A sequence leaving the queue first reuses its longest cached prompt prefix;
one whose prompt KV was transferred from a prefill instance (disaggregated serving) takes blocks
for the rest of its prompt as already computed, so only its last prompt token is run, as vLLM's
decode instance does once a connector has loaded the remote KV. A preempted sequence has lost that
KV and prefills itself.
The engine does no I/O and reads no clock: the same inputs always give the same steps, which is
what lets tests and discrete-event replays drive it synchronously.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.routing.prefix_hash import block_hashes
from kvgate.sim.kv_cache import BlockPool
from kvgate.sim.profile import Profile, step_duration_s
from kvgate.sim.stats import EngineStats


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


@dataclass(frozen=True, slots=True)
class StepResult:
    start_s: float
    duration_s: float
    num_scheduled_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    produced: tuple[EngineRequest, ...]
    """Sequences that produced one token this step; those with ``finish_reason`` set are done."""

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def natural_length_tokens(profile: Profile, seed: int, request_id: str) -> int:
    """The length this sequence would stop at by itself: lognormal, drawn from its own seed."""
    rng = random.Random(f"{seed}:{request_id}")
    return max(
        1, round(rng.lognormvariate(math.log(profile.output_len_median_tokens), profile.output_len_sigma))
    )


class Engine:
    def __init__(self, profile: Profile, seed: int = 0, ready_s: float = 0.0) -> None:
        self.profile = profile
        self.seed = seed
        self.ready_s = ready_s
        self.pool = BlockPool(profile.num_gpu_blocks)
        self.stats = EngineStats()
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage_ratio(self) -> float:
        return self.pool.usage_ratio

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        arrival_s: float,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        prompt_hashes: Sequence[int] | None = None,
        handle: Any = None,
        kv_transferred: bool = False,
    ) -> EngineRequest:
        """Queue one sequence; ``kv_transferred``: its prompt KV arrives from a prefill instance."""
        if ignore_eos:
            target = max_tokens
        else:
            natural = natural_length_tokens(self.profile, self.seed, request_id)
            target = min(max_tokens, max(natural, min_tokens))
        hashes = (
            prompt_hashes
            if prompt_hashes is not None
            else block_hashes(prompt_token_ids, self.profile.block_size_tokens)
        )
        request = EngineRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            prompt_hashes=hashes,
            max_tokens=max_tokens,
            target_tokens=max(1, target),
            arrival_s=arrival_s,
            handle=handle,
            kv_transferred=kv_transferred,
        )
        self._waiting.append(request)
        return request

    def abort(self, request: EngineRequest) -> None:
        """Drop a sequence whose client went away; no-op if it already finished."""
        if request.finish_reason is not None:
            return
        if request in self._waiting:
            self._waiting.remove(request)
        else:
            self._running.remove(request)
            self.pool.free(request.blocks)
            request.blocks = []
        request.finish_reason = "abort"
        self.stats.request_success["abort"] += 1

    def abort_all(self) -> None:
        for request in [*self._running, *self._waiting]:
            self.abort(request)

    def step(self, now_s: float) -> StepResult:
        """Schedule and run one batch starting at ``now_s``; the engine's state moves to its end."""
        profile = self.profile
        block_size = profile.block_size_tokens
        budget = profile.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int]] = []
        preempted = False

        index = 0
        while index < len(self._running) and budget > 0:
            request = self._running[index]
            computed = request.num_computed_tokens
            num_new = len(request.prompt_token_ids) + request.num_output_tokens - computed
            if num_new > budget:
                num_new = budget
            fits = computed + num_new <= len(request.blocks) * block_size
            if not fits and not self._grow(request, computed + num_new):
                preempted = True
                while True:
                    victim = self._running.pop()
                    self._preempt(victim)
                    if victim is request or self._grow(request, request.num_computed_tokens + num_new):
                        break
                if victim is request:
                    break
            scheduled.append((request, num_new))
            budget -= num_new
            index += 1

        while not preempted and self._waiting and budget > 0 and len(self._running) < profile.max_num_seqs:
            request = self._waiting[0]
            max_hit_blocks = (request.num_tokens - 1) // block_size
            hits = self.pool.cached_prefix(request.prompt_hashes[:max_hit_blocks])
            num_cached = len(hits) * block_size
            num_done = request.num_tokens - 1 if request.kv_transferred else num_cached
            num_new = min(request.num_tokens - num_done, budget)
            self.pool.touch(hits)
            fresh = self.pool.allocate(-(-(num_done + num_new) // block_size) - len(hits))
            if fresh is None:
                self.pool.free(hits)
                break
            self._waiting.popleft()
            request.blocks = hits + fresh
            request.num_computed_tokens = num_done
            request.kv_transferred = False
            request.num_registered_blocks = len(hits)
            self.stats.prefix_cache_queries_tokens += request.num_tokens
            self.stats.prefix_cache_hits_tokens += num_cached
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
                self.stats.first_schedule_queries_tokens += request.num_tokens
                self.stats.first_schedule_hits_tokens += num_cached
                self.stats.queue_s.observe(now_s - request.arrival_s)
            self._running.append(request)
            scheduled.append((request, num_new))
            budget -= num_new

        return self._finish_step(now_s, scheduled)

    def _finish_step(self, now_s: float, scheduled: list[tuple[EngineRequest, int]]) -> StepResult:
        profile = self.profile
        stats = self.stats
        tokens = 0
        attention_ctx = 0.0
        kv_read = 0
        num_decode = 0
        for request, num_new in scheduled:
            tokens += num_new
            attention_ctx += num_new * (request.num_computed_tokens + num_new / 2)
            kv_read += request.num_computed_tokens + num_new
            if num_new == 1 and request.num_output_tokens > 0:
                num_decode += 1
        duration = 0.0
        if scheduled:
            duration = step_duration_s(profile, tokens, attention_ctx, kv_read, len(scheduled))
        if profile.warmup_s > 0 and now_s - self.ready_s < profile.warmup_s:
            duration *= 1 + (profile.warmup_factor - 1) * (1 - (now_s - self.ready_s) / profile.warmup_s)
        end_s = now_s + duration

        produced: list[EngineRequest] = []
        any_finished = False
        steady_decodes = 0
        for request, num_new in scheduled:
            request.num_computed_tokens += num_new
            if request.num_registered_blocks < len(request.prompt_hashes):
                self._register_full_blocks(request)
            if request.num_computed_tokens < len(request.prompt_token_ids) + request.num_output_tokens:
                continue
            request.num_output_tokens += 1
            if request.first_token_s is None:
                request.first_token_s = end_s
                stats.prompt_tokens += request.num_prompt_tokens
                stats.ttft_s.observe(end_s - request.arrival_s)
            elif request.last_token_s == now_s:
                steady_decodes += 1
            else:
                stats.itl_s.observe(end_s - (request.last_token_s or end_s))
            request.last_token_s = end_s
            if request.num_output_tokens >= request.target_tokens:
                request.finish_reason = (
                    "length" if request.num_output_tokens >= request.max_tokens else "stop"
                )
                stats.request_success[request.finish_reason] += 1
                stats.e2e_s.observe(end_s - request.arrival_s)
                self.pool.free(request.blocks)
                request.blocks = []
                any_finished = True
            produced.append(request)
        stats.generation_tokens += len(produced)
        if steady_decodes:
            stats.itl_s.observe(duration, steady_decodes)
        if any_finished:
            self._running = [r for r in self._running if r.finish_reason is None]
        if scheduled:
            stats.num_steps += 1
            stats.busy_s += duration
        return StepResult(
            start_s=now_s,
            duration_s=duration,
            num_scheduled_tokens=tokens,
            num_prefill_seqs=len(scheduled) - num_decode,
            num_decode_seqs=num_decode,
            produced=tuple(produced),
        )

    def _grow(self, request: EngineRequest, num_tokens: int) -> bool:
        needed = -(-num_tokens // self.profile.block_size_tokens) - len(request.blocks)
        if needed <= 0:
            return True
        fresh = self.pool.allocate(needed)
        if fresh is None:
            return False
        request.blocks.extend(fresh)
        return True

    def _preempt(self, request: EngineRequest) -> None:
        self.pool.free(request.blocks)
        request.blocks = []
        request.num_computed_tokens = 0
        request.num_registered_blocks = 0
        self.stats.num_preemptions += 1
        self._waiting.appendleft(request)

    def _register_full_blocks(self, request: EngineRequest) -> None:
        block_size = self.profile.block_size_tokens
        hashes = request.prompt_hashes
        registered = request.num_registered_blocks
        while registered < len(hashes) and (registered + 1) * block_size <= request.num_computed_tokens:
            self.pool.register(request.blocks[registered], hashes[registered])
            registered += 1
        request.num_registered_blocks = registered
