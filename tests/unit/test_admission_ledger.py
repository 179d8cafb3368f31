from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvgate.admission.cost import CostEstimate
from kvgate.admission.ledger import InMemoryLedger
from kvgate.routing.prefix_hash import block_hashes
from kvgate.sim.engine import Engine
from kvgate.sim.profile import resolve_profile
from kvgate.vocabulary.capacity import fits_sharing
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

REPLICAS = ("r0", "r1", "r2")
REQUEST_IDS = tuple(f"q{i}" for i in range(8))


def cost(prompt: int, max_output: int) -> CostEstimate:
    return CostEstimate("m", prompt, max_output, 131072)


def test_a_computed_prompt_prefix_is_reserved_once_on_its_replica_until_its_last_holder_ends() -> None:
    system = tuple(range(100))
    ledger = InMemoryLedger(block_tokens=16)
    assert ledger.reserve("a", "r0", cost(1_700, 100), 0.0, (*system, 500, 501))
    # 1,800 tokens take 113 whole blocks.
    assert ledger.load("r0").reserved_kv_tokens == 1_808
    # Not computed yet: a second request with the same prompt computes it too and pays for it.
    assert ledger.shared_tokens("r0", (*system, 900), 1_650) == 0
    assert ledger.first_token("a")
    assert ledger.shared_tokens("r0", (*system, 900), 1_650) == 1_600
    assert ledger.shared_tokens("r1", (*system, 900), 1_650) == 0
    assert ledger.reserve("b", "r0", cost(1_650, 100), 0.0, (*system, 600))
    # b's 1,750 tokens take 110 blocks, 100 of them shared.
    assert ledger.load("r0").reserved_kv_tokens == 1_808 + 1_760 - 1_600
    assert ledger.reserve("c", "r1", cost(1_650, 100), 0.0, (*system, 600))
    assert ledger.load("r1").reserved_kv_tokens == 1_760
    # The first holder ends first: the shared blocks stay, held by the one still using them.
    assert ledger.release("a")
    assert ledger.load("r0").reserved_kv_tokens == 1_760
    assert ledger.shared_tokens("r0", (*system, 900), 1_650) == 1_600
    assert ledger.release("b") and ledger.release("c")
    assert ledger.totals() == ReplicaLoad()
    assert ledger.shared_tokens("r0", system, 1_600) == 0


def test_a_prompt_is_never_credited_the_block_holding_its_last_token() -> None:
    """vLLM computes a prompt's last token again to produce the first output token, so a prompt of
    exactly 1,600 tokens (100 full blocks) can hit 99 of them; one token longer, all 100."""
    system = tuple(range(100))
    ledger = InMemoryLedger(block_tokens=16)
    assert ledger.reserve("a", "r0", cost(1_601, 99), 0.0, system)
    assert ledger.first_token("a")
    assert ledger.load("r0").reserved_kv_tokens == 1_712
    assert ledger.shared_tokens("r0", system, 1_601) == 1_600
    assert ledger.shared_tokens("r0", system, 1_600) == 1_584
    assert ledger.reserve("b", "r0", cost(1_600, 100), 0.0, system)
    # b's 1,700 tokens take 107 blocks, 99 of them shared; its last prompt block is its own copy.
    assert ledger.load("r0").reserved_kv_tokens == 1_712 + 1_712 - 1_584
    assert ledger.release("a")
    assert ledger.load("r0").reserved_kv_tokens == 1_712
    assert ledger.release("b")
    assert ledger.totals() == ReplicaLoad()


