"""Routing policies replayed on the simulator's own engines in simulated time: no sockets, no noise.

A real benchmark of a routing policy (``bench.bench_goodput``) takes minutes of wall time on
shared cores and its numbers move between runs. The lab plays the same kind of trace through the
real ``Router`` in front of the simulator's ``Engine`` (vLLM's continuous batching with chunked
prefill, a prefix cache and preemption, stepped by the profile's roofline) on one virtual clock, so
a policy change is judged in seconds and the same inputs always give the same numbers.

What the router sees is what the gateway would: ``ReplicaView``s from the lab's own ledger (prompt
tokens still waiting for a first token, resident sequences, decode tokens they may still produce,
worst-case KV reserved), updated at every decision, plus a ``/metrics``-like scrape of each engine
every ``scrape_every_s``. Prompts are rendered and tokenised as the simulator does, so the router's
block hashes and the engines' prefix cache agree. With ``admission`` on, a request the router finds
no room for waits at the gateway and is offered again, in arrival order, whenever a sequence
finishes or another request arrives (a newcomer that still fits once the queue had its turn goes
at once, as kvgate's queue walk lets it; the queue has no deadlines here); a request that waited longer than
``max_queue_wait_s`` is refused. A request may be held for the full replica holding its prefix
(``routing.prefix_hold_s``, within half that wait), as the gateway's dispatcher does. With admission
off, every request is routed at once without the room filter (as a router without admission, and
as kvgate with ``admission.enabled: false``): the engines queue and preempt.

    python -m bench.routing_lab [--trace below|overload|many-prefix] [--policies kvgate,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.routing_traces import TRACES, LabTrace
from kvgate.admission.cost import CostEstimate
from kvgate.admission.ledger import InMemoryLedger
from kvgate.admission.tokenizer import ChatTemplate, TiktokenTokenizer
from kvgate.config.routing import RoutingConfig
from kvgate.loadtest.workload import Trace
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.sim.engine import Engine, EngineRequest, StepResult
from kvgate.sim.profile import Profile, resolve_profile
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role, ScrapedMetrics
from kvgate.vocabulary.sharing import NOTHING_SHARED

MODEL = "lab-model"


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

    def good(self, ttft_slo_s: float, itl_slo_s: float) -> bool:
        ttft, itl = self.ttft_s, self.mean_itl_s
        return ttft is not None and ttft <= ttft_slo_s and (itl is None or itl <= itl_slo_s)


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
class LabResult:
    policy: str
    outcomes: tuple[Outcome, ...]
    hit_ratio: float
    preemptions: int
    replica_seconds: float

    def good_share(self, ttft_slo_s: float, itl_slo_s: float, class_name: str | None = None) -> float:
        chosen = [o for o in self.outcomes if class_name is None or o.request.class_name == class_name]
        return sum(1 for o in chosen if o.good(ttft_slo_s, itl_slo_s)) / len(chosen) if chosen else 0.0


def lab_requests(trace: Trace, model: str = MODEL) -> list[LabRequest]:
    """The trace's chat requests as the simulator would tokenise them, with their routing view."""
    tokenizer = TiktokenTokenizer.from_name()
    template = ChatTemplate()
    requests = []
    for request in trace.requests:
        ids = tuple(tokenizer.encode(template.render(request.payload["messages"])))
        routing = RoutingRequest.from_token_ids(model, ids, request.max_tokens)
        requests.append(LabRequest(request.index, request.class_name, request.at_s or 0.0, ids, routing))
    return requests


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
) -> LabResult:
    """Every request of ``requests`` through one fleet of ``replicas`` engines behind ``config``'s router."""
    router = Router(config, random.Random(config.seed))
    ledger = InMemoryLedger(block_tokens=profile.block_size_tokens)
    fleet = [_Replica(f"r{i}", Engine(profile, seed=i), ledger) for i in range(replicas)]
    by_id = {replica.replica_id: replica for replica in fleet}
    outcomes = [Outcome(request) for request in requests]
    events: list[tuple[float, int, int, Outcome | _Step | None]] = []
    order = 0

    def push(at_s: float, kind: int, item: Outcome | _Step | None) -> None:
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
            replica.stepping = False
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
        )
        if decision.replica_id is None:
            return False
        replica = by_id[decision.replica_id]
        outcome.replica, outcome.routed_s = replica.replica_id, now_s
        request_id = f"q{outcome.request.index}"
        replica.resident[request_id] = outcome
        routing = outcome.request.routing
        cost = CostEstimate(MODEL, routing.prompt_tokens, routing.max_output_tokens, 0)
        ledger.reserve(request_id, replica.replica_id, cost, now_s, routing.block_hashes if sharing else ())
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
            if _deliver(item.replica, item.result, ledger):
                drain_queue(now_s)
            step(item.replica, now_s)
    for outcome in waiting:
        outcome.refused = True
    assert ledger.totals() == ReplicaLoad(), "every reservation released"
    hits = sum(r.engine.stats.prefix_cache_hits_tokens for r in fleet)
    queries = sum(r.engine.stats.prefix_cache_queries_tokens for r in fleet)
    last_s = max((o.last_token_s or 0.0 for o in outcomes), default=0.0)
    return LabResult(
        config.policy,
        tuple(outcomes),
        hits / queries if queries else 0.0,
        sum(r.engine.stats.num_preemptions for r in fleet),
        replicas * last_s,
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


def percentile(values: Iterable[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_results(results: Sequence[LabResult], trace: LabTrace) -> None:
    ttft_slo, itl_slo = trace.slo_ttft_s, trace.slo_itl_s
    classes = sorted({o.request.class_name for o in results[0].outcomes})
    print(
        f"{'policy':<16} {'good %':>7} {'refused':>7} {'ttft p50':>9} {'ttft p95':>9} {'itl p95 ms':>10} "
        f"{'hit':>6} {'preempt':>7}  " + " ".join(f"{c[:10]:>10}" for c in classes)
    )
    for result in results:
        served = [o for o in result.outcomes if not o.refused]
        ttft = [o.ttft_s for o in served if o.ttft_s is not None]
        itl = [o.mean_itl_s for o in served if o.mean_itl_s is not None]
        p50, p95, itl95 = percentile(ttft, 0.5), percentile(ttft, 0.95), percentile(itl, 0.95)
        per_class = " ".join(f"{100 * result.good_share(ttft_slo, itl_slo, c):>9.1f}%" for c in classes)
        print(
            f"{result.policy:<16} {100 * result.good_share(ttft_slo, itl_slo):>6.1f}% "
            f"{len(result.outcomes) - len(served):>7} {p50 or 0:>9.3f} {p95 or 0:>9.3f} "
            f"{1000 * (itl95 or 0):>10.1f} {result.hit_ratio:>6.3f} {result.preemptions:>7}  {per_class}"
        )
    print("sequence slot-seconds of the served requests (prefill: routed to first token; decode: the rest)")
    for result in results:
        prefill_s, decode_s = slot_seconds(result)
        share = prefill_s / (prefill_s + decode_s) if prefill_s + decode_s else 0.0
        print(
            f"{result.policy:<16} prefill {prefill_s:>7.0f} s  decode {decode_s:>7.0f} s  "
            f"prefill share {share:.3f}"
        )


def slot_seconds(result: LabResult) -> tuple[float, float]:
    """Sequence-slot time the served requests held in prefill and in decode.

    When the fleet is bound by its sequence slots (what keeps more requests from being admitted is
    ``max_num_seqs``, not KV or compute), a router can raise goodput only by shortening this time,
    and the prefill share is the most that prefix hits could save."""
    prefill_s = decode_s = 0.0
    for outcome in result.outcomes:
        if outcome.routed_s is None or outcome.first_token_s is None or outcome.last_token_s is None:
            continue
        prefill_s += outcome.first_token_s - outcome.routed_s
        decode_s += outcome.last_token_s - outcome.first_token_s
    return prefill_s, decode_s


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--trace", choices=sorted(TRACES), default="below")
    parser.add_argument("--policies", default="kvgate,round_robin,least_request")
    parser.add_argument("--admission", choices=("on", "off"), default="on")
    parser.add_argument("--rate", type=float, help="offered requests/s (default: the trace's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-wait-s", type=float, default=2.0, help="longest gateway wait (default 2)")
    parser.add_argument("--max-num-seqs", type=int, help="sequence slots per replica (default: the trace's)")
    parser.add_argument("--kv-tokens", type=int, help="KV tokens per replica (default: the trace's)")
    args = parser.parse_args()
    trace = TRACES[args.trace]
    if args.rate:
        trace = dataclasses.replace(trace, rate_rps=args.rate)
    overrides = dict(trace.profile_overrides)
    if args.max_num_seqs:
        overrides["max_num_seqs"] = args.max_num_seqs
    if args.kv_tokens:
        overrides["kv_capacity_tokens"] = args.kv_tokens
    trace = dataclasses.replace(trace, profile_overrides=overrides)
    requests = lab_requests(trace.trace(args.seed))
    profile = resolve_profile(overrides=trace.profile_overrides)
    print(
        f"{trace.name}: {len(requests)} requests, {trace.replicas} replicas "
        f"(KV {profile.kv_capacity_tokens} tokens, {profile.max_num_seqs} sequences each); "
        f"SLO TTFT {trace.slo_ttft_s:g} s, mean ITL {1000 * trace.slo_itl_s:g} ms"
    )
    results = [
        play(
            requests,
            RoutingConfig.model_validate({"policy": name, "warmup_s": 0}),
            profile,
            trace.replicas,
            admission=args.admission == "on",
            max_queue_wait_s=args.max_wait_s,
        )
        for name in args.policies.split(",")
    ]
    print_results(results, trace)


if __name__ == "__main__":
    main()
