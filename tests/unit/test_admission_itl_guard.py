"""The ITL guard learns a replica's latency line from its streams and answers the most sequences
that keep the predicted latency within the objective, never above the static guard nor below the
floor, not moved by a few streams or by a replica that always runs the same load, and shedding an
overloaded replica's load in proportion rather than all at once."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.admission.controller import AdmissionController
from kvgate.admission.itl_guard import MIN_OBSERVATIONS, ItlFit, ItlGuard
from kvgate.admission.ledger import InMemoryLedger
from kvgate.config.admission import AdmissionConfig, ModelAdmissionConfig
from kvgate.vocabulary.replica import ReplicaView, Role

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OTHER = "Qwen/Qwen2.5-7B-Instruct"
INTERCEPT_S = 0.006
SLOPE_S = 0.0015
"""The synthetic replica: 6 ms per step plus 1.5 ms per resident sequence."""


def line_s(sequences: float) -> float:
    return INTERCEPT_S + SLOPE_S * sequences


def fed(pairs: list[tuple[float, float]]) -> ItlFit:
    fit = ItlFit()
    for sequences, itl_s in pairs:
        fit.observe(sequences, itl_s)
    return fit


def test_a_known_line_is_learned_and_gives_the_limit_it_implies() -> None:
    rng = random.Random(7)
    loads = [rng.randint(1, 16) for _ in range(200)]
    fit = fed([(x, line_s(x)) for x in loads])
    assert fit.intercept_s == pytest.approx(INTERCEPT_S, rel=1e-3)
    assert fit.slope_s == pytest.approx(SLOPE_S, rel=1e-3)
    # (0.03 - 0.006) / 0.0015 = 16 sequences exactly at the objective; 0.0299 leaves room for 15.
    assert fit.limit(0.0301, 1, 128) == 16
    assert fit.limit(0.0299, 1, 128) == 15


def test_noisy_streams_still_converge_to_the_limit() -> None:
    rng = random.Random(11)
    pairs = []
    for _ in range(2000):
        x = rng.uniform(1, 16)
        pairs.append((x, line_s(x) * rng.uniform(0.9, 1.1)))
    fit = fed(pairs)
    assert fit.limit(0.03, 1, 128) in (15, 16, 17)


def test_the_limit_stays_at_the_ceiling_until_enough_streams_were_seen() -> None:
    fit = fed([(x, line_s(x)) for x in range(1, MIN_OBSERVATIONS)])
    assert fit.observations == MIN_OBSERVATIONS - 1
    assert fit.limit(0.03, 1, 128) == 128
    fit.observe(MIN_OBSERVATIONS, line_s(MIN_OBSERVATIONS))
    assert fit.limit(0.03, 1, 128) < 128


def test_a_few_streams_cannot_collapse_the_limit() -> None:
    """Two streams ten times slower than the rest, at one sequence more: the limit stays at twice
    the load seen or more, room for the streams that show whether the slope is real."""
    fit = fed([(8, line_s(8))] * 30)
    assert fit.limit(0.03, 1, 128) == 128
    fit.observe(9, 10 * line_s(9))
    fit.observe(9, 10 * line_s(9))
    assert fit.limit(0.03, 1, 128) >= 16


def test_the_slope_survives_a_replica_held_at_one_load() -> None:
    """Held at its limit, a replica runs the same sequences stream after stream: the line keeps
    its slope rather than forgetting it and opening the replica to everything."""
    rng = random.Random(3)
    fit = fed([(x, line_s(x)) for x in (rng.randint(1, 16) for _ in range(100))])
    before = fit.limit(0.0305, 1, 128)
    assert before == 16
    for _ in range(1000):
        fit.observe(before, line_s(before))
    assert fit.slope_s == pytest.approx(SLOPE_S, rel=1e-2)
    assert fit.limit(0.0305, 1, 128) == before


def test_the_intercept_follows_a_replica_that_became_slower() -> None:
    rng = random.Random(5)
    fit = fed([(x, line_s(x)) for x in (rng.randint(1, 12) for _ in range(200))])
    assert fit.limit(0.0305, 1, 128) == 16  # (0.0305 - 0.006) / 0.0015 = 16.3
    for _ in range(200):
        x = rng.randint(1, 12)
        fit.observe(x, line_s(x) + 0.006)
    assert fit.limit(0.0305, 1, 128) == 12  # (0.0305 - 0.012) / 0.0015 = 12.3


def test_a_replica_over_its_objective_sheds_in_proportion_not_to_the_floor() -> None:
    """Every stream so far ran at 32 sequences, at 54 ms: the line cannot tell fixed cost from
    per-sequence cost, and a flat line would say the floor. The load sheds by 30 / 54 instead."""
    fit = fed([(32, line_s(32))] * 30)
    assert fit.intercept_s > 0.03
    assert fit.limit(0.03, 1, 128) == 17  # 32 * 0.03 / 0.054 = 17.8


@pytest.mark.parametrize(
    ("intercept_s", "slope_s", "objective_s", "expected"),
    [(0.006, 0.0015, 0.0305, 16), (0.006, 0.00007, 0.010, 57)],
)
def test_a_replica_run_at_its_limit_steps_down_onto_the_objective(
    intercept_s: float, slope_s: float, objective_s: float, expected: int
) -> None:
    """A closed loop: the replica runs as many sequences as the limit allows (demand is 200), its
    streams seeing that load and a few less as they come and go. Whether step time is mostly
    per-sequence (the first line) or mostly fixed (the second, a memory-bound decode), the limit
    comes down onto the line's limit from above and stays there, never under it on the way."""
    fit = ItlFit()
    limits = []
    for _ in range(60):
        limit = fit.limit(objective_s, 1, 256)
        limits.append(limit)
        running = min(200, limit)
        for churn in range(5):
            sequences = running - churn
            fit.observe(sequences, intercept_s + slope_s * sequences)
    assert limits[-10:] == [expected] * 10
    assert min(limits) == expected
    assert limits == sorted(limits, reverse=True)


