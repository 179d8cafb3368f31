from __future__ import annotations

import ast
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from kvgate.autoscaler.policy import Autoscaler, PoolAutoscaler
from kvgate.autoscaler.recommendation import (
    HOLD,
    HOLD_COLD_START,
    HOLD_STABILIZING,
    MAX_REPLICAS,
    MIN_REPLICAS,
    SCALE_IN_IDLE,
    SCALE_IN_TOKEN_RATE,
    SCALE_OUT_BACKLOG_TTFT,
    SCALE_OUT_KV,
    SCALE_OUT_OCCUPANCY_ITL,
    SCALE_OUT_OCCUPANCY_TTFT,
    SCALE_OUT_QUEUE_WAIT,
    SCALE_OUT_SEQUENCES,
    SCALE_OUT_TOKEN_RATE,
    Recommendation,
)
from kvgate.autoscaler.rules import replicas_for_rate
from kvgate.autoscaler.signals import PoolSignals
from kvgate.config.autoscaler import AutoscalerConfig, PoolPolicy
from kvgate.vocabulary.replica import Role

STEP_S = 15.0
HOT: dict[str, Any] = {"kv_occupancy_ratio": 0.9, "ttft_p95_s": 2.0}
IDLE: dict[str, Any] = {"kv_occupancy_ratio": 0.2, "ttft_p95_s": 0.1, "itl_p95_s": 0.01}


def sig(t: float, pool: str = "chat", role: Role = Role.MIXED, replicas: int = 4, **kw: Any) -> PoolSignals:
    values: dict[str, Any] = {
        "kv_occupancy_ratio": 0.5,
        "ttft_p95_s": 0.8,
        "itl_p95_s": 0.05,
        "queue_wait_p95_s": None,
        "prompt_tokens_queued": 0,
        "resident_sequences": 0,
        "prompt_tokens_per_s": 0.0,
        "output_tokens_per_s": 0.0,
        "replicas_ready": replicas,
    }
    values.update(kw)
    return PoolSignals(time_s=t, pool=pool, role=role, replicas_current=replicas, **values)


def run(scaler: PoolAutoscaler, start_s: float, end_s: float, **kw: Any) -> list[Recommendation]:
    """Feed one sample every STEP_S from start_s to end_s inclusive, replicas following the advice."""
    out = []
    t = start_s
    replicas = kw.pop("replicas", 4)
    while t <= end_s:
        rec = scaler.update(sig(t, replicas=replicas, **kw))
        out.append(rec)
        replicas = rec.desired_replicas
        t += STEP_S
    return out


def policy(**kw: Any) -> PoolPolicy:
    return PoolPolicy(**kw)


def test_scale_out_needs_both_occupancy_and_ttft() -> None:
    only_full = run(PoolAutoscaler("chat", policy()), 0, 600, kv_occupancy_ratio=0.95, ttft_p95_s=0.5)
    only_slow = run(PoolAutoscaler("chat", policy()), 0, 600, kv_occupancy_ratio=0.5, ttft_p95_s=5.0)
    both = run(PoolAutoscaler("chat", policy()), 0, 60, **HOT)
    assert {r.desired_replicas for r in only_full + only_slow} == {4}
    assert [r.desired_replicas for r in both] == [4, 4, 4, 4, 5]
    assert both[-1].reason == SCALE_OUT_OCCUPANCY_TTFT


def test_scale_out_window_restarts_on_a_break() -> None:
    scaler = PoolAutoscaler("chat", policy())
    recs = run(scaler, 0, 45, **HOT)
    recs.append(scaler.update(sig(60, kv_occupancy_ratio=0.7, ttft_p95_s=2.0)))
    recs += run(scaler, 75, 120, **HOT)
    assert all(r.desired_replicas == 4 for r in recs)
    assert scaler.update(sig(135, **HOT)).desired_replicas == 5


