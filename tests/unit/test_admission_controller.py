from __future__ import annotations

import dataclasses
from itertools import count

import pytest

from kvgate.admission.controller import AdmissionController
from kvgate.admission.cost import CostEstimate
from kvgate.admission.decision import (
    AdmissionRequest,
    Admit,
    Decision,
    Dispatch,
    Queue,
    Refusal,
    RefusalReason,
)
from kvgate.admission.ledger import InMemoryLedger
from kvgate.admission.retry_after import ServiceRates
from kvgate.admission.tenants import Tenant, TenantDirectory
from kvgate.config.admission import AdmissionConfig, ModelAdmissionConfig
from kvgate.config.auth import AuthConfig, TenantKeys
from kvgate.config.tenants import PriorityClass, TenantConfig
from kvgate.vocabulary.replica import ReplicaView, Role
from kvgate.vocabulary.snapshot import FleetSnapshot

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_ids = count(1)


def key_of(tenant: str) -> AuthConfig:
    """Auth giving ``tenant`` the key ``k``."""
    return AuthConfig(tenants=(TenantKeys(name=tenant, api_keys=("k",)),))


class Fleet:
    """Replicas whose load is the controller's own ledger, on a manual clock."""

    def __init__(
        self, config: AdmissionConfig, capacities: dict[str, int], auth: AuthConfig | None = None
    ) -> None:
        self.ledger = InMemoryLedger()
        tenants = None if auth is None else TenantDirectory(config, auth)
        self.controller = AdmissionController(config, self.ledger, tenants)
        self.controller.observe_rates(ServiceRates(inter_token_s=0.01, prefill_tokens_per_s=10_000))
        self.capacities = capacities
        self.overrides: dict[str, dict[str, object]] = {}
        self.now_s = 0.0

    def views(self) -> list[ReplicaView]:
        return [
            dataclasses.replace(
                ReplicaView(
                    rid,
                    f"http://{rid}",
                    "pool",
                    Role.MIXED,
                    frozenset({MODEL}),
                    cap,
                    256,
                    True,
                    0.0,
                    self.ledger.load(rid),
                ),
                **self.overrides.get(rid, {}),  # type: ignore[arg-type]
            )
            for rid, cap in self.capacities.items()
        ]

    def snapshot(self, now_s: float | None = None) -> FleetSnapshot:
        return FleetSnapshot(self.now_s if now_s is None else now_s, tuple(self.views()))

    def admit(self, request: AdmissionRequest) -> Decision:
        decision = self.controller.admit(request, self.snapshot())
        if isinstance(decision, Admit):
            self.ledger.reserve(
                request.request_id, decision.candidates[0].replica_id, request.cost, self.now_s
            )
        return decision

    def release(self, request_id: str) -> list[Dispatch]:
        assert self.ledger.release(request_id)
        return self.pump()

    def pump(self) -> list[Dispatch]:
        dispatches = self.controller.on_capacity_freed(self.snapshot())
        for d in dispatches:
            self.ledger.reserve(d.request.request_id, d.candidates[0].replica_id, d.request.cost, self.now_s)
        return dispatches


def req(
    prompt: int, max_output: int, tenant: Tenant | None = None, timeout_s: float | None = None
) -> AdmissionRequest:
    return AdmissionRequest(
        f"q{next(_ids)}", tenant or Tenant("t"), CostEstimate(MODEL, prompt, max_output, 131072), timeout_s
    )


def test_admits_with_candidates_that_fit_most_room_first() -> None:
    fleet = Fleet(AdmissionConfig(), {"small": 1000, "big": 5000, "tiny": 100})
    decision = fleet.admit(req(300, 300))
    assert isinstance(decision, Admit)
    assert [v.replica_id for v in decision.candidates] == ["big", "small"]


