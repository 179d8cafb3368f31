"""One trace through one fleet of the simulator's engines behind the real router, on a virtual clock
(the lab itself: see the package's docstring)."""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvgate.admission.cost import CostEstimate
from kvgate.admission.ledger import InMemoryLedger
from kvgate.admission.tokenizer import ChatTemplate, TiktokenTokenizer
from kvgate.config.routing import RoutingConfig
from kvgate.loadtest.workload import Trace
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.sim.engine import Engine, EngineRequest, StepResult
from kvgate.sim.profile import Profile, step_duration_s
from kvgate.sim.vllm_block_hash import BlockDigests
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role, ScrapedMetrics
from kvgate.vocabulary.sharing import NOTHING_SHARED

MODEL = "lab-model"
KV_BYTES_PER_TOKEN = 131_072
"""Llama-3.1-8B in bf16, as the lab's profile models."""


@dataclass(frozen=True, slots=True)
class LabRequest:
    index: int
    class_name: str
    arrival_s: float
    token_ids: tuple[int, ...]
    routing: RoutingRequest


@dataclass(slots=True)
class Outcome:
    """One request's life as its client saw it."""

    request: LabRequest
    replica: str | None = None
    routed_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    tokens: int = 0
    refused: bool = False

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.request.arrival_s

    @property
    def mean_itl_s(self) -> float | None:
        if self.first_token_s is None or self.last_token_s is None or self.tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.tokens - 1)

    def good(self, ttft_slo_s: float, itl_slo_s: float, ttft_per_prompt_token_s: float = 0.0) -> bool:
        ttft, itl = self.ttft_s, self.mean_itl_s
        budget_s = ttft_slo_s + ttft_per_prompt_token_s * self.request.routing.prompt_tokens
        return ttft is not None and ttft <= budget_s and (itl is None or itl <= itl_slo_s)


@dataclass(slots=True)
class _Replica:
    replica_id: str
    engine: Engine
    ledger: InMemoryLedger
    resident: dict[str, Outcome] = field(default_factory=dict)
    stepping: bool = False
    scraped: ScrapedMetrics | None = None

    def view(self) -> ReplicaView:
        profile = self.engine.profile
        return ReplicaView(
            replica_id=self.replica_id,
            url=f"lab://{self.replica_id}",
            pool="default",
            role=Role.MIXED,
            models=frozenset({MODEL}),
            kv_capacity_tokens=profile.kv_capacity_tokens,
            max_sequences=profile.max_num_seqs,
            healthy=True,
            ready_since_s=-3600.0,
            load=self.ledger.load(self.replica_id),
            scraped=self.scraped,
        )

    def scrape(self, now_s: float) -> None:
        engine = self.engine
        self.scraped = ScrapedMetrics(
            kv_cache_usage_ratio=engine.kv_cache_usage_ratio,
            num_requests_running=engine.num_running,
            num_requests_waiting=engine.num_waiting,
            num_gpu_blocks=engine.profile.num_gpu_blocks,
            block_size_tokens=engine.profile.block_size_tokens,
            scraped_at_s=now_s,
        )


@dataclass(frozen=True, slots=True)
class _Step:
    replica: _Replica
    result: StepResult


@dataclass(frozen=True, slots=True)
class _LoadEnd:
    """A host-tier load ends on an engine that had nothing else to run: step it again then."""

    replica: _Replica


@dataclass(frozen=True, slots=True)
class LabResult:
    policy: str
    outcomes: tuple[Outcome, ...]
    hit_ratio: float
    preemptions: int
    replica_seconds: float
    tiered_hit_ratio: float = 0.0
    """Prompt tokens found in either tier over those looked up: the GPU's hits and the host tier's loads."""

    def good_share(
        self,
        ttft_slo_s: float,
        itl_slo_s: float,
        class_name: str | None = None,
        ttft_per_prompt_token_s: float = 0.0,
    ) -> float:
        chosen = [o for o in self.outcomes if class_name is None or o.request.class_name == class_name]
        good = sum(1 for o in chosen if o.good(ttft_slo_s, itl_slo_s, ttft_per_prompt_token_s))
        return good / len(chosen) if chosen else 0.0


def lab_requests(trace: Trace, model: str = MODEL) -> list[LabRequest]:
    """The trace's requests as the simulator would tokenise them (a chat through its template, a
    completion's prompt as it is), with their routing view."""
    tokenizer = TiktokenTokenizer.from_name()
    template = ChatTemplate()
    requests = []
    for request in trace.requests:
        payload = request.payload
        text = template.render(payload["messages"]) if "messages" in payload else payload["prompt"]
        ids = tuple(tokenizer.encode(text))
        routing = RoutingRequest.from_token_ids(model, ids, request.max_tokens)
        routing = dataclasses.replace(routing, kv_bytes_per_token=KV_BYTES_PER_TOKEN)
        requests.append(LabRequest(request.index, request.class_name, request.at_s or 0.0, ids, routing))
    return requests


def prefill_tokens_per_s(profile: Profile) -> float:
    """What a replica of ``profile`` prefills per second with a full token budget: the rate the
    gateway would measure, and the one it hands the router."""
    tokens = profile.max_num_batched_tokens
    return tokens / step_duration_s(profile, tokens, 0.0, 0)


