from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from admission.cost import CostEstimate
from admission.ledger import InMemoryLedger
from vocabulary.replica import ReplicaLoad

REPLICAS = ("r0", "r1", "r2")
REQUEST_IDS = tuple(f"q{i}" for i in range(8))


def cost(prompt: int, max_output: int) -> CostEstimate:
    return CostEstimate("m", prompt, max_output, 131072)


def test_a_prompt_prefix_shared_on_one_replica_is_reserved_once_until_its_last_holder_ends() -> None:
    system = tuple(range(100))
    ledger = InMemoryLedger(block_tokens=16)
    assert ledger.reserve("a", "r0", cost(1_700, 100), 0.0, (*system, 500, 501))
    assert ledger.load("r0").reserved_kv_tokens == 1_800
    assert ledger.shared_tokens("r0", (*system, 900)) == 1_600
    assert ledger.shared_tokens("r1", (*system, 900)) == 0
    assert ledger.reserve("b", "r0", cost(1_650, 100), 0.0, (*system, 600))
    assert ledger.load("r0").reserved_kv_tokens == 1_800 + 1_750 - 1_600
    assert ledger.reserve("c", "r1", cost(1_650, 100), 0.0, (*system, 600))
    assert ledger.load("r1").reserved_kv_tokens == 1_750
    # The first holder ends first: the shared blocks stay, charged to the one still using them.
    assert ledger.release("a")
    assert ledger.load("r0").reserved_kv_tokens == 1_750
    assert ledger.shared_tokens("r0", (*system, 900)) == 1_600
    assert ledger.release("b") and ledger.release("c")
    assert ledger.totals() == ReplicaLoad()
    assert ledger.shared_tokens("r0", system) == 0


def test_lifecycle_moves_prefill_to_decode_and_back_to_zero() -> None:
    ledger = InMemoryLedger()
    assert ledger.reserve("a", "r0", cost(100, 50), now_s=0.0)
    assert ledger.load("r0") == ReplicaLoad(100, 1, 50, 150)
    assert ledger.first_token("a")
    assert ledger.load("r0") == ReplicaLoad(0, 1, 50, 150)
    assert ledger.produced("a", 20)
    assert ledger.load("r0") == ReplicaLoad(0, 1, 30, 150)
    assert ledger.release("a")
    assert ledger.load("r0") == ReplicaLoad() == ledger.totals()


def test_release_is_idempotent() -> None:
    ledger = InMemoryLedger()
    ledger.reserve("a", "r0", cost(10, 10), 0.0)
    ledger.reserve("b", "r0", cost(5, 5), 0.0)
    assert ledger.release("a") is True
    assert ledger.release("a") is False
    assert ledger.totals() == ReplicaLoad(5, 1, 5, 10)


def test_duplicate_reserve_changes_nothing() -> None:
    ledger = InMemoryLedger()
    assert ledger.reserve("a", "r0", cost(10, 10), 0.0)
    assert not ledger.reserve("a", "r1", cost(99, 99), 0.0)
    assert ledger.totals() == ReplicaLoad(10, 1, 10, 20)


def test_produced_is_a_running_total_clamped_to_the_cap() -> None:
    ledger = InMemoryLedger()
    ledger.reserve("a", "r0", cost(10, 10), 0.0)
    assert ledger.produced("a", 4)
    assert not ledger.produced("a", 3)  # a late, smaller report changes nothing
    assert ledger.produced("a", 50)
    assert ledger.load("r0").remaining_decode_tokens == 0
    assert not ledger.produced("missing", 1)


def test_leases_expire_unless_renewed() -> None:
    ledger = InMemoryLedger(lease_s=10.0)
    ledger.reserve("a", "r0", cost(1, 1), 0.0)
    ledger.reserve("b", "r0", cost(1, 1), 0.0)
    assert ledger.renew("b", 8.0)
    expired = ledger.expire(10.0)
    assert [r.request_id for r in expired] == ["a"]
    assert ledger.get("b") is not None
    assert ledger.expire(17.9) == []
    assert [r.request_id for r in ledger.expire(18.0)] == ["b"]
    assert ledger.totals() == ReplicaLoad()
    assert not ledger.release("b")


def test_replica_death_releases_only_its_reservations() -> None:
    ledger = InMemoryLedger()
    ledger.reserve("a", "r0", cost(1, 2), 0.0)
    ledger.reserve("b", "r1", cost(3, 4), 0.0)
    assert [r.request_id for r in ledger.release_replica("r0")] == ["a"]
    assert ledger.release_replica("r0") == []
    assert ledger.totals() == ledger.load("r1") == ReplicaLoad(3, 1, 4, 7)