@pytest.mark.parametrize(
    "override",
    [
        {"healthy": False},
        {"ready_since_s": None},
        {"ready_since_s": 50.0},
        {"backoff_until_s": 50.0},
        {"role": Role.DECODE},
        {"models": frozenset({"other"})},
    ],
)
def test_unroutable_replicas_are_never_candidates(override: dict[str, object]) -> None:
    fleet = Fleet(AdmissionConfig(), {"a": 1000, "b": 1000})
    fleet.overrides["a"] = override
    decision = fleet.admit(req(10, 10))
    assert isinstance(decision, Admit)
    assert [v.replica_id for v in decision.candidates] == ["b"]


def test_503_when_nothing_is_routable_with_retry_after_from_backoff() -> None:
    fleet = Fleet(AdmissionConfig(no_replica_retry_after_s=7.0), {"a": 1000})
    fleet.overrides["a"] = {"backoff_until_s": 2.5}
    decision = fleet.admit(req(10, 10))
    assert isinstance(decision, Refusal)
    assert decision.retry_after is not None
    assert (decision.status, decision.reason, decision.retry_after.seconds) == (
        503,
        RefusalReason.NO_REPLICA,
        3,
    )
    assert decision.retry_after.headers() == {"retry-after": "3", "retry-after-ms": "2500"}
    fleet.overrides["a"] = {"healthy": False}
    decision = fleet.admit(req(10, 10))
    assert isinstance(decision, Refusal) and decision.retry_after is not None
    assert decision.retry_after.seconds == 7


def test_400_when_no_replica_could_ever_hold_it() -> None:
    fleet = Fleet(AdmissionConfig(), {"a": 1000})
    decision = fleet.admit(req(600, 401))
    assert isinstance(decision, Refusal)
    assert (decision.status, decision.reason, decision.retry_after) == (400, RefusalReason.KV_CAPACITY, None)


def test_sequence_guard_queues_even_with_kv_room() -> None:
    fleet = Fleet(AdmissionConfig(max_active_sequences_per_replica=2), {"a": 10**6})
    assert isinstance(fleet.admit(req(10, 10)), Admit)
    assert isinstance(fleet.admit(req(10, 10)), Admit)
    assert isinstance(fleet.admit(req(10, 10)), Queue)


def test_queue_then_dispatch_on_release() -> None:
    fleet = Fleet(AdmissionConfig(), {"a": 1000})
    first = req(400, 400)
    assert isinstance(fleet.admit(first), Admit)
    second = req(300, 300)
    queued = fleet.admit(second)
    assert isinstance(queued, Queue)
    assert 0.0 < queued.expected_wait_s <= 30.0
    assert fleet.controller.queue_stats(0.0).requests == 1
    fleet.now_s = 2.0
    [dispatch] = fleet.release(first.request_id)
    assert dispatch.ticket == queued.ticket and dispatch.request == second
    assert dispatch.waited_s == 2.0
    assert [v.replica_id for v in dispatch.candidates] == ["a"]
    assert fleet.controller.queue_stats(2.0).requests == 0


def test_expected_wait_beyond_budget_is_429_kv_capacity_with_retry_after() -> None:
    fleet = Fleet(AdmissionConfig(max_queue_wait_s=1.0), {"a": 1000})
    assert isinstance(fleet.admit(req(100, 800)), Admit)  # 800 tokens at 10 ms: ~8 s to drain
    decision = fleet.admit(req(100, 100))
    assert isinstance(decision, Refusal)
    assert (decision.status, decision.reason) == (429, RefusalReason.KV_CAPACITY)
    assert decision.retry_after is not None
    assert decision.retry_after.expected_s == pytest.approx(100 / 10_000 + 8.0)
    # Without a body or a key it could not be recognised coming back: no room is held for it.
    assert decision.retry_after.headers() == {
        "retry-after": "9",
        "retry-after-ms": "8010",
        "x-should-retry": "false",
    }
    assert fleet.controller.queue_stats(0.0).requests == 0


def test_client_deadline_shorter_than_budget_gives_reason_deadline() -> None:
    fleet = Fleet(AdmissionConfig(max_queue_wait_s=30.0), {"a": 1000})
    assert isinstance(fleet.admit(req(100, 800)), Admit)
    decision = fleet.admit(req(100, 100, timeout_s=2.0))
    assert isinstance(decision, Refusal) and decision.reason is RefusalReason.DEADLINE
    assert isinstance(fleet.admit(req(100, 100, timeout_s=60.0)), Queue)


