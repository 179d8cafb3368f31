"""The step model fitted to a replica's reported latencies (``kvgate sim calibrate``): it recovers a
model it was given exactly, never goes negative on noisy points, and its fields run the simulator."""

from __future__ import annotations

import pytest

from kvgate.sim.calibration import Calibration, ReplicaFacts, fitted_fields
from kvgate.sim.engine import Engine
from kvgate.sim.profile import PROFILES, resolve_profile, step_duration_s
from kvgate.sim.step_fit import ItlPoint, StepFit, TtftPoint, fit_step_model

TRUE = StepFit(
    t_fixed_s=0.003,
    seq_overhead_s=0.0004,
    token_s=20e-6,
    attention_token_ctx_s=4e-9,
    frontend_latency_s=0.002,
)
CONTEXT_TOKENS = 96.0


def points(model: StepFit) -> tuple[list[TtftPoint], list[ItlPoint]]:
    ttft = [TtftPoint(p, model.ttft_s(p)) for p in (16, 512, 1024, 2048) for _ in range(3)]
    itl = [ItlPoint(b, CONTEXT_TOKENS, model.itl_s(b, CONTEXT_TOKENS)) for b in (1, 2, 4, 8, 16)]
    return ttft, itl


def test_a_noiseless_run_gives_back_the_model_that_made_it() -> None:
    fit = fit_step_model(*points(TRUE))
    for name in StepFit.__slots__:
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name


def test_medians_ignore_one_outlier_per_point() -> None:
    ttft, itl = points(TRUE)
    ttft.append(TtftPoint(512, 10.0))  # one block that met a busy machine
    fit = fit_step_model(ttft, itl)
    assert fit.token_s == pytest.approx(TRUE.token_s, rel=1e-6)


@pytest.mark.parametrize(
    ("ttft_ms", "itl_ms"),
    [
        ({16: 9.0, 512: 6.0, 1024: 5.0}, {1: 8.0, 4: 6.0, 16: 4.0}),  # everything falls with load
        ({16: 5.0, 512: 30.0, 1024: 31.0, 2048: 31.5}, {1: 3.0, 2: 3.1}),  # concave prefill
        ({16: 1.0, 2048: 1.0}, {1: 9.0, 8: 9.0}),  # decode slower than a lone prefill
    ],
)
def test_noisy_runs_never_give_a_negative_cost(ttft_ms: dict[int, float], itl_ms: dict[int, float]) -> None:
    fit = fit_step_model(
        [TtftPoint(p, ms / 1000) for p, ms in ttft_ms.items()],
        [ItlPoint(b, CONTEXT_TOKENS, ms / 1000) for b, ms in itl_ms.items()],
    )
    assert min(fit.t_fixed_s, fit.seq_overhead_s, fit.token_s, fit.attention_token_ctx_s) >= 0
    assert fit.frontend_latency_s >= 0


def test_two_prompt_lengths_and_two_batch_sizes_are_needed() -> None:
    with pytest.raises(ValueError, match="two prompt lengths"):
        fit_step_model([TtftPoint(16, 0.01)] * 3, [ItlPoint(1, 1.0, 0.01), ItlPoint(2, 1.0, 0.01)])


def test_the_fitted_fields_make_the_simulators_steps_what_the_fit_predicts() -> None:
    ttft, itl = points(TRUE)
    facts = ReplicaFacts("tiny", 4096, 128, 1_048_576, 1024)
    calibration = Calibration(facts, tuple(ttft), tuple(itl))
    fields = fitted_fields(calibration, PROFILES["llama-3.1-8b-h100"], max_num_seqs=128)
    assert (fields["kv_capacity_tokens"], fields["block_size_tokens"], fields["max_model_len"]) == (
        1_048_576,
        128,
        4096,
    )
    assert (fields["kv_bytes_per_token"], fields["max_num_seqs"], fields["weights_bytes"]) == (1024, 128, 0.0)
    profile = resolve_profile(overrides=fields)
    prefill = step_duration_s(profile, 1024, 1024 * 1024 / 2, 1024, seqs=1)
    decode = step_duration_s(profile, 8, 8 * CONTEXT_TOKENS, 8 * 97, seqs=8)
    assert prefill == pytest.approx(TRUE.ttft_s(1024) - TRUE.frontend_latency_s, rel=1e-3)
    assert decode == pytest.approx(TRUE.itl_s(8, CONTEXT_TOKENS), rel=1e-3)
    assert profile.frontend_latency_s == pytest.approx(TRUE.frontend_latency_s, rel=1e-3)


def test_the_engine_charges_each_scheduled_sequence() -> None:
    base = {"warmup_s": 0, "weights_bytes": 0, "t_fixed_s": 0.001, "flops_per_token": 0}
    alone = Engine(resolve_profile(overrides=base))
    charged = Engine(resolve_profile(overrides={**base, "seq_overhead_s": 0.002}))
    for engine in (alone, charged):
        for index in range(3):
            engine.add_request(f"r{index}", [1, 2, 3], 4, 0.0, ignore_eos=True)
    assert charged.step(0.0).duration_s - alone.step(0.0).duration_s == pytest.approx(3 * 0.002)