class LedgerMachine(RuleBasedStateMachine):
    """Any order of events, duplicates included: per-replica loads always equal the sum of what the
    model says is held, and with nothing in flight every total is zero."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = InMemoryLedger(lease_s=5.0)
        self.now_s = 0.0
        self.held: dict[str, tuple[str, int, int, bool, int, tuple[int, ...]]] = {}

    @rule(
        request_id=st.sampled_from(REQUEST_IDS),
        replica_id=st.sampled_from(REPLICAS),
        prompt=st.integers(0, 5000),
        max_output=st.integers(0, 5000),
        family=st.integers(0, 2),
        block_share=st.floats(0.0, 1.0),
    )
    def reserve(
        self, request_id: str, replica_id: str, prompt: int, max_output: int, family: int, block_share: float
    ) -> None:
        """Prompts of one family share their leading blocks (chained hashes), as chats over one
        system prompt do; ``block_share`` of the prompt's full blocks are named."""
        blocks = tuple(1000 * family + i for i in range(int(block_share * (prompt // 16))))
        took = self.ledger.reserve(request_id, replica_id, cost(prompt, max_output), self.now_s, blocks)
        assert took == (request_id not in self.held)
        if took:
            self.held[request_id] = (replica_id, prompt, max_output, False, 0, blocks)

    @rule(request_id=st.sampled_from(REQUEST_IDS))
    def first_token(self, request_id: str) -> None:
        self.ledger.first_token(request_id)
        if request_id in self.held:
            replica_id, prompt, max_output, _, produced, blocks = self.held[request_id]
            self.held[request_id] = (replica_id, prompt, max_output, True, produced, blocks)

    @rule(request_id=st.sampled_from(REQUEST_IDS), total=st.integers(0, 6000))
    def produced(self, request_id: str, total: int) -> None:
        self.ledger.produced(request_id, total)
        if request_id in self.held:
            replica_id, prompt, max_output, first, produced, blocks = self.held[request_id]
            new_total = min(max(total, produced), max_output)
            self.held[request_id] = (replica_id, prompt, max_output, first or total > 0, new_total, blocks)

    @rule(request_id=st.sampled_from(REQUEST_IDS))
    def release(self, request_id: str) -> None:
        assert self.ledger.release(request_id) == (request_id in self.held)
        self.held.pop(request_id, None)

    @rule(request_id=st.sampled_from(REQUEST_IDS))
    def renew(self, request_id: str) -> None:
        assert self.ledger.renew(request_id, self.now_s) == (request_id in self.held)

    @rule(step_s=st.floats(0.0, 4.0))
    def tick_and_expire(self, step_s: float) -> None:
        self.now_s += step_s
        for gone in self.ledger.expire(self.now_s):
            assert gone.lease_expires_at_s <= self.now_s
            del self.held[gone.request_id]

    @rule(replica_id=st.sampled_from(REPLICAS))
    def replica_dies(self, replica_id: str) -> None:
        for gone in self.ledger.release_replica(replica_id):
            assert self.held.pop(gone.request_id)[0] == replica_id

    @precondition(lambda self: bool(self.held))
    @rule()
    def release_everything_twice(self) -> None:
        for request_id in list(self.held):
            assert self.ledger.release(request_id)
            assert not self.ledger.release(request_id)
        self.held.clear()
        assert self.ledger.totals() == ReplicaLoad()

    @invariant()
    def loads_match_the_model(self) -> None:
        """Reserved KV: each distinct named block once, plus each request's worst case beyond its
        named blocks."""
        for replica_id in REPLICAS:
            mine = [h for h in self.held.values() if h[0] == replica_id]
            distinct = {block for h in mine for block in h[5]}
            assert self.ledger.load(replica_id) == ReplicaLoad(
                pending_prompt_tokens=sum(h[1] for h in mine if not h[3]),
                resident_sequences=len(mine),
                remaining_decode_tokens=sum(h[2] - h[4] for h in mine),
                reserved_kv_tokens=16 * len(distinct) + sum(h[1] + h[2] - 16 * len(h[5]) for h in mine),
            )
            assert len(self.ledger.resident(replica_id)) == len(mine)
            for family in range(3):
                prompt = tuple(1000 * family + i for i in range(400))
                held = sum(1 for block in prompt if block in distinct)
                assert self.ledger.shared_tokens(replica_id, prompt) == 16 * held

    @invariant()
    def nothing_in_flight_means_all_zero(self) -> None:
        if not self.held:
            assert self.ledger.totals() == ReplicaLoad()


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