@pytest.mark.parametrize(
    ("objective_s", "floor", "ceiling", "expected"),
    [
        (0.005, 1, 128, 1),  # even one sequence misses the objective: the floor, not zero
        (0.005, 4, 128, 4),  # a configured floor
        (1.0, 1, 128, 128),  # the objective allows more than the static guard: the guard
        (1.0, 1, 64, 64),
    ],
)
def test_floor_and_ceiling(objective_s: float, floor: int, ceiling: int, expected: int) -> None:
    rng = random.Random(1)
    fit = fed([(x, line_s(x)) for x in (rng.randint(1, 3) for _ in range(100))])
    assert fit.limit(objective_s, floor, ceiling) == expected


def test_latency_falling_with_load_counts_as_flat() -> None:
    fit = fed([(x, 0.03 - 0.0001 * x) for x in range(1, 41)])
    assert fit.slope_s == 0.0
    assert fit.limit(0.05, 1, 128) == 128


@given(
    st.lists(
        st.tuples(st.floats(0.0, 512.0), st.floats(0.0, 10.0)),
        min_size=MIN_OBSERVATIONS,
        max_size=60,
    ),
    st.floats(1e-4, 10.0),
    st.integers(1, 16),
    st.integers(16, 512),
)
def test_the_limit_is_always_within_floor_and_ceiling(
    pairs: list[tuple[float, float]], objective_s: float, floor: int, ceiling: int
) -> None:
    fit = fed(pairs)
    assert fit.slope_s >= 0.0
    assert floor <= fit.limit(objective_s, floor, ceiling) <= ceiling


def view(replica_id: str, models: frozenset[str], max_sequences: int = 256) -> ReplicaView:
    return ReplicaView(
        replica_id,
        f"http://{replica_id}",
        "pool",
        Role.MIXED,
        models,
        10**6,
        max_sequences,
        True,
        0.0,
        InMemoryLedger().load(replica_id),
    )


def guarded_config(**fields: object) -> AdmissionConfig:
    return AdmissionConfig(
        models={MODEL: ModelAdmissionConfig(itl_slo_s=0.0305), OTHER: ModelAdmissionConfig(itl_slo_s=0.05)},
        **fields,  # type: ignore[arg-type]
    )


def test_no_objective_no_guard() -> None:
    assert ItlGuard.from_config(AdmissionConfig()) is None
    assert ItlGuard.from_config(AdmissionConfig(models={MODEL: ModelAdmissionConfig()})) is None
    assert AdmissionController(AdmissionConfig(), InMemoryLedger()).itl_guard is None


def test_the_tightest_objective_of_a_replicas_models_applies() -> None:
    guard = ItlGuard.from_config(guarded_config())
    assert guard is not None
    assert guard.objective_s([OTHER]) == 0.05
    assert guard.objective_s([OTHER, MODEL]) == 0.0305
    assert guard.objective_s(["unlisted"]) is None
    defaulted = ItlGuard.from_config(
        AdmissionConfig(
            default_model=ModelAdmissionConfig(itl_slo_s=0.1), models={OTHER: ModelAdmissionConfig()}
        )
    )
    assert defaulted is not None and defaulted.objective_s(["unlisted"]) == 0.1
    assert defaulted.objective_s([OTHER]) is None, "a listed model's own rules, as model_rules says"


def test_the_controller_guards_each_replica_by_its_learned_limit() -> None:
    config = guarded_config(max_active_sequences_per_replica=64, itl_guard_min_sequences=2)
    controller = AdmissionController(config, InMemoryLedger())
    guard = controller.itl_guard
    assert guard is not None
    rng = random.Random(9)
    for _ in range(200):
        x = rng.randint(1, 16)
        guard.observe("a", frozenset({MODEL}), x, line_s(x))
        guard.observe("untracked", frozenset({"no-objective"}), x, line_s(x))
    assert guard.limits == {"a": 16}
    assert controller.max_active(view("a", frozenset({MODEL}))) == 16
    assert controller.max_active(view("a", frozenset({MODEL}), max_sequences=8)) == 8
    assert controller.max_active(view("b", frozenset({MODEL}))) == 64  # nothing learned yet
    assert controller.max_active(view("untracked", frozenset({"no-objective"}))) == 64
    guard.forget("a")
    assert controller.max_active(view("a", frozenset({MODEL}))) == 64


def test_the_floor_may_not_exceed_the_static_guard() -> None:
    with pytest.raises(ValueError, match="itl_guard_min_sequences = 8 sequences exceeds"):
        AdmissionConfig(max_active_sequences_per_replica=4, itl_guard_min_sequences=8)