def admit_and_run(
    kv_capacity_tokens: int, prompts: list[list[int]], max_tokens: int
) -> tuple[list[int], Engine]:
    """Offer each prompt in turn to one simulated replica, through the room check admission and
    routing ask and the ledger, each once the ones before it have their first token (so their
    prompt blocks are shared); run what was admitted to the end. Returns the admitted indexes."""
    engine = Engine(resolve_profile(overrides={"warmup_s": 0, "kv_capacity_tokens": kv_capacity_tokens}))
    ledger = InMemoryLedger(block_tokens=engine.profile.block_size_tokens)
    admitted: list[int] = []
    now_s = 0.0
    for index, prompt in enumerate(prompts):
        request_cost = cost(len(prompt), max_tokens)
        hashes = block_hashes(prompt, engine.profile.block_size_tokens)
        view = ReplicaView(
            "r0",
            "sim://r0",
            "pool",
            Role.MIXED,
            frozenset({"m"}),
            kv_capacity_tokens,
            16,
            True,
            0.0,
            ledger.load("r0"),
        )
        if fits_sharing(view, request_cost.kv_tokens, 1, 16, hashes, ledger, len(prompt)):
            ledger.reserve(f"q{index}", "r0", request_cost, now_s, hashes)
            engine.add_request(f"q{index}", prompt, max_tokens, now_s, ignore_eos=True)
            admitted.append(index)
            while engine.has_work and not any(
                r.request_id == f"q{index}" for r in engine.step(now_s).produced
            ):
                now_s += 0.01
            ledger.first_token(f"q{index}")
    while engine.has_work:
        now_s = engine.step(now_s).end_s
    assert ledger.load("r0").reserved_kv_tokens <= kv_capacity_tokens
    return admitted, engine


def test_sequences_hold_whole_blocks_so_fewer_fit_than_their_tokens_say() -> None:
    """Three requests of 10 prompt and 10 output tokens are 60 tokens, under a 64-token replica, but
    each sequence holds two 16-token blocks and the replica has four: counted in tokens all three
    were admitted and the replica preempted once; counted in blocks the third waits."""
    prompts = [list(range(100 * i, 100 * i + 10)) for i in range(3)]
    admitted, engine = admit_and_run(64, prompts, 10)
    assert admitted == [0, 1]
    assert engine.stats.num_preemptions == 0


def test_a_prompt_of_whole_blocks_is_computed_again_in_its_last_block() -> None:
    """Three requests with one 32-token prompt (two full blocks) and 32 output tokens, four blocks
    each, on a replica of eight blocks: the first takes four; each later one hits only the first
    block (vLLM computes the last prompt token again) and takes three of its own. Crediting both
    prompt blocks admitted all three (64 + 32 + 32 tokens) onto ten blocks of work, and the replica
    preempted twice; crediting the one it hits, the third waits."""
    prompt = list(range(32))
    admitted, engine = admit_and_run(128, [prompt, prompt, prompt], 32)
    assert admitted == [0, 1]
    assert engine.stats.num_preemptions == 0


def test_a_copy_of_a_shared_block_stays_reserved_until_the_block_is_no_longer_shared() -> None:
    system = tuple(range(4))
    ledger = InMemoryLedger(block_tokens=16)
    assert ledger.reserve("a", "r0", cost(80, 16), 0.0, (*system, 100))
    assert ledger.reserve("b", "r0", cost(96, 160), 0.0, (*system, 200, 201))
    assert ledger.load("r0").reserved_kv_tokens == 96 + 256
    # Both computed the system prompt; b's first token was read first, so a holds a copy of it.
    assert ledger.first_token("b") and ledger.first_token("a")
    assert ledger.load("r0").reserved_kv_tokens == 96 + 256
    # a's copy is free once a ends, but still cached: counted while the system prompt is shared.
    assert ledger.release("a")
    assert ledger.load("r0").reserved_kv_tokens == 256 + 64
    assert ledger.reserve("c", "r0", cost(96, 128), 0.0, (*system, 300, 301))
    assert ledger.load("r0").reserved_kv_tokens == 256 + 64 + 224 - 64
    assert ledger.release("b")
    assert ledger.load("r0").reserved_kv_tokens == 64 + 64 + 224 - 64
    assert ledger.release("c")
    assert ledger.totals() == ReplicaLoad()