def play(
    requests: Sequence[LabRequest],
    config: RoutingConfig,
    profile: Profile,
    replicas: int,
    *,
    admission: bool = True,
    max_queue_wait_s: float = 30.0,
    scrape_every_s: float = 1.0,
    sharing: bool = True,
    kv_events: bool = False,
) -> LabResult:
    """Every request of ``requests`` through one fleet of ``replicas`` engines behind ``config``'s router.

    With ``kv_events`` every engine's KV cache events reach the router's index of the replicas'
    caches at the end of the step that produced them, as the gateway's subscription hands them over;
    without, the router reads what it routed where."""
    router = Router(config, random.Random(config.seed))
    rate = prefill_tokens_per_s(profile)
    ledger = InMemoryLedger(block_tokens=profile.block_size_tokens)
    digests = BlockDigests() if kv_events else None
    fleet = [_Replica(f"r{i}", Engine(profile, seed=i, digests=digests), ledger) for i in range(replicas)]
    if kv_events:
        for replica in fleet:
            router.cache.start(replica.replica_id)
    by_id = {replica.replica_id: replica for replica in fleet}
    outcomes = [Outcome(request) for request in requests]
    events: list[tuple[float, int, int, Outcome | _Step | _LoadEnd | None]] = []
    order = 0

    def push(at_s: float, kind: int, item: Outcome | _Step | _LoadEnd | None) -> None:
        nonlocal order
        heapq.heappush(events, (at_s, kind, order, item))
        order += 1

    for outcome in outcomes:
        push(outcome.request.arrival_s, _ARRIVE, outcome)
    end_of_trace_s = max((r.arrival_s for r in requests), default=0.0)
    at_s = 0.0
    while at_s <= end_of_trace_s + max_queue_wait_s:
        push(at_s, _SCRAPE, None)
        at_s += scrape_every_s
    waiting: deque[Outcome] = deque()

    def step(replica: _Replica, now_s: float) -> None:
        result = replica.engine.step(now_s)
        if result.num_scheduled_tokens == 0:
            # Idle, or waiting on a host-tier load: an arrival may step it sooner, as in the server.
            replica.stepping = False
            load_done_s = replica.engine.next_load_done_s
            if load_done_s is not None:
                push(load_done_s, _STEP_END, _LoadEnd(replica))
            return
        replica.stepping = True
        push(result.end_s, _STEP_END, _Step(replica, result))

    def place(outcome: Outcome, now_s: float) -> bool:
        views = [replica.view() for replica in fleet]
        hold_until_s = router.hold_until_s(outcome.request.arrival_s, max_queue_wait_s)
        decision = router.choose(
            outcome.request.routing,
            views,
            now_s,
            (),
            admission,
            hold_until_s,
            ledger if sharing else NOTHING_SHARED,
            prefill_tokens_per_s=rate,
        )
        if decision.replica_id is None:
            return False
        replica = by_id[decision.replica_id]
        outcome.replica, outcome.routed_s = replica.replica_id, now_s
        request_id = f"q{outcome.request.index}"
        replica.resident[request_id] = outcome
        routing = outcome.request.routing
        cost = CostEstimate(MODEL, routing.prompt_tokens, routing.max_output_tokens, 0)
        hashes = routing.block_hashes if sharing else ()
        ledger.reserve(request_id, replica.replica_id, cost, now_s, hashes, decision.cached_prompt_tokens)
        replica.engine.add_request(
            request_id,
            outcome.request.token_ids,
            outcome.request.routing.max_output_tokens,
            now_s,
            ignore_eos=True,
            prompt_hashes=outcome.request.routing.block_hashes,
        )
        if not replica.stepping:
            step(replica, now_s)
        return True

    def drain_queue(now_s: float) -> None:
        while waiting and now_s - waiting[0].request.arrival_s > max_queue_wait_s:
            waiting.popleft().refused = True
        for outcome in list(waiting):
            if place(outcome, now_s):
                waiting.remove(outcome)

    while events:
        now_s, kind, _, item = heapq.heappop(events)
        if kind == _SCRAPE:
            for replica in fleet:
                replica.scrape(now_s)
            drain_queue(now_s)
        elif isinstance(item, Outcome):
            if waiting:
                drain_queue(now_s)
            if not place(item, now_s):
                waiting.append(item)
        elif isinstance(item, _Step):
            for event in item.result.kv_events:
                router.cache.apply(item.replica.replica_id, event)
            if _deliver(item.replica, item.result, ledger):
                drain_queue(now_s)
            step(item.replica, now_s)
        elif isinstance(item, _LoadEnd) and not item.replica.stepping:
            step(item.replica, now_s)
    for outcome in waiting:
        outcome.refused = True
    assert ledger.totals() == ReplicaLoad(), "every reservation released"
    hits = sum(r.engine.stats.prefix_cache_hits_tokens for r in fleet)
    host_hits = sum(r.engine.stats.cached_tokens_by_source["host"] for r in fleet)
    queries = sum(r.engine.stats.prefix_cache_queries_tokens for r in fleet)
    last_s = max((o.last_token_s or 0.0 for o in outcomes), default=0.0)
    return LabResult(
        config.policy,
        tuple(outcomes),
        hits / queries if queries else 0.0,
        sum(r.engine.stats.num_preemptions for r in fleet),
        replicas * last_s,
        (hits + host_hits) / queries if queries else 0.0,
    )


_STEP_END, _SCRAPE, _ARRIVE = 0, 1, 2
"""Event kinds in the order they are handled at one instant: tokens first, then what they freed."""


def _deliver(replica: _Replica, result: StepResult, ledger: InMemoryLedger) -> bool:
    """Hand out the step's tokens and account them as the gateway does; True when a sequence
    finished (its room is free again)."""
    finished = False
    end_s = result.end_s
    for sequence in result.produced:
        request_id = sequence.request_id
        outcome = replica.resident[request_id]
        if outcome.first_token_s is None:
            outcome.first_token_s = end_s
        outcome.last_token_s = end_s
        outcome.tokens += 1
        ledger.produced(request_id, outcome.tokens)
        if _done(sequence):
            del replica.resident[request_id]
            ledger.release(request_id)
            finished = True
    return finished


def _done(sequence: EngineRequest) -> bool:
    return sequence.finish_reason is not None