def test_scale_in_is_slower_and_smaller_than_scale_out() -> None:
    out = run(PoolAutoscaler("chat", policy()), 0, 600, replicas=8, **HOT)
    first_out = next(r for r in out if r.desired_replicas != 8)
    assert first_out.desired_replicas == 10
    recs = run(PoolAutoscaler("chat", policy()), 0, 1500, replicas=10, **IDLE)
    times = [i * STEP_S for i, r in enumerate(recs) if r.reason == SCALE_IN_IDLE]
    assert times[0] == 600
    assert recs[int(600 / STEP_S)].desired_replicas == 9
    assert times[1] - times[0] >= 600
    out_time = next(i for i, r in enumerate(out) if r.desired_replicas != 8) * STEP_S
    assert out_time < times[0]


def test_scale_in_needs_both_low_occupancy_and_fast_ttft() -> None:
    slow = run(PoolAutoscaler("chat", policy()), 0, 1800, replicas=6, kv_occupancy_ratio=0.1, ttft_p95_s=0.9)
    full = run(PoolAutoscaler("chat", policy()), 0, 1800, replicas=6, kv_occupancy_ratio=0.5, ttft_p95_s=0.1)
    assert {r.desired_replicas for r in slow + full} == {6}


def test_no_scale_in_within_scale_down_delay_of_a_scale_out() -> None:
    scaler = PoolAutoscaler("chat", policy(scale_in_window_s=60, scale_down_delay_s=600, cold_start_s=0))
    out = run(scaler, 0, 60, **HOT)
    assert out[-1].desired_replicas == 5
    later = run(scaler, 75, 900, replicas=5, **IDLE)
    assert any(r.reason == HOLD_STABILIZING for r in later)
    first_in = next(i for i, r in enumerate(later) if r.reason == SCALE_IN_IDLE)
    assert 75 + first_in * STEP_S >= 60 + 600


def test_min_and_max_bound_every_answer() -> None:
    p = policy(min_replicas=3, max_replicas=5)
    scaler = PoolAutoscaler("chat", p)
    for t in (0.0, STEP_S, 2 * STEP_S):
        below = scaler.update(sig(t, replicas=1))
        assert (below.desired_replicas, below.reason) == (3, MIN_REPLICAS), (
            "the floor is why, until it is met"
        )
    hot = run(PoolAutoscaler("chat", replace_cold(p)), 0, 3600, replicas=4, **HOT)
    assert max(r.desired_replicas for r in hot) == 5
    assert hot[-1].reason == MAX_REPLICAS
    idle = run(PoolAutoscaler("chat", p), 0, 36000, replicas=5, **IDLE)
    assert min(r.desired_replicas for r in idle) == 3


def replace_cold(p: PoolPolicy) -> PoolPolicy:
    return p.model_copy(update={"cold_start_s": 0.0})