@pytest.mark.parametrize("reversed_order", [False, True], ids=["engine order", "reversed"])
def test_a_prefix_computed_twice_at_once_is_reserved_whichever_first_token_is_read_first(
    reversed_order: bool,
) -> None:
    """Two requests with one new 64-token system prompt start together on a replica of 26 blocks and
    both compute it, their first tokens in one step. The engine caches the first one's copy; the
    gateway reads the two streams in either order and may take the second one's copy for the shared
    one. When the first ends, its copy is free but still cached, and a third request over that
    system prompt is given it back: crediting the third for the shared blocks then admitted 30
    blocks of work onto 26 and the replica preempted. Counting the ended copy, the third waits."""
    engine = Engine(resolve_profile(overrides={"warmup_s": 0, "kv_capacity_tokens": 26 * 16}))
    ledger = InMemoryLedger(block_tokens=16)
    system = list(range(64))
    prompts = {
        "a": system + list(range(1000, 1016)),
        "b": system + list(range(2000, 2032)),
        "c": system + list(range(3000, 3032)),
    }
    max_tokens = {"a": 16, "b": 160, "c": 128}
    now_s = 0.0

    def admit(request_id: str) -> bool:
        prompt, request_cost = prompts[request_id], cost(len(prompts[request_id]), max_tokens[request_id])
        hashes = block_hashes(prompt, 16)
        view = ReplicaView(
            "r0", "sim://r0", "pool", Role.MIXED, frozenset({"m"}), 26 * 16, 16, True, 0.0, ledger.load("r0")
        )
        if not fits_sharing(view, request_cost.kv_tokens, 1, 16, hashes, ledger, len(prompt)):
            return False
        ledger.reserve(request_id, "r0", request_cost, now_s, hashes)
        engine.add_request(request_id, prompt, max_tokens[request_id], now_s, ignore_eos=True)
        return True

    def run_until_done(request_id: str | None) -> None:
        nonlocal now_s
        while engine.has_work:
            result = engine.step(now_s)
            now_s = result.end_s
            produced = list(reversed(result.produced)) if reversed_order else list(result.produced)
            for sequence in produced:
                ledger.produced(sequence.request_id, sequence.num_output_tokens)
                if sequence.finish_reason is not None:
                    ledger.release(sequence.request_id)
            if any(s.request_id == request_id and s.finish_reason for s in produced):
                return

    assert admit("a") and admit("b")
    run_until_done("a")
    admitted_c = admit("c")
    run_until_done(None)
    assert engine.stats.num_preemptions == 0
    assert admitted_c is False
    assert ledger.totals() == ReplicaLoad()


def test_lifecycle_moves_prefill_to_decode_and_back_to_zero() -> None:
    ledger = InMemoryLedger()
    assert ledger.reserve("a", "r0", cost(100, 50), now_s=0.0)
    # 150 tokens of KV take 10 whole 16-token blocks.
    assert ledger.load("r0") == ReplicaLoad(100, 1, 50, 160, 100)
    assert ledger.first_token("a")
    assert ledger.load("r0") == ReplicaLoad(0, 1, 50, 160)
    assert ledger.produced("a", 20)
    assert ledger.load("r0") == ReplicaLoad(0, 1, 30, 160)
    assert ledger.release("a")
    assert ledger.load("r0") == ReplicaLoad() == ledger.totals()


def test_pending_prefill_work_counts_only_what_the_cache_was_not_expected_to_serve() -> None:
    ledger = InMemoryLedger()
    assert ledger.reserve("a", "r0", cost(1000, 10), 0.0, cached_prompt_tokens=700)
    assert ledger.reserve("b", "r0", cost(200, 10), 0.0, cached_prompt_tokens=5000)
    load = ledger.load("r0")
    assert (load.pending_prompt_tokens, load.pending_uncached_tokens) == (1200, 300)
    assert ledger.produced("a", 1)
    assert ledger.load("r0").pending_uncached_tokens == 0, "b's cached tokens are capped at its prompt"
    assert ledger.release("a") and ledger.release("b")
    assert ledger.totals() == ReplicaLoad()