def test_retry_after_is_capped_for_the_sdk_which_is_told_not_to_retry() -> None:
    fleet = Fleet(AdmissionConfig(max_queue_wait_s=1.0, retry_after_cap_s=60.0), {"a": 100_000})
    fleet.controller.observe_rates(ServiceRates(inter_token_s=1.0, prefill_tokens_per_s=10_000))
    assert isinstance(fleet.admit(req(100, 99_000)), Admit)
    decision = fleet.admit(req(100, 1000))
    assert isinstance(decision, Refusal) and decision.retry_after is not None
    assert decision.retry_after.expected_s > 1000
    assert decision.retry_after.headers() == {
        "retry-after": "60",
        "retry-after-ms": "60000",
        "x-should-retry": "false",
    }


def test_queue_full_in_requests_and_in_tokens() -> None:
    fleet = Fleet(AdmissionConfig(queue_max_requests=1, queue_max_tokens=500), {"a": 1000})
    assert isinstance(fleet.admit(req(500, 500)), Admit)
    assert isinstance(fleet.admit(req(100, 100)), Queue)
    full = fleet.admit(req(10, 10))
    assert isinstance(full, Refusal) and full.reason is RefusalReason.QUEUE_FULL and full.status == 429
    tokens = Fleet(AdmissionConfig(queue_max_tokens=500), {"a": 1000})
    assert isinstance(tokens.admit(req(500, 500)), Admit)
    too_big = tokens.admit(req(300, 201))
    assert isinstance(too_big, Refusal) and too_big.reason is RefusalReason.QUEUE_FULL


def test_newcomer_does_not_take_room_queued_work_would_get() -> None:
    fleet = Fleet(AdmissionConfig(), {"a": 1000})
    blocker = req(450, 450)
    assert isinstance(fleet.admit(blocker), Admit)
    waiting = req(200, 200)
    assert isinstance(fleet.admit(waiting), Queue)
    fleet.ledger.release(blocker.request_id)  # freed, but the queue has not been pumped yet
    newcomer = req(200, 200)
    newcomer_decision = fleet.admit(newcomer)
    assert isinstance(newcomer_decision, Admit)  # room for both: the queued one is counted first
    squeezed = req(150, 150)
    assert isinstance(fleet.admit(squeezed), Queue)  # 400 reserved + 400 owed to the queue + 300 > 1000
    [dispatch] = fleet.pump()
    assert dispatch.request == waiting
    assert fleet.controller.queue_stats(0.0).requests == 1


def test_higher_priority_newcomer_goes_ahead_of_queued_work() -> None:
    fleet = Fleet(AdmissionConfig(), {"a": 1000})
    blocker = req(300, 300)
    assert isinstance(fleet.admit(blocker), Admit)
    assert isinstance(fleet.admit(req(300, 300)), Queue)
    fleet.ledger.release(blocker.request_id)
    urgent = fleet.admit(req(300, 300, tenant=Tenant("pager", priority=PriorityClass.CRITICAL)))
    assert isinstance(urgent, Admit)
    assert isinstance(fleet.admit(req(300, 300)), Queue)


def test_large_request_neither_blocks_small_ones_forever_nor_starves() -> None:
    """One replica, a steady stream of small requests each finishing 1 s after admission, and one
    request needing most of the cache: small ones flow past it until it has waited the hold time,
    then the cache drains for it, it is dispatched, and small ones flow again."""
    config = AdmissionConfig(head_of_line_max_wait_s=3.0, max_queue_wait_s=60.0)
    fleet = Fleet(config, {"a": 1000})
    running: dict[str, float] = {}
    big = req(450, 450)
    big_dispatched_at = None
    small_admitted_before = small_admitted_after = 0
    for tick in range(200):
        fleet.now_s = tick * 0.1
        for rid, ends in list(running.items()):
            if ends <= fleet.now_s:
                del running[rid]
                for d in fleet.release(rid):
                    running[d.request.request_id] = fleet.now_s + 1.0
                    if d.request == big:
                        big_dispatched_at = fleet.now_s
                    elif big_dispatched_at is None:
                        small_admitted_before += 1
                    else:
                        small_admitted_after += 1
        if tick == 5:
            assert isinstance(fleet.admit(big), Queue)
        small = req(50, 50)
        decision = fleet.admit(small)
        if isinstance(decision, Admit):
            running[small.request_id] = fleet.now_s + 1.0
            if big_dispatched_at is None:
                small_admitted_before += 1
            else:
                small_admitted_after += 1
    assert big_dispatched_at is not None
    assert big_dispatched_at <= 0.5 + config.head_of_line_max_wait_s + 1.0 + 0.2
    assert small_admitted_before > 20
    assert small_admitted_after > 20


