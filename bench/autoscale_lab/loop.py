"""One scenario through one scaler: a fleet of simulator engines behind kvgate's router and queue,
resized by the scaler every evaluation interval, on one virtual clock.

The parts are the real ones where a decision is made and the simulator's where hardware is modelled:
the simulator's ``Engine`` per replica (continuous batching, chunked prefill, prefix cache,
preemption, the profile's warm-up), kvgate's ``Router`` with its room filter and ramp over an
``InMemoryLedger`` of reservations, a queue that walks in arrival order as the gateway's does
(a request that does not fit waits; after ``head_of_line_max_wait_s`` it stops smaller ones from
bypassing it; after ``max_queue_wait_s`` it is refused), and the signals the gateway would export:
the same ``SignalsWindow`` the gateway records into, read into a ``PoolWork`` and through
``pool_signals`` exactly as ``/signals`` is. The first evaluation waits for one full signals window,
as a loop that has been running would see it (a window filling from nothing reads as growth). The
actuator is ``SimActuator``'s: a new replica is known to the gateway at once, cold (not routable)
for the profile's cold start, then ramps; scaling in removes still-starting replicas first, then the
newest ready ones, which leave routing at once and are removed when their last sequence finishes. A
replica costs from the moment it is asked for until it is removed.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Sequence

from bench.autoscale_lab.records import (
    LabReplica,
    LabRun,
    LabSettings,
    Observation,
    Outcome,
    Scaler,
    Tick,
)
from bench.autoscale_lab.scenarios import Arrival
from kvgate.admission.cost import CostEstimate
from kvgate.admission.ledger import InMemoryLedger
from kvgate.autoscaler.signals import pool_signals
from kvgate.gateway.telemetry.pool_work import ModelWork, PoolWork, ReplicaWork
from kvgate.gateway.telemetry.signals_doc import SignalsWindow
from kvgate.gateway.telemetry.sliding_windows import CountWindow
from kvgate.routing.prefix_hash import block_hashes
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.sim.engine import Engine, StepResult
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role, ScrapedMetrics

MODEL = "lab-model"
POOL = "default"


class _Loop:
    def __init__(
        self, arrivals: Sequence[Arrival], scaler: Scaler, settings: LabSettings, end_s: float, name: str
    ) -> None:
        self.name = name
        self.settings = settings
        self.scaler = scaler
        self.end_s = end_s
        self.profile = settings.profile
        self.router = Router(settings.routing, random.Random(settings.seed))
        self.ledger = InMemoryLedger(block_tokens=self.profile.block_size_tokens)
        self.windows = SignalsWindow(lambda: self.now_s, settings.signals_window_s)
        self.arrivals_window = CountWindow(settings.signals_window_s)
        self.replicas: list[LabReplica] = []
        self.by_id: dict[str, LabReplica] = {}
        self.outcomes = [Outcome(a) for a in arrivals]
        self.waiting: deque[Outcome] = deque()
        self.ticks: list[Tick] = []
        self.events: list[tuple[float, int, int, object]] = []
        self.order = 0
        self.now_s = 0.0
        self.next_id = 0
        self.desired = settings.initial_replicas
        self.session_hashes: dict[int, list[int]] = {}
        for _ in range(settings.initial_replicas):
            self._launch(-3600.0, ready_s=-3600.0)
        for outcome in self.outcomes:
            self._push(outcome.arrival.arrival_s, _ARRIVE, outcome)
        self._push(0.0, _TICK, None)

    def _push(self, at_s: float, kind: int, item: object) -> None:
        heapq.heappush(self.events, (at_s, kind, self.order, item))
        self.order += 1

    def run(self) -> LabRun:
        tick_every_s = 1.0
        evaluate_every = round(self.settings.interval_s / tick_every_s)
        tick_index = 0
        while self.events:
            self.now_s, kind, _, item = heapq.heappop(self.events)
            if kind == _STEP_END:
                assert isinstance(item, tuple)
                replica, result = item
                if self._deliver(replica, result):
                    self._drain_queue()
                self._step(replica)
            elif kind == _TICK:
                self._scrape()
                self._drain_queue()
                first_s = self.settings.signals_window_s
                if tick_index % evaluate_every == 0 and first_s <= self.now_s <= self.end_s:
                    self._evaluate()
                tick_index += 1
                if self.now_s < self.end_s or self.waiting:
                    self._push(self.now_s + tick_every_s, _TICK, None)
            elif kind == _READY:
                self._drain_queue()
            else:
                assert isinstance(item, Outcome)
                self.arrivals_window.add(1, self.now_s)
                if self.waiting or not self._place(item):
                    self.waiting.append(item)
                    if len(self.waiting) == 1:
                        self._drain_queue()
        for outcome in self.waiting:
            outcome.refused = True
        assert self.ledger.totals() == ReplicaLoad(), "every reservation released"
        spans = tuple(
            (max(0.0, r.launched_s), min(self.end_s, r.removed_s if r.removed_s is not None else self.end_s))
            for r in self.replicas
        )
        return LabRun(
            self.name,
            tuple(self.outcomes),
            tuple(self.ticks),
            sum(max(0.0, end_s - begin_s) for begin_s, end_s in spans),
            sum(r.engine.stats.num_preemptions for r in self.replicas),
            spans,
        )

    # -- the actuator --------------------------------------------------------------------------

    def _launch(self, now_s: float, ready_s: float) -> None:
        replica_id = f"r{self.next_id}"
        self.next_id += 1
        replica = LabReplica(
            replica_id, now_s, ready_s, Engine(self.profile, seed=self.next_id, ready_s=ready_s)
        )
        self.replicas.append(replica)
        self.by_id[replica_id] = replica
        if ready_s > now_s:
            self._push(ready_s, _READY, replica)

    def _resize(self, desired: int) -> None:
        now_s = self.now_s
        live = [r for r in self.replicas if r.live]
        for _ in range(desired - len(live)):
            self._launch(now_s, now_s + self.profile.cold_start_s)
        surplus = len(live) - desired
        if surplus <= 0:
            return
        starting = [r for r in live if r.ready_s > now_s]
        ready = [r for r in live if r.ready_s <= now_s]
        victims = (starting[::-1] + sorted(ready, key=lambda r: r.ready_s, reverse=True))[:surplus]
        for replica in victims:
            replica.draining = True
            self.router.forget(replica.replica_id)
            if not replica.resident:
                replica.removed_s = now_s

    def _evaluate(self) -> None:
        observation = self._observe()
        desired = max(self.settings.min_replicas, min(self.settings.max_replicas, self.scaler(observation)))
        self._resize(desired)
        live = sum(1 for r in self.replicas if r.live)
        ready = sum(1 for r in self.replicas if r.ready(self.now_s))
        self.ticks.append(Tick(self.now_s, desired, live, ready))

    # -- the gateway's signals -----------------------------------------------------------------

    def _observe(self) -> Observation:
        now_s = self.now_s
        warmup_s = self.settings.routing.warmup_s
        queued_prompt = sum(o.arrival.prompt_tokens for o in self.waiting)
        pending = resident = remaining = 0
        replica_work = []
        busy = []
        engine_waiting = 0
        interval_s = self.settings.interval_s
        for replica in self.replicas:
            if not replica.live:
                continue
            for reservation in self.ledger.resident(replica.replica_id):
                pending += reservation.pending_prompt_tokens
                resident += 1
                remaining += max(0, reservation.remaining_decode_tokens)
            capacity = self.profile.kv_capacity_tokens
            ready = replica.ready(now_s)
            reserved = self.ledger.load(replica.replica_id).reserved_kv_tokens
            replica_work.append(
                ReplicaWork(
                    replica.replica_id,
                    capacity,
                    reserved / capacity,
                    replica.engine.kv_cache_usage_ratio if ready else None,
                    ready,
                    ready and now_s - replica.ready_s < warmup_s,
                )
            )
            if ready:
                busy_s = replica.engine.stats.busy_s
                busy.append(min(1.0, (busy_s - replica.busy_mark_s) / interval_s))
                replica.busy_mark_s = busy_s
                engine_waiting += replica.engine.num_waiting
        work = PoolWork(
            POOL,
            Role.MIXED,
            (ModelWork(MODEL, len(self.waiting), queued_prompt, pending, resident, remaining),),
            tuple(replica_work),
        )
        signals = pool_signals(self.windows.snapshot([work]), now_s)[0]
        window_s = min(self.settings.signals_window_s, max(1.0, now_s))
        return Observation(
            signals,
            self.arrivals_window.total(now_s) / window_s,
            sum(busy) / len(busy) if busy else 0.0,
            engine_waiting + len(self.waiting),
        )

    def _scrape(self) -> None:
        for replica in self.replicas:
            if replica.ready(self.now_s):
                engine = replica.engine
                replica.scraped = ScrapedMetrics(
                    kv_cache_usage_ratio=engine.kv_cache_usage_ratio,
                    num_requests_running=engine.num_running,
                    num_requests_waiting=engine.num_waiting,
                    num_gpu_blocks=self.profile.num_gpu_blocks,
                    block_size_tokens=self.profile.block_size_tokens,
                    scraped_at_s=self.now_s,
                )

    # -- admission and routing -----------------------------------------------------------------

    def _view(self, replica: LabReplica) -> ReplicaView:
        return ReplicaView(
            replica_id=replica.replica_id,
            url=f"lab://{replica.replica_id}",
            pool=POOL,
            role=Role.MIXED,
            models=frozenset({MODEL}),
            kv_capacity_tokens=self.profile.kv_capacity_tokens,
            max_sequences=self.profile.max_num_seqs,
            healthy=True,
            ready_since_s=replica.ready_s,
            load=self.ledger.load(replica.replica_id),
            scraped=replica.scraped,
        )

    def _hashes(self, arrival: Arrival) -> list[int]:
        """Block hashes of the prompt; a session's are extended from its earlier turns' (its turns
        share the prefix), everything else is hashed afresh."""
        block = self.profile.block_size_tokens
        if arrival.class_name != "session":
            return block_hashes(arrival.token_ids, block)
        known = self.session_hashes.get(arrival.prefix_id)
        if known is None or len(known) < arrival.prompt_tokens // block:
            known = block_hashes(arrival.token_ids, block)
            self.session_hashes[arrival.prefix_id] = known
        return known[: arrival.prompt_tokens // block]

    def _place(self, outcome: Outcome) -> bool:
        now_s = self.now_s
        views = [self._view(r) for r in self.replicas if r.ready(now_s)]
        if not views:
            return False
        arrival = outcome.arrival
        hashes = tuple(self._hashes(arrival))
        routing = RoutingRequest(MODEL, arrival.prompt_tokens, arrival.output_tokens, hashes)
        hold_until_s = self.router.hold_until_s(arrival.arrival_s, self.settings.max_queue_wait_s)
        decision = self.router.choose(routing, views, now_s, (), True, hold_until_s, self.ledger)
        if decision.replica_id is None:
            return False
        replica = self.by_id[decision.replica_id]
        request_id = f"q{arrival.index}"
        outcome.routed_s = now_s
        replica.resident[request_id] = outcome
        cost = CostEstimate(MODEL, arrival.prompt_tokens, arrival.output_tokens, 0)
        self.ledger.reserve(request_id, replica.replica_id, cost, now_s, hashes)
        replica.engine.add_request(
            request_id, arrival.token_ids, arrival.output_tokens, now_s, ignore_eos=True, prompt_hashes=hashes
        )
        if now_s > arrival.arrival_s:
            self.windows.pool_windows(POOL).queue_wait.observe(now_s - arrival.arrival_s, now_s)
        if not replica.stepping:
            self._step(replica)
        return True

    def _drain_queue(self) -> None:
        now_s = self.now_s
        waiting = self.waiting
        queue_wait = self.windows.pool_windows(POOL).queue_wait
        while waiting and now_s - waiting[0].arrival.arrival_s > self.settings.max_queue_wait_s:
            refused = waiting.popleft()
            refused.refused = True
            queue_wait.observe(now_s - refused.arrival.arrival_s, now_s)
        kept: deque[Outcome] = deque()
        misses = 0
        while waiting:
            outcome = waiting.popleft()
            if self._place(outcome):
                continue
            kept.append(outcome)
            misses += 1
            if (
                now_s - outcome.arrival.arrival_s > self.settings.head_of_line_max_wait_s
                or misses >= _MAX_MISSES
            ):
                break
        kept.extend(waiting)
        self.waiting = kept

    # -- the engines ---------------------------------------------------------------------------

    def _step(self, replica: LabReplica) -> None:
        result = replica.engine.step(self.now_s)
        if result.num_scheduled_tokens == 0:
            replica.stepping = False
            return
        replica.stepping = True
        self._push(result.end_s, _STEP_END, (replica, result))

    def _deliver(self, replica: LabReplica, result: StepResult) -> bool:
        """Hand out the step's tokens and account them as the gateway does; True when a sequence
        finished (its room is free again)."""
        finished = False
        end_s = result.end_s
        windows = self.windows.pool_windows(POOL)
        for sequence in result.produced:
            request_id = sequence.request_id
            outcome = replica.resident[request_id]
            if outcome.first_token_s is None:
                outcome.first_token_s = end_s
                windows.ttft.observe(end_s - outcome.arrival.arrival_s, end_s)
            else:
                outcome.gaps_s.append(end_s - (outcome.last_token_s or end_s))
            outcome.last_token_s = end_s
            outcome.tokens += 1
            self.ledger.produced(request_id, outcome.tokens)
            if sequence.finish_reason is not None:
                del replica.resident[request_id]
                self.ledger.release(request_id)
                windows.itl.observe_many(outcome.gaps_s, end_s)
                windows.served.add(outcome.arrival.prompt_tokens, outcome.tokens, end_s)
                outcome.gaps_s = []
                finished = True
        if replica.draining and not replica.resident and replica.removed_s is None:
            replica.removed_s = end_s
        return finished


_STEP_END, _READY, _TICK, _ARRIVE = 0, 1, 2, 3
"""Event kinds in the order they are handled at one instant: tokens first, then what they freed."""
_MAX_MISSES = 8
"""Queued requests tried per walk that do not fit, before the walk stops (bounds a walk's cost)."""


def run(
    arrivals: Sequence[Arrival], scaler: Scaler, settings: LabSettings, end_s: float, name: str
) -> LabRun:
    """Play ``arrivals`` through a fleet resized by ``scaler``; replica-seconds count up to ``end_s``."""
    return _Loop(arrivals, scaler, settings, end_s, name).run()