def test_noisy_signal_does_not_flap() -> None:
    rng = random.Random(7)
    scaler = PoolAutoscaler("chat", policy(cold_start_s=0))
    replicas, history = 4, []
    for i in range(int(4 * 3600 / STEP_S)):
        t = i * STEP_S
        hot = (t // 90) % 2 == 0
        occupancy = (0.88 if hot else 0.2) + rng.uniform(-0.07, 0.07)
        ttft = (2.0 if hot else 0.2) * rng.uniform(0.6, 1.6)
        rec = scaler.update(sig(t, replicas=replicas, kv_occupancy_ratio=occupancy, ttft_p95_s=ttft))
        replicas = rec.desired_replicas
        history.append(replicas)
    assert max(history) > 4
    assert all(b >= a for a, b in itertools.pairwise(history)), "never scales back in"


def test_prefill_and_decode_pools_decide_separately() -> None:
    a = Autoscaler(AutoscalerConfig(policy=policy(cold_start_s=0)))
    recs: list[Recommendation] = []
    for i in range(5):
        t = i * STEP_S
        prefill = sig(
            t, "prefill", Role.PREFILL, ttft_p95_s=3.0, prompt_tokens_queued=4 * 20000, itl_p95_s=None
        )
        decode = sig(t, "decode", Role.DECODE, kv_occupancy_ratio=0.95, ttft_p95_s=3.0, itl_p95_s=0.02)
        recs = a.update([prefill, decode])
    assert (recs[0].desired_replicas, recs[0].reason) == (5, SCALE_OUT_BACKLOG_TTFT)
    assert (recs[1].desired_replicas, recs[1].reason) == (4, HOLD), "decode is full but fast: no scale-out"

    hot_decode = run(
        PoolAutoscaler("decode", policy()), 0, 60, role=Role.DECODE, kv_occupancy_ratio=0.9, itl_p95_s=0.3
    )
    assert (hot_decode[-1].desired_replicas, hot_decode[-1].reason) == (5, SCALE_OUT_OCCUPANCY_ITL)
    slow_prefill_no_backlog = run(PoolAutoscaler("p", policy()), 0, 300, role=Role.PREFILL, ttft_p95_s=3.0)
    assert {r.desired_replicas for r in slow_prefill_no_backlog} == {4}


def test_mixed_pool_takes_the_larger_phase_answer() -> None:
    decode_hot = run(
        PoolAutoscaler("m", policy()), 0, 60, kv_occupancy_ratio=0.9, ttft_p95_s=0.1, itl_p95_s=0.3
    )
    assert (decode_hot[-1].desired_replicas, decode_hot[-1].reason) == (5, SCALE_OUT_OCCUPANCY_ITL)
    decode_slow = run(
        PoolAutoscaler("m", policy()),
        0,
        1800,
        replicas=6,
        kv_occupancy_ratio=0.2,
        ttft_p95_s=0.1,
        itl_p95_s=0.06,
    )
    assert {r.desired_replicas for r in decode_slow} == {6}, "prefill idle but decode not fast: no scale-in"


def test_queue_wait_on_a_full_pool_scales_out_whatever_the_ttft() -> None:
    full = run(
        PoolAutoscaler("chat", policy()), 0, 60, queue_wait_p95_s=5.0, kv_occupancy_ratio=0.9, ttft_p95_s=1
    )
    assert (full[-1].desired_replicas, full[-1].reason) == (5, SCALE_OUT_QUEUE_WAIT)
    draining = run(PoolAutoscaler("chat", policy()), 0, 300, queue_wait_p95_s=5.0, kv_occupancy_ratio=0.3)
    assert {r.desired_replicas for r in draining} == {4}, "a long wait with free cache is a backlog's tail"


def test_token_rate_sizing_applies_at_once() -> None:
    assert replicas_for_rate(60000, 10000, 0.75) == 8
    assert replicas_for_rate(7500, 10000, 0.75) == 1
    p = policy(prefill_capacity_tokens_per_s=10000, decode_capacity_tokens_per_s=1000, growth_window_s=60)
    rec = PoolAutoscaler("chat", p).update(sig(0, prompt_tokens_per_s=60000, output_tokens_per_s=1500))
    assert (rec.desired_replicas, rec.reason) == (10, SCALE_OUT_TOKEN_RATE), (
        "a mixed pool's phases share each replica's time: (6 + 1.5) replicas' worth at 0.75"
    )
    decode = PoolAutoscaler("d", p).update(
        sig(0, role=Role.DECODE, prompt_tokens_per_s=60000, output_tokens_per_s=3000)
    )
    assert decode.desired_replicas == 4, "a decode pool ignores the prompt rate"


def test_growth_headroom_covers_the_cold_start() -> None:
    p = policy(prefill_capacity_tokens_per_s=10000, cold_start_s=60, growth_window_s=60)
    steady = PoolAutoscaler("chat", p)
    growing = PoolAutoscaler("chat", p)
    for i in range(5):
        steady_rec = steady.update(sig(i * STEP_S, prompt_tokens_per_s=22500))
        growing_rec = growing.update(sig(i * STEP_S, prompt_tokens_per_s=22500 - (4 - i) * 1500))
    assert steady_rec.desired_replicas == 4
    assert growing_rec.desired_replicas == replicas_for_rate(22500 + 100 * 60, 10000, 0.75)


SIZED: dict[str, Any] = {"prefill_capacity_tokens_per_s": 10000, "decode_capacity_tokens_per_s": 1000}
SERVING: dict[str, Any] = {"ttft_p95_s": 0.8, "itl_p95_s": 0.02, "kv_occupancy_ratio": 0.1}


def test_the_served_rates_of_a_hurried_pool_are_its_ceiling_not_growth() -> None:
    """Served prompts rising by 100 tokens/s a second on four replicas: with latencies under their
    targets that is demand growing, 6000 more a 60 s cold start ahead (ceil(31.5k / 7.5k) = 5);
    with TTFT above its target the pool serves what it can, and its rate rises as capacity comes
    up to speed (warm-up, routing ramp), which says nothing of the demand: 4 stay."""

    def most(ttft_s: float) -> int:
        scaler = PoolAutoscaler("chat", policy(prefill_capacity_tokens_per_s=10000, cold_start_s=60))
        return max(
            scaler.update(
                sig(i * STEP_S, prompt_tokens_per_s=22500 + 1500 * i, ttft_p95_s=ttft_s)
            ).desired_replicas
            for i in range(5)
        )

    assert (most(0.8), most(2.0)) == (5, 4)


def test_a_mix_moving_work_from_prompts_to_outputs_is_no_growth() -> None:
    """A mixed pool's phases share each replica's time: prompts falling from 3 replicas' worth
    while outputs rise by as much (a quarter of a replica's worth per 15 s sample) keep 3 replicas'
    worth, so 4 replicas (3 / 0.75) stay, where the outputs' rise alone would read as one more
    replica's worth a 60 s cold start ahead (6). The same rise on steady prompts is growth of the
    pool's work, projected once the samples span half the growth window (2.5 + 1 -> 5) and asked for
    on the next sample (a calm pool's served rates take two samples): 2.75 + 1 -> 5."""
    p = policy(**SIZED, cold_start_s=60, growth_window_s=60)
    shifting = PoolAutoscaler("chat", p)
    growing = PoolAutoscaler("chat", p)
    for i in range(4):
        outputs = 250.0 * i
        shifting_rec = shifting.update(
            sig(i * STEP_S, prompt_tokens_per_s=30000 - 2500.0 * i, output_tokens_per_s=outputs)
        )
        growing_rec = growing.update(sig(i * STEP_S, prompt_tokens_per_s=20000, output_tokens_per_s=outputs))
        assert shifting_rec.desired_replicas == 4
    assert (growing_rec.desired_replicas, growing_rec.reason) == (5, SCALE_OUT_TOKEN_RATE)


def test_served_rates_that_fit_fewer_replicas_scale_in_to_them_after_the_sizing_window() -> None:
    """Long prompts keep TTFT p95 above the idle rule's 0.4 s at any load; the capacities say
    (0.6 + 0.6) replicas' worth is served, which two carry once the sizing window shows no noise
    around its trend: ceil(1.2 / 0.75) = 2."""
    recs = run(
        PoolAutoscaler("chat", policy(**SIZED)),
        0,
        120,
        replicas=8,
        prompt_tokens_per_s=6000.0,
        output_tokens_per_s=600.0,
        **SERVING,
    )
    assert [r.desired_replicas for r in recs] == [8, 8, 8, 8, 2, 2, 2, 2, 2]
    assert recs[4].reason == SCALE_IN_TOKEN_RATE


@pytest.mark.parametrize(
    "hurry",
    [{"ttft_p95_s": 2.0}, {"itl_p95_s": 0.2}, {"queue_wait_p95_s": 3.0}],
)
def test_no_sizing_scale_in_while_a_latency_is_above_its_scale_out_target(hurry: dict[str, Any]) -> None:
    values = {**SERVING, "prompt_tokens_per_s": 6000.0, "output_tokens_per_s": 600.0, **hurry}
    recs = run(PoolAutoscaler("chat", policy(**SIZED)), 0, 300, replicas=8, **values)
    assert min(r.desired_replicas for r in recs) == 8


def alternating(replicas: int, low: float, high: float, end_s: float = 300) -> list[int]:
    """Asked-for replicas while the served prompts alternate between ``low`` and ``high`` replicas'
    worth (SIZED capacities, latencies within target), the replicas following the advice."""
    scaler = PoolAutoscaler("chat", policy(**SIZED))
    out = []
    for i in range(int(end_s // STEP_S) + 1):
        share = low if i % 2 == 0 else high
        rec = scaler.update(sig(i * STEP_S, replicas=replicas, prompt_tokens_per_s=share * 10000, **SERVING))
        replicas = rec.desired_replicas
        out.append(replicas)
    return out


def test_a_sizing_scale_in_leaves_room_for_the_noise_of_its_window() -> None:
    """1.5 replicas' worth: 2 at the 0.75 target once the sizing window shows no noise around its
    trend; the same mean swinging by 0.1 either way keeps 3 (two standard deviations of hysteresis)."""
    assert alternating(8, 1.5, 1.5)[-1] == 2
    assert alternating(8, 1.4, 1.6)[-1] == 3
    assert set(alternating(3, 1.4, 1.6)) == {3}


def test_a_pool_bound_by_kv_is_sized_on_the_kv_in_use_and_keeps_the_replicas_holding_it() -> None:
    """Long contexts fill the cache while tokens/s stay low: 0.9 of 4 replicas' KV is 3.6
    replicas' worth, 5 keep it under the 0.8 full mark; the token rates alone fit one."""
    rates = {"prompt_tokens_per_s": 2000.0, "output_tokens_per_s": 200.0}
    full = PoolAutoscaler("chat", policy(**SIZED)).update(
        sig(0, **{**SERVING, "kv_occupancy_ratio": 0.9}, **rates)
    )
    assert (full.desired_replicas, full.reason) == (5, SCALE_OUT_KV)
    held = run(
        PoolAutoscaler("chat", policy(**SIZED)),
        0,
        300,
        replicas=8,
        **{**SERVING, "kv_occupancy_ratio": 0.5},
        **rates,
    )
    first_step = next(r for r in held if r.desired_replicas != 8)
    assert (first_step.desired_replicas, first_step.reason) == (6, SCALE_IN_TOKEN_RATE), (
        "4 replicas' worth of KV plus the half-replica hysteresis needs 6 at the 0.75 target, "
        "though the token rates fit 1"
    )


def test_undoing_a_step_in_takes_a_scale_out_window_of_kv_noise_and_two_samples_of_kv_growth() -> None:
    """Within the stabilisation window after a step in to 2, the KV in use reads 1.8 replicas' worth
    (over the 0.8 full mark of 2) sample after sample. Where the cache held 4 replicas' worth a few
    minutes before, it is not growing: large contexts come and go, and undoing the step in takes
    the lowest floor of a scale-out window (5 samples). Where it held 0.8 throughout, it is growing,
    and two samples in a row are demand."""
    rates = {"prompt_tokens_per_s": 1000.0, "output_tokens_per_s": 100.0}

    def asks(earlier_kv_replicas: float) -> list[int]:
        scaler = PoolAutoscaler("chat", policy(**SIZED))
        replicas = 8
        for t in range(0, 165, int(STEP_S)):
            values = {**SERVING, "kv_occupancy_ratio": 0.8 / replicas}
            if t <= 60:
                values.update(kv_occupancy_ratio=earlier_kv_replicas / replicas, ttft_p95_s=2.0)
            replicas = scaler.update(sig(t, replicas=replicas, **rates, **values)).desired_replicas
        assert replicas == 2
        full = {**SERVING, "kv_occupancy_ratio": 0.9}
        return [
            scaler.update(sig(165 + k * STEP_S, replicas=2, **rates, **full)).desired_replicas
            for k in range(5)
        ]

    assert asks(earlier_kv_replicas=4.0) == [2, 2, 2, 2, 3]
    assert asks(earlier_kv_replicas=0.8) == [2, 3, 3, 3, 3]


def test_kv_in_use_growing_holds_the_replicas_a_step_in_would_remove() -> None:
    """Token rates fit one replica of eight; TTFT above its scale-out target holds every step in
    for the first 150 s. Then 2 replicas' worth of KV held flat steps in to ceil(2 / 0.75) = 3 (no
    noise, no hysteresis);
    the same KV rising by 0.01 of a replica a second (its slope over scale_down_delay_s) is 1.2
    more one 120 s cold start ahead and keeps at least 6."""
    rates = {"prompt_tokens_per_s": 1000.0, "output_tokens_per_s": 100.0}

    def first_step(slope: float) -> Recommendation:
        scaler = PoolAutoscaler("chat", policy(**SIZED))
        for k in range(40):
            t = k * STEP_S
            values = {**SERVING, "kv_occupancy_ratio": (2.0 + slope * (t - 150)) / 8}
            if t <= 150:
                values["ttft_p95_s"] = 2.0
            rec = scaler.update(sig(t, replicas=8, **values, **rates))
            if rec.desired_replicas != 8:
                return rec
        raise AssertionError("never stepped in")

    flat, rising = first_step(0.0), first_step(0.01)
    assert (flat.desired_replicas, flat.reason) == (3, SCALE_IN_TOKEN_RATE)
    assert rising.reason == SCALE_IN_TOKEN_RATE and rising.desired_replicas >= 6


def test_the_sizing_scale_in_hysteresis_is_the_noise_in_replicas_up_to_half_a_replica() -> None:
    """4 replicas' worth swinging by 0.4 either way: two standard deviations would be a replica's
    worth, the hysteresis stops at half a replica around the window's trend, not its most:
    ceil((4.0 + 0.5) / 0.75) = 6, whose floor at the swing's top is 6 too; half a replica's
    worth swinging by 0.1 stays on two (ceil((0.6 + 0.26) / 0.75)), held flat it steps in to one,
    and the next minute has no noise to step out again on."""
    assert alternating(8, 3.6, 4.4)[-1] == 6
    assert set(alternating(2, 0.4, 0.6)) == {2}
    assert alternating(2, 0.5, 0.5)[-1] == 1


def test_arrivals_a_saturated_pool_leaves_waiting_count_as_demand_with_the_backlog_they_build() -> None:
    """Served 10k prompt tokens/s flat while 10k/s more pile up: demand is 20k/s, and replicas
    asked for now find the backlog plus a cold start of that surplus, cleared over 60 s."""
    p = policy(prefill_capacity_tokens_per_s=10000, cold_start_s=60, backlog_drain_s=60)
    scaler = PoolAutoscaler("chat", p)
    first = scaler.update(sig(0, replicas=2, prompt_tokens_per_s=10000.0, **SERVING))
    second = scaler.update(
        sig(15, replicas=2, prompt_tokens_per_s=10000.0, prompt_tokens_queued=150000, **SERVING)
    )
    assert first.desired_replicas == 2
    expected = replicas_for_rate(20000 + (150000 + 10000 * 60) / 60, 10000, 0.75)
    assert (second.desired_replicas, second.reason) == (expected, SCALE_OUT_TOKEN_RATE)
    during = [
        scaler.update(
            sig(
                t,
                replicas=expected,
                replicas_ready=2,
                prompt_tokens_per_s=10000.0,
                prompt_tokens_queued=150000 + 150000 * i,
                **SERVING,
            )
        )
        for i, t in enumerate((30, 45, 60), start=1)
    ]
    assert {r.desired_replicas for r in during} == {expected}, "the ask covered the backlog they will find"


def test_prompts_in_flight_on_a_pool_within_its_targets_are_no_backlog() -> None:
    """One replica serving 0.7 of its worth within every target reads one 8k-token document waiting:
    prompts its ready replica holds within scale_out_prefill_tokens_per_replica (16384) are in flight,
    and it stays at one. Counted as arrivals left unserved (533 tokens/s) plus the backlog they build
    over a cold start (1,200/s), 0.87 of a replica's worth would ask for a second (ceil(0.87 / 0.75)):
    it still does where TTFT is above its target, or more waits than the replica holds."""
    p = policy(**SIZED)

    def second(queued: int, **kw: Any) -> Recommendation:
        scaler = PoolAutoscaler("chat", p)
        serving = {**SERVING, **kw, "replicas": 1, "prompt_tokens_per_s": 7000.0}
        scaler.update(sig(0, **serving))
        return scaler.update(sig(STEP_S, prompt_tokens_queued=queued, **serving))

    in_flight, hurried, beyond = second(8000), second(8000, ttft_p95_s=2.0), second(20000)
    assert (in_flight.desired_replicas, in_flight.reason) == (1, HOLD)
    assert (hurried.desired_replicas, hurried.reason) == (2, SCALE_OUT_TOKEN_RATE)
    assert (beyond.desired_replicas, beyond.reason) == (2, SCALE_OUT_TOKEN_RATE)


def test_resident_sequences_floor_for_decode() -> None:
    p = policy(decode_sequences_per_replica=32)
    rec = PoolAutoscaler("d", p).update(sig(0, role=Role.DECODE, resident_sequences=200))
    assert (rec.desired_replicas, rec.reason) == (7, SCALE_OUT_SEQUENCES)


def test_waits_for_cold_starting_replicas_before_asking_again() -> None:
    scaler = PoolAutoscaler("chat", policy(cold_start_s=300))
    recs = run(scaler, 0, 60, **HOT)
    assert recs[-1].desired_replicas == 5
    during = [scaler.update(sig(t, replicas=4, replicas_ready=4, **HOT)) for t in (75, 90, 135, 180)]
    assert [r.desired_replicas for r in during] == [5, 5, 5, 5], "keeps asking for 5 while it comes up"
    assert during[-1].reason == HOLD_COLD_START
    after = [scaler.update(sig(t, replicas=5, replicas_ready=5, **HOT)) for t in range(375, 500, 15)]
    assert after[-1].desired_replicas == 7


def test_policy_rejects_inverted_thresholds() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        PoolPolicy(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match="scale_in_ttft_s"):
        PoolPolicy(scale_in_ttft_s=2.0)
    config = AutoscalerConfig(pools={"decode": PoolPolicy(max_replicas=3)})
    assert config.policy_for("decode").max_replicas == 3
    assert config.policy_for("other") == PoolPolicy()


def test_autoscaler_package_is_pure() -> None:
    forbidden = {
        "asyncio",
        "time",
        "random",
        "aiohttp",
        "httpx",
        "fastapi",
        "starlette",
        "redis",
        "prometheus_client",
    }
    for path in (Path(__file__).parents[2] / "autoscaler").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path} imports {name}"


def test_one_sample_of_served_rates_above_the_rest_waits_for_a_second_on_a_calm_pool() -> None:
    """Four replicas serving 2.25 replicas' worth within every target: one 15 s sample at twice
    that (a cluster of long requests finishing together) is not demand yet, a second one is
    (ceil(4.5 / 0.75) = 6); on a pool whose TTFT is above its target the first sample counts."""
    p = policy(**SIZED, growth_window_s=60)
    steady, spike = {"prompt_tokens_per_s": 22500.0}, {"prompt_tokens_per_s": 45000.0}
    once = PoolAutoscaler("chat", p)
    twice = PoolAutoscaler("chat", p)
    hurried = PoolAutoscaler("chat", p)
    for scaler in (once, twice, hurried):
        assert scaler.update(sig(0, **SERVING, **steady)).desired_replicas == 4
    assert once.update(sig(STEP_S, **SERVING, **spike)).reason == HOLD
    assert once.update(sig(2 * STEP_S, **SERVING, **steady)).desired_replicas == 4
    twice.update(sig(STEP_S, **SERVING, **spike))
    rec = twice.update(sig(2 * STEP_S, **SERVING, **spike))
    assert (rec.desired_replicas, rec.reason) == (6, SCALE_OUT_TOKEN_RATE)
    rec = hurried.update(sig(STEP_S, **{**SERVING, "ttft_p95_s": 2.0}, **spike))
    assert (rec.desired_replicas, rec.reason) == (6, SCALE_OUT_TOKEN_RATE)


def test_a_falling_pool_steps_in_to_its_demand_one_cold_start_ahead() -> None:
    """Served work falling by 0.1 of a replica each 15 s sample from 6 replicas' worth on ten: a
    replica removed now is gone at once, one added back serves a 120 s cold start later, so a step
    in sizes the demand of then, 0.8 replicas' worth below now, at the sizing window's trend with
    the hysteresis: each step goes to what the trend needs, and the next waits for the demand to
    fall below it for a sizing window."""
    scaler = PoolAutoscaler("chat", policy(**SIZED))
    replicas, changes = 10, []
    for i in range(40):
        rec = scaler.update(
            sig(i * STEP_S, replicas=replicas, prompt_tokens_per_s=(6.0 - 0.1 * i) * 10000, **SERVING)
        )
        if rec.desired_replicas != replicas:
            changes.append((i * STEP_S, rec.desired_replicas, rec.reason))
        replicas = rec.desired_replicas
    assert [(t, n) for t, n, _ in changes] == [(60, 8), (165, 7), (270, 6), (375, 5), (495, 4)]
    assert {reason for _, _, reason in changes} == {SCALE_IN_TOKEN_RATE}


def test_a_step_in_never_sizes_below_the_demand_of_the_sample_itself() -> None:
    """Served work falls from 0.9 of a replica's worth on two, to 0.5 and back up to 0.6, 0.05 a
    sample. Projected one cold start ahead at its slope, the sizing window at 165 s reads -0.08,
    -0.25, -0.22, 0.31, 0.6: its least-squares line, 0.46 now, lags the turn, and with the 0.22 of
    hysteresis its noise asks for (the KV in use, 0.2, is the work's least) would need one replica
    (ceil(0.68 / 0.75)) while the sample's own demand needs two (ceil(0.82 / 0.75)). The step in
    waits until the window holds flat at 0.6 with no noise, at 300 s."""
    shares = [0.9] * 6 + [0.65, 0.6, 0.55, 0.5, 0.55, 0.6] + [0.6] * 12
    scaler = PoolAutoscaler("chat", policy(**SIZED))
    replicas, changes = 2, []
    for i, share in enumerate(shares):
        rec = scaler.update(sig(i * STEP_S, replicas=replicas, prompt_tokens_per_s=share * 10000, **SERVING))
        if rec.desired_replicas != replicas:
            changes.append((i * STEP_S, rec.desired_replicas, rec.reason))
        replicas = rec.desired_replicas
    assert changes == [(300, 1, SCALE_IN_TOKEN_RATE)]


def test_a_step_in_right_after_a_step_out_that_undid_one_waits_out_the_stabilisation_window() -> None:
    """2.25 replicas' worth on four steps in to three; 3 replicas' worth for a scale-out window steps
    out to four (a turn); back to 2.25 at once, a step in would be the second turn in 300 s: it waits
    until 300 s after the step out (480 s), then steps in."""
    scaler = PoolAutoscaler("chat", policy(**SIZED))
    replicas, changes, reasons = 4, [], set()
    for i, share in enumerate([2.25] * 8 + [3.0] * 8 + [2.25] * 30):
        rec = scaler.update(sig(i * STEP_S, replicas=replicas, prompt_tokens_per_s=share * 10000, **SERVING))
        if rec.desired_replicas != replicas:
            changes.append((i * STEP_S, rec.desired_replicas))
        reasons.add(rec.reason)
        replicas = rec.desired_replicas
    assert changes == [(90, 3), (180, 4), (480, 3)]
    assert HOLD_STABILIZING in reasons