def test_tenant_budget_429_and_refund_on_cancel() -> None:
    config = AdmissionConfig(tenants=(TenantConfig(name="metered", tokens_per_min=600),))
    fleet = Fleet(config, {"a": 500}, key_of("metered"))
    tenant = fleet.controller.tenants.identify("k")
    assert tenant is not None and tenant.tokens_per_min == 600
    assert isinstance(fleet.admit(req(250, 250, tenant)), Admit)
    queued = fleet.admit(req(50, 50, tenant))
    assert isinstance(queued, Queue)
    over = fleet.admit(req(50, 50, tenant))
    assert isinstance(over, Refusal)
    assert (over.status, over.reason) == (429, RefusalReason.TENANT_BUDGET)
    # 100 tokens at 10 per second
    assert over.retry_after.headers() == {"retry-after": "10", "retry-after-ms": "10000"}
    assert fleet.controller.cancel(queued.ticket)
    assert not fleet.controller.cancel(queued.ticket)
    assert fleet.controller.queue_stats(0.0).requests == 0
    assert isinstance(fleet.admit(req(50, 50, tenant)), Queue)  # the refund made room in the budget


def test_tenant_budget_wait_is_the_refill_time() -> None:
    config = AdmissionConfig(tenants=(TenantConfig(name="metered", tokens_per_min=60),))
    fleet = Fleet(config, {"a": 10_000}, key_of("metered"))
    tenant = fleet.controller.tenants.identify("k")
    assert tenant is not None
    assert isinstance(fleet.admit(req(30, 30, tenant)), Admit)
    over = fleet.admit(req(10, 10, tenant))
    assert isinstance(over, Refusal) and over.retry_after is not None
    assert over.retry_after.expected_s == pytest.approx(20.0)


def test_queued_requests_expire_with_the_right_reason() -> None:
    fleet = Fleet(AdmissionConfig(max_queue_wait_s=30.0), {"a": 1000})
    assert isinstance(fleet.admit(req(500, 500)), Admit)
    patient = fleet.admit(req(10, 10))
    hasty = fleet.admit(req(10, 10, timeout_s=9.0))
    assert isinstance(patient, Queue) and isinstance(hasty, Queue)
    assert hasty.expires_at_s == 9.0 and patient.expires_at_s == 30.0
    assert fleet.controller.expire(fleet.snapshot(8.9)) == []
    [gone] = fleet.controller.expire(fleet.snapshot(9.0))
    assert gone.ticket == hasty.ticket
    assert (gone.refusal.status, gone.refusal.reason) == (429, RefusalReason.DEADLINE)
    assert gone.refusal.retry_after is not None
    [late] = fleet.controller.expire(fleet.snapshot(30.0))
    assert late.ticket == patient.ticket and late.refusal.reason is RefusalReason.KV_CAPACITY
    assert fleet.controller.queue_stats(30.0).requests == 0


