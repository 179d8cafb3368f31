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

Blocks are cached as vLLM caches them: when the step that fills them is scheduled, prompt and
generated blocks alike, so a request admitted later in the same step already finds them. With a
host tier (``cpu_offload_tokens``, vLLM's native KV offloading) every cached block is also copied to
host memory; a prefix found only there is loaded back over the host link (``cpu_offload_bytes_per_s``,
one load at a time) while the request waits, its GPU blocks held, and other requests run; once
loaded it is computed from there, as vLLM's offloading connector does. Given ``BlockDigests``, the
engine also records the KV cache events vLLM would publish (``CacheEventLog``), step by step. A
sequence's own state and block chain live in ``sequence``, the host link's loads in ``host_loads``.
The engine does no I/O and reads no clock: the same inputs always give the same steps, which is
what lets tests and discrete-event replays drive it synchronously.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

from kvgate.routing.prefix_hash import block_hashes
from kvgate.sim.cache_events import CacheEventLog
from kvgate.sim.host_loads import HostLoads
from kvgate.sim.host_tier import HostTier
from kvgate.sim.kv_cache import BlockPool
from kvgate.sim.profile import Profile, step_duration_s
from kvgate.sim.sequence import EngineRequest, StepResult, natural_length_tokens
from kvgate.sim.stats import EngineStats
from kvgate.sim.vllm_block_hash import BlockDigests

__all__ = ["Engine", "EngineRequest", "StepResult"]


_LOADING = -1
_SKIPPED = -2
"""What ``Engine._admit`` answers, besides the tokens a request runs, when it runs none yet."""


class Engine:
    def __init__(
        self, profile: Profile, seed: int = 0, ready_s: float = 0.0, digests: BlockDigests | None = None
    ) -> None:
        """``digests``: record vLLM's KV cache events (``StepResult.kv_events``), hashed with them."""
        self.profile = profile
        self.seed = seed
        self.ready_s = ready_s
        self.pool = BlockPool(profile.num_gpu_blocks, track_evictions=digests is not None)
        self.host = HostTier(profile.num_cpu_blocks) if profile.num_cpu_blocks > 0 else None
        self.events = (
            CacheEventLog(profile.block_size_tokens, profile.num_gpu_blocks, digests)
            if digests is not None
            else None
        )
        self.stats = EngineStats()
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._loads = HostLoads(profile.kv_bytes_per_token, profile.cpu_offload_bytes_per_s)
        """Admitted requests whose prefix is loading from the host tier."""

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Queued requests, those loading their prefix from the host tier included (as vLLM counts)."""
        return len(self._waiting) + len(self._loads)

    @property
    def kv_cache_usage_ratio(self) -> float:
        return self.pool.usage_ratio

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._loads)

    @property
    def next_load_done_s(self) -> float | None:
        """When the first pending host-tier load ends: a step before then may have nothing to run."""
        return self._loads.next_done_s

    def reset_prefix_cache(self) -> bool:
        """Forget the GPU prefix cache, as vLLM's ``/reset_prefix_cache``: refused (False) while a
        request holds blocks; the host tier is kept, as vLLM keeps its connector's unless asked."""
        if not self.pool.reset():
            return False
        if self.events is not None:
            self.events.cleared()
        return True

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
        elif request in self._loads:
            self._loads.cancel(request)
        else:
            self._running.remove(request)
        if request.blocks:
            self.pool.free(request.blocks)
            request.blocks = []
        request.finish_reason = "abort"
        self.stats.request_success["abort"] += 1

    def abort_all(self) -> None:
        for request in [*self._running, *self._waiting, *self._loads]:
            self.abort(request)

    def step(self, now_s: float) -> StepResult:
        """Schedule and run one batch starting at ``now_s``; the engine's state moves to its end.

        A step that schedules nothing while ``has_work`` is waiting on a host-tier load: the caller
        steps again at ``next_load_done_s`` (or sooner, when a request arrives), else that request
        is never run."""
        profile = self.profile
        block_size = profile.block_size_tokens
        budget = profile.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int]] = []
        skipped: list[EngineRequest] = []
        preempted = False
        load_done_s = self._loads.next_done_s
        if load_done_s is not None and load_done_s <= now_s:
            self._finish_loads(now_s)

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
            if (request.num_registered_blocks + 1) * block_size <= computed + num_new:
                self._cache_full_blocks(request, computed + num_new)
            scheduled.append((request, num_new))
            budget -= num_new
            index += 1

        while not preempted and self._waiting and budget > 0 and len(self._running) < profile.max_num_seqs:
            request = self._waiting[0]
            admitted = self._admit(request, now_s, budget)
            if admitted is None:
                break
            self._waiting.popleft()
            if admitted == _LOADING:
                continue
            if admitted == _SKIPPED:
                skipped.append(request)
                continue
            num_new = admitted
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
                self.stats.queue_s.observe(now_s - request.arrival_s)
            computed = request.num_computed_tokens
            if (request.num_registered_blocks + 1) * block_size <= computed + num_new:
                self._cache_full_blocks(request, computed + num_new)
            self._running.append(request)
            scheduled.append((request, num_new))
            budget -= num_new
        self._waiting.extendleft(reversed(skipped))

        return self._finish_step(now_s, scheduled)

    def _admit(self, request: EngineRequest, now_s: float, budget: int) -> int | None:
        """Look a queued request's prefix up and give it blocks: the tokens it runs this step,
        ``_LOADING`` if it first loads its prefix from the host tier, ``_SKIPPED`` if part of that prefix
        is being loaded for another request (vLLM loads a block once; this one waits for that load and
        lets those behind it go first), ``None`` if the blocks are not there (it and all behind wait)."""
        block_size = self.profile.block_size_tokens
        hashes = request.hashes()
        max_hit_blocks = (request.num_tokens - 1) // block_size
        hits = self.pool.cached_prefix(hashes[:max_hit_blocks])
        num_cached = len(hits) * block_size
        host_blocks = 0
        if self.host is not None and not request.kv_transferred and len(hits) < max_hit_blocks:
            host_blocks = self.host.cached_prefix(hashes[len(hits) : max_hit_blocks])
        if host_blocks:
            loading = tuple(hashes[len(hits) : len(hits) + host_blocks])
            if self._loads.overlaps(loading):
                return _SKIPPED
            num_done = num_cached
            num_new = 0
            num_blocks = len(hits) + host_blocks
        else:
            num_done = request.num_tokens - 1 if request.kv_transferred else num_cached
            num_new = min(request.num_tokens - num_done, budget)
            num_blocks = -(-(num_done + num_new) // block_size)
        self.pool.touch(hits)
        fresh = self._allocate(num_blocks - len(hits))
        if fresh is None:
            self.pool.free(hits)
            return None
        request.blocks = hits + fresh
        request.num_computed_tokens = num_done
        request.num_registered_blocks = len(hits)
        if request.prefix_loaded:
            request.prefix_loaded = False
        else:
            self._count_lookup(request, num_cached, host_blocks * block_size, num_done - num_cached)
        request.kv_transferred = False
        if not host_blocks:
            return num_new
        self._loads.start(request, loading, host_blocks * block_size, now_s)
        return _LOADING

    def _count_lookup(
        self, request: EngineRequest, device_tokens: int, host_tokens: int, transferred_tokens: int
    ) -> None:
        """vLLM's counters of one admission: GPU hits as prefix-cache hits, the host tier's (and a
        prefill instance's transfer) as external hits; by source at the request's first admission."""
        stats = self.stats
        stats.prefix_cache_queries_tokens += request.num_tokens
        stats.prefix_cache_hits_tokens += device_tokens
        if self.host is not None or transferred_tokens:
            stats.external_prefix_cache_queries_tokens += request.num_tokens
            stats.external_prefix_cache_hits_tokens += host_tokens + transferred_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = device_tokens + host_tokens + transferred_tokens
            request.num_external_tokens = host_tokens + transferred_tokens
            stats.first_schedule_queries_tokens += request.num_tokens
            stats.first_schedule_hits_tokens += device_tokens
            stats.cached_tokens_by_source["device"] += device_tokens
            stats.cached_tokens_by_source["host"] += host_tokens
            stats.cached_tokens_by_source["p2p"] += transferred_tokens

    def _finish_loads(self, now_s: float) -> None:
        """Requests whose host-tier load has ended: their loaded blocks are cached on the GPU (vLLM
        caches them when the connector reports the load) and they go back to the head of the queue.
        Unlike vLLM, which holds the blocks for the request, they are released into the cache for the
        request's next lookup to find (a queued request holding blocks could starve the one ahead of
        it with nothing running), and that lookup is not counted again."""
        done = self._loads.finished(now_s)
        for request in done:
            self._cache_full_blocks(request, len(request.blocks) * self.profile.block_size_tokens)
            self.pool.free(request.blocks)
            request.blocks = []
            request.num_computed_tokens = 0
            request.num_registered_blocks = 0
            request.prefix_loaded = True
        self._waiting.extendleft(reversed(done))

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
            if request.num_computed_tokens < len(request.prompt_token_ids) + request.num_output_tokens:
                continue
            request.num_output_tokens += 1
            if request.first_token_s is None:
                request.first_token_s = end_s
                stats.prompt_tokens += request.num_prompt_tokens
                stats.count_prompt_sources(
                    request.num_prompt_tokens, request.num_cached_tokens, request.num_external_tokens
                )
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
            kv_events=self.events.take() if self.events is not None else (),
        )

    def _grow(self, request: EngineRequest, num_tokens: int) -> bool:
        needed = -(-num_tokens // self.profile.block_size_tokens) - len(request.blocks)
        if needed <= 0:
            return True
        fresh = self._allocate(needed)
        if fresh is None:
            return False
        request.blocks.extend(fresh)
        return True

    def _allocate(self, count: int) -> list[int] | None:
        fresh = self.pool.allocate(count)
        evicted = self.pool.evicted
        if evicted:
            assert self.events is not None
            self.events.evicted(evicted)
            evicted.clear()
        return fresh

    def _preempt(self, request: EngineRequest) -> None:
        self.pool.free(request.blocks)
        request.blocks = []
        request.num_computed_tokens = 0
        request.num_registered_blocks = 0
        self.stats.num_preemptions += 1
        self._waiting.appendleft(request)

    def _cache_full_blocks(self, request: EngineRequest, num_tokens: int) -> None:
        """Cache the request's blocks that its first ``num_tokens`` fill, as vLLM does when it schedules
        the step that computes them; copy them to the host tier; announce both."""
        block_size = self.profile.block_size_tokens
        start = request.num_registered_blocks
        stop = num_tokens // block_size
        if stop > len(request.prompt_hashes) + len(request.output_hashes):
            request.hash_generated_blocks(stop, block_size)
        hashes = request.hashes()
        blocks = request.blocks
        register = self.pool.register
        for index in range(start, stop):
            register(blocks[index], hashes[index])
        request.num_registered_blocks = stop
        events = self.events
        if events is None and self.host is None:
            return
        published = (
            events.stored(
                blocks,
                hashes,
                start,
                stop,
                request.tokens(start * block_size, stop * block_size),
                partial(request.block_tokens, block_size=block_size),
            )
            if events is not None
            else [0] * (stop - start)
        )
        if self.host is not None:
            store = self.host.store(hashes[start:stop], published)
            if events is not None:
                events.host_stored(store)