def test_release_is_idempotent() -> None:
    ledger = InMemoryLedger()
    ledger.reserve("a", "r0", cost(10, 10), 0.0)
    ledger.reserve("b", "r0", cost(5, 5), 0.0)
    assert ledger.release("a") is True
    assert ledger.release("a") is False
    assert ledger.totals() == ReplicaLoad(5, 1, 5, 16, 5)


def test_duplicate_reserve_changes_nothing() -> None:
    ledger = InMemoryLedger()
    assert ledger.reserve("a", "r0", cost(10, 10), 0.0)
    assert not ledger.reserve("a", "r1", cost(99, 99), 0.0)
    assert ledger.totals() == ReplicaLoad(10, 1, 10, 32, 10)


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
    assert ledger.totals() == ledger.load("r1") == ReplicaLoad(3, 1, 4, 16, 3)


def cached(prompt_tokens: int) -> int:
    """The prompt tokens the machine's reservations expect from the prefix cache: a third."""
    return prompt_tokens // 3


class LedgerMachine(RuleBasedStateMachine):
    """Any order of events, duplicates included: per-replica loads always equal the sum of what the
    model says is held, and with nothing in flight every total is zero."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = InMemoryLedger(lease_s=5.0)
        self.now_s = 0.0
        self.held: dict[str, tuple[str, int, int, bool, int, tuple[int, ...]]] = {}
        self.shared: dict[str, dict[int, int]] = {replica_id: {} for replica_id in REPLICAS}
        """The model of shared blocks: per replica, block -> reservations holding it."""
        self.holds: dict[str, list[int]] = {}
        self.reserved_at_s: dict[str, float] = {}
        self.shared_by: dict[str, dict[int, float]] = {replica_id: {} for replica_id in REPLICAS}
        """Per replica, block -> when the reservation that made it shared was reserved."""
        self.copies: dict[str, list[int]] = {}
        """Each reservation's copies of shared blocks that its replica may hand out for them: of
        blocks made shared by a reservation reserved no earlier than itself."""
        self.orphans: dict[str, set[int]] = {replica_id: set() for replica_id in REPLICAS}
        """Per replica, still-shared blocks with such a copy whose reservation ended."""

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
        took = self.ledger.reserve(
            request_id, replica_id, cost(prompt, max_output), self.now_s, blocks, cached(prompt)
        )
        assert took == (request_id not in self.held)
        if took:
            self.held[request_id] = (replica_id, prompt, max_output, False, 0, blocks)
            self.reserved_at_s[request_id] = self.now_s
            pool = self.shared[replica_id]
            holds = []
            for block in blocks[: max(0, prompt - 1) // 16]:
                if block not in pool:
                    break
                pool[block] += 1
                holds.append(block)
            self.holds[request_id] = holds

    def computed(self, request_id: str) -> None:
        """The model of a first token: the prompt's blocks nobody shares become shared, held by it;
        of those someone shares already, it holds a copy of its own."""
        replica_id, _, _, first, _, blocks = self.held[request_id]
        if first:
            return
        pool, holds, shared_by = self.shared[replica_id], self.holds[request_id], self.shared_by[replica_id]
        reserved_at_s = self.reserved_at_s[request_id]
        copies = self.copies[request_id] = []
        for block in blocks[len(holds) :]:
            if block not in pool:
                pool[block] = 1
                shared_by[block] = reserved_at_s
                holds.append(block)
            elif shared_by[block] >= reserved_at_s:
                copies.append(block)

    def dropped(self, request_id: str) -> None:
        """The model of a release: a copy of a block still shared stays counted until the block is not."""
        replica_id = self.held.pop(request_id)[0]
        pool, orphans = self.shared[replica_id], self.orphans[replica_id]
        for block in self.holds.pop(request_id):
            pool[block] -= 1
            if not pool[block]:
                del pool[block]
                del self.shared_by[replica_id][block]
                orphans.discard(block)
        for block in self.copies.pop(request_id, []):
            if block in pool:
                orphans.add(block)

    @rule(request_id=st.sampled_from(REQUEST_IDS))
    def first_token(self, request_id: str) -> None:
        self.ledger.first_token(request_id)
        if request_id in self.held:
            self.computed(request_id)
            replica_id, prompt, max_output, _, produced, blocks = self.held[request_id]
            self.held[request_id] = (replica_id, prompt, max_output, True, produced, blocks)

    @rule(request_id=st.sampled_from(REQUEST_IDS), total=st.integers(0, 6000))
    def produced(self, request_id: str, total: int) -> None:
        self.ledger.produced(request_id, total)
        if request_id in self.held:
            if total > 0:
                self.computed(request_id)
            replica_id, prompt, max_output, first, produced, blocks = self.held[request_id]
            new_total = min(max(total, produced), max_output)
            self.held[request_id] = (replica_id, prompt, max_output, first or total > 0, new_total, blocks)

    @rule(request_id=st.sampled_from(REQUEST_IDS))
    def release(self, request_id: str) -> None:
        assert self.ledger.release(request_id) == (request_id in self.held)
        if request_id in self.held:
            self.dropped(request_id)

    @rule(request_id=st.sampled_from(REQUEST_IDS))
    def renew(self, request_id: str) -> None:
        assert self.ledger.renew(request_id, self.now_s) == (request_id in self.held)

    @rule(step_s=st.floats(0.0, 4.0))
    def tick_and_expire(self, step_s: float) -> None:
        self.now_s += step_s
        for gone in self.ledger.expire(self.now_s):
            assert gone.lease_expires_at_s <= self.now_s
            self.dropped(gone.request_id)

    @rule(replica_id=st.sampled_from(REPLICAS))
    def replica_dies(self, replica_id: str) -> None:
        for gone in self.ledger.release_replica(replica_id):
            assert self.held[gone.request_id][0] == replica_id
            self.dropped(gone.request_id)

    @precondition(lambda self: bool(self.held))
    @rule()
    def release_everything_twice(self) -> None:
        for request_id in list(self.held):
            assert self.ledger.release(request_id)
            assert not self.ledger.release(request_id)
            self.dropped(request_id)
        assert self.ledger.totals() == ReplicaLoad()

    @invariant()
    def loads_match_the_model(self) -> None:
        """Reserved KV: each shared block once, plus each request's worst case beyond the shared
        blocks it holds; a prompt's shared tokens are its leading shared blocks."""
        for replica_id in REPLICAS:
            mine = {r: h for r, h in self.held.items() if h[0] == replica_id}
            pool = self.shared[replica_id]
            assert self.ledger.load(replica_id) == ReplicaLoad(
                pending_prompt_tokens=sum(h[1] for h in mine.values() if not h[3]),
                resident_sequences=len(mine),
                remaining_decode_tokens=sum(h[2] - h[4] for h in mine.values()),
                reserved_kv_tokens=16 * len(pool)
                + 16 * len(self.orphans[replica_id])
                + sum(-(-(h[1] + h[2]) // 16) * 16 - 16 * len(self.holds[r]) for r, h in mine.items()),
                pending_uncached_tokens=sum(h[1] - cached(h[1]) for h in mine.values() if not h[3]),
            )
            assert len(self.ledger.resident(replica_id)) == len(mine)
            for family in range(3):
                prompt = [1000 * family + i for i in range(400)]
                leading = next((i for i, block in enumerate(prompt) if block not in pool), len(prompt))
                assert self.ledger.shared_tokens(replica_id, prompt, 16 * len(prompt) + 1) == 16 * leading
                assert self.ledger.shared_tokens(replica_id, prompt[:leading], 16 * leading) == 16 * max(
                    0, leading - 1
                )

    @invariant()
    def nothing_in_flight_means_all_zero(self) -> None:
        if not self.held:
            assert self.ledger.totals() == ReplicaLoad()


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