def test_requeue_restores_order() -> None:
    fleet = Fleet(AdmissionConfig(), {"a": 1000})
    blocker = req(500, 500)
    assert isinstance(fleet.admit(blocker), Admit)
    first, second = req(100, 100), req(100, 100)
    q1, q2 = fleet.admit(first), fleet.admit(second)
    assert isinstance(q1, Queue) and isinstance(q2, Queue)
    fleet.ledger.release(blocker.request_id)
    dispatches = fleet.controller.on_capacity_freed(fleet.snapshot(0.0))
    assert [d.ticket for d in dispatches] == [q1.ticket, q2.ticket]
    for d in reversed(dispatches):
        fleet.controller.requeue(d)
    again = fleet.controller.on_capacity_freed(fleet.snapshot(0.0))
    assert [d.ticket for d in again] == [q1.ticket, q2.ticket]


def test_settle_refunds_unused_output_to_the_budget() -> None:
    config = AdmissionConfig(tenants=(TenantConfig(name="metered", tokens_per_min=1000),))
    fleet = Fleet(config, {"a": 10_000}, key_of("metered"))
    tenant = fleet.controller.tenants.identify("k")
    assert tenant is not None
    big = req(100, 900, tenant)
    assert isinstance(fleet.admit(big), Admit)
    assert isinstance(fleet.admit(req(100, 100, tenant)), Refusal)
    fleet.controller.settle(big, used_tokens=150)
    assert isinstance(fleet.admit(req(100, 100, tenant)), Admit)


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 3.0)])
def test_contended_fleet_serves_tokens_in_proportion_to_weights(weights: tuple[float, float]) -> None:
    """Tenant 'long' sends 4000-token requests, tenant 'chat' 100-token ones; both keep a backlog on
    one replica where every request holds its KV for 1 s. Tokens served follow the weights."""
    config = AdmissionConfig(
        max_queue_wait_s=1e6, head_of_line_max_wait_s=2.0, max_active_sequences_per_replica=1000
    )
    fleet = Fleet(config, {"a": 20_000})
    tenants = {"long": (Tenant("long", weights[0]), 2000, 2000), "chat": (Tenant("chat", weights[1]), 50, 50)}
    backlog = {"long": 10, "chat": 400}  # 40k tokens each: both always want more than their share
    queued = {"long": 0, "chat": 0}
    served = {"long": 0, "chat": 0}
    running: dict[str, tuple[float, str]] = {}

    def started(request: AdmissionRequest) -> None:
        name = request.tenant.name
        running[request.request_id] = (fleet.now_s + 1.0, name)
        if fleet.now_s >= 10.0:
            served[name] += request.cost.kv_tokens

    for tick in range(600):
        fleet.now_s = tick * 0.1
        for rid, (ends_s, _) in list(running.items()):
            if ends_s <= fleet.now_s:
                del running[rid]
                for d in fleet.release(rid):
                    queued[d.request.tenant.name] -= 1
                    started(d.request)
        for name, (tenant, prompt, output) in tenants.items():
            while queued[name] < backlog[name]:
                request = req(prompt, output, tenant)
                decision = fleet.admit(request)
                if isinstance(decision, Admit):
                    started(request)
                else:
                    assert isinstance(decision, Queue)
                    queued[name] += 1
    share_chat = served["chat"] / (served["chat"] + served["long"])
    assert share_chat == pytest.approx(weights[1] / sum(weights), abs=0.05)


def slo_fleet(ttft_slo_s: float) -> Fleet:
    """One replica of 1000 KV tokens, full; prefill at 10,000 tokens/s, one token per 10 ms."""
    config = AdmissionConfig(models={MODEL: ModelAdmissionConfig(ttft_slo_s=ttft_slo_s)})
    fleet = Fleet(config, {"a": 1000})
    assert isinstance(fleet.admit(req(500, 500)), Admit)
    return fleet


def test_a_request_is_queued_only_while_its_wait_and_prefill_meet_the_ttft_objective() -> None:
    queued = slo_fleet(ttft_slo_s=10.0).admit(req(1000 - 500, 100))
    assert isinstance(queued, Queue)
    assert queued.expires_at_s == pytest.approx(10.0 - 500 / 10_000), "the objective less its prefill"
    refused = slo_fleet(ttft_slo_s=1.0).admit(req(500, 100))
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.TTFT_SLO
    assert refused.retry_after is not None and refused.retry_after.expected_s > 1.0 - 500 / 10_000
    assert "time-to-first-token objective" in refused.message


def test_a_tenants_own_ttft_objective_takes_the_place_of_the_models() -> None:
    """The model allows 10 s; an interactive tenant's 1 s refuses at once what would queue, a batch
    tenant's 60 s queues (up to the queue's own limit) what the model's objective would refuse."""
    fleet = slo_fleet(ttft_slo_s=10.0)
    interactive = Tenant("interactive", ttft_slo_s=1.0)
    refused = fleet.admit(req(500, 100, interactive))
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.TTFT_SLO
    queued = fleet.admit(req(500, 100))
    assert isinstance(queued, Queue)
    assert queued.expires_at_s == pytest.approx(10.0 - 500 / 10_000), "no tenant objective: the model's"
    patient = slo_fleet(ttft_slo_s=0.5)
    assert isinstance(patient.admit(req(500, 100)), Refusal)
    waiting = patient.admit(req(500, 100, Tenant("batch", ttft_slo_s=60.0)))
    assert isinstance(waiting, Queue)
    assert waiting.expires_at_s == pytest.approx(30.0), "the queue's own limit still bounds it"


def test_a_tenants_ttft_objective_comes_from_its_config() -> None:
    config = AdmissionConfig(tenants=(TenantConfig(name="interactive", ttft_slo_s=0.5),))
    tenants = TenantDirectory(config, key_of("interactive"))
    tenant = AdmissionController(config, InMemoryLedger(), tenants).tenants.identify("k")
    assert tenant is not None and tenant.ttft_slo_s == 0.5


def test_a_request_that_fits_at_once_is_admitted_whatever_its_own_prefill() -> None:
    config = AdmissionConfig(models={MODEL: ModelAdmissionConfig(ttft_slo_s=0.01)})
    assert isinstance(Fleet(config, {"a": 100_000}).admit(req(50_000, 10)), Admit)


def test_a_queued_request_is_refused_when_its_objective_runs_out_not_forwarded_late() -> None:
    fleet = slo_fleet(ttft_slo_s=10.0)
    assert isinstance(fleet.admit(req(500, 100)), Queue)
    assert fleet.controller.expire(fleet.snapshot(9.9)) == []
    [late] = fleet.controller.expire(fleet.snapshot(9.96))
    assert late.refusal.reason is RefusalReason.TTFT_SLO


def test_an_admitted_request_no_replica_took_gives_back_its_budget() -> None:
    config = AdmissionConfig(tenants=(TenantConfig(name="metered", tokens_per_min=1000),))
    fleet = Fleet(config, {"a": 100_000}, key_of("metered"))
    tenant = fleet.controller.tenants.identify("k")
    assert tenant is not None
    first = req(500, 400, tenant)
    assert isinstance(fleet.controller.admit(first, fleet.snapshot()), Admit)
    assert isinstance(fleet.admit(req(100, 100, tenant)), Refusal), "900 + 200 of 1000 per minute"
    fleet.controller.unadmit(first)
    assert isinstance(fleet.admit(req(100, 100, tenant)), Admit)


def test_an_admitted_request_routing_defers_joins_the_queue_and_goes_at_the_next_dispatch() -> None:
    """Routing would rather it wait for the replica caching its prefix: it queues as if it had found
    no room (its fair-share charge waits for its dispatch) and the next dispatch offers it again."""
    fleet = Fleet(AdmissionConfig(), {"a": 1000, "b": 1000})
    first = req(100, 100)
    assert isinstance(fleet.controller.admit(first, fleet.snapshot()), Admit)
    queued = fleet.controller.defer(first, fleet.now_s)
    assert isinstance(queued, Queue) and queued.expires_at_s > fleet.now_s
    assert fleet.controller.queue_stats(fleet.now_s).requests == 1
    # A newcomer that fits is still admitted at once: the deferred one is placed ahead of it.
    assert isinstance(fleet.admit(req(100, 100)), Admit)
    assert [d.request.request_id for d in fleet.pump()] == [first.request_id]
    assert fleet.controller.queue_stats(fleet.now_s).requests == 0
