"""Measuring a running vLLM replica with a short load, and the simulator profile that matches it.

``kvgate sim calibrate`` runs this against one replica that nothing else is using. Timings come
from the replica itself, not from the client: the sum and count of its own
``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds`` histograms are read
before and after each block of requests, so a block's mean is the replica's own, to the engine's
clock for inter-token gaps, whatever the client's machine was doing (on two shared cores a client
starved for a few milliseconds would otherwise measure its own scheduling). The simulator exports
the same histograms, so one measurement runs against either.

Two sweeps, each block repeated and the repeats interleaved so that a drift in the machine's load
spreads over every point: time to first token of lone requests at several prompt lengths (each
prompt fresh random token ids, never the same twice, so nothing is cached, and no longer than one
prefill step), and
inter-token latency of ``B`` requests decoding together for several ``B``. ``kvgate.sim.step_fit``
fits the step model to the medians; ``fitted_fields`` turns the fit and what the replica reports
of itself (``/v1/models``, ``vllm:cache_config_info``) into profile fields.
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.sim.profile import Profile
from kvgate.sim.step_fit import ItlPoint, StepFit, TtftPoint, fit_step_model

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
_SUM_OR_COUNT = re.compile(
    r"^(vllm:(?:time_to_first_token_seconds|inter_token_latency_seconds)_(?:sum|count))(?:\{[^}]*\})?\s+(\S+)",
    re.MULTILINE,
)
_CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_TOKEN_IDS = (10, 1000)
"""Prompt token ids are drawn from this range: every tokenizer's vocabulary holds them."""


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    """The short load: which points, how many requests each, how often repeated. Check points are
    measured in the same rounds but left out of the fit: how well the fit predicts them is how
    well the profile will predict a load it was not fitted to."""

    prompt_tokens: tuple[int, ...] = (16, 512, 1024, 2048)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_prompt_tokens: int = 64
    decode_output_tokens: int = 64
    requests_per_block: int = 3
    repeats: int = 5
    check_prompt_tokens: tuple[int, ...] = ()
    check_batches: tuple[int, ...] = ()
    check_decode_prompt_tokens: int = 256


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    """What a replica says of itself: its model and window, and its KV cache where it exports
    ``vllm:cache_config_info``."""

    model: str
    max_model_len: int
    block_size_tokens: int | None = None
    kv_capacity_tokens: int | None = None
    kv_bytes_per_token: int | None = None


@dataclass(frozen=True, slots=True)
class Calibration:
    facts: ReplicaFacts
    ttft: tuple[TtftPoint, ...]
    itl: tuple[ItlPoint, ...]
    check_ttft: tuple[TtftPoint, ...] = ()
    check_itl: tuple[ItlPoint, ...] = ()
    fit: StepFit = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fit", fit_step_model(self.ttft, self.itl))


@dataclass(frozen=True, slots=True)
class _Histograms:
    ttft_sum_s: float
    ttft_count: float
    itl_sum_s: float
    itl_count: float


class ReplicaProbe:
    """One replica under measurement: its facts, and blocks of requests timed by its own histograms."""

    def __init__(self, session: aiohttp.ClientSession, url: str, facts: ReplicaFacts) -> None:
        self._session = session
        self._url = url.rstrip("/")
        self.facts = facts
        self._rng = random.Random()
        """Unseeded: prompts repeated from an earlier run would hit the replica's prefix cache."""

    @classmethod
    async def connect(
        cls, session: aiohttp.ClientSession, url: str, model: str | None = None
    ) -> ReplicaProbe:
        return cls(session, url, await read_facts(session, url.rstrip("/"), model))

    async def ttft_s(self, prompt_tokens: int, requests: int) -> float:
        """The replica's mean time to first token over ``requests`` lone requests, one after another."""
        before = await self._histograms()
        for _ in range(requests):
            await self._complete(prompt_tokens, 1)
        after = await self._histograms()
        return _mean(after.ttft_sum_s - before.ttft_sum_s, after.ttft_count - before.ttft_count, TTFT)

    async def itl_s(self, batch: int, prompt_tokens: int, output_tokens: int) -> float:
        """The replica's mean inter-token latency while ``batch`` requests decode together."""
        before = await self._histograms()
        await asyncio.gather(*(self._complete(prompt_tokens, output_tokens) for _ in range(batch)))
        after = await self._histograms()
        return _mean(after.itl_sum_s - before.itl_sum_s, after.itl_count - before.itl_count, ITL)

    async def _complete(self, prompt_tokens: int, max_tokens: int) -> None:
        body = {
            "model": self.facts.model,
            "prompt": [self._rng.randrange(*_TOKEN_IDS) for _ in range(prompt_tokens)],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        async with self._session.post(self._url + "/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"{self._url} answered {response.status}: {(await response.text())[:300]}")
            await response.read()

    async def _histograms(self) -> _Histograms:
        async with self._session.get(self._url + "/metrics") as response:
            response.raise_for_status()
            text = await response.text()
        totals: dict[str, float] = {}
        for name, value in _SUM_OR_COUNT.findall(text):
            totals[name] = totals.get(name, 0.0) + float(value)
        return _Histograms(
            totals.get(f"{TTFT}_sum", 0.0),
            totals.get(f"{TTFT}_count", 0.0),
            totals.get(f"{ITL}_sum", 0.0),
            totals.get(f"{ITL}_count", 0.0),
        )


def _mean(total_s: float, count: float, name: str) -> float:
    if count <= 0:
        raise RuntimeError(f"the replica recorded no {name} samples for the block: is it vLLM?")
    return total_s / count


async def read_facts(session: aiohttp.ClientSession, url: str, model: str | None = None) -> ReplicaFacts:
    """The served model (``model``, or the replica's first) and its window from ``/v1/models``, and
    the KV cache from ``vllm:cache_config_info`` (absent fields stay None)."""
    async with session.get(url + "/v1/models") as response:
        response.raise_for_status()
        cards = (await response.json())["data"]
    card = next((c for c in cards if model in (None, c["id"])), None)
    if card is None:
        raise RuntimeError(f"{url} does not serve {model!r}; it serves {', '.join(c['id'] for c in cards)}")
    async with session.get(url + "/metrics") as response:
        response.raise_for_status()
        text = await response.text()
    info = _CACHE_CONFIG.search(text)
    labels = dict(_LABEL.findall(info.group(1))) if info else {}
    block_size = _int_label(labels, "block_size")
    blocks = _int_label(labels, "num_gpu_blocks")
    capacity = _int_label(labels, "kv_cache_size_tokens")
    if capacity is None and blocks is not None and block_size is not None:
        capacity = blocks * block_size
    memory_bytes = _int_label(labels, "kv_cache_memory_bytes")
    kv_bytes = memory_bytes // capacity if memory_bytes and capacity else None
    return ReplicaFacts(str(card["id"]), int(card["max_model_len"]), block_size, capacity, kv_bytes)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


async def calibrate(probe: ReplicaProbe, plan: CalibrationPlan) -> Calibration:
    """Warm every point up once, then measure ``plan.repeats`` rounds of every point."""
    window = probe.facts.max_model_len - plan.decode_output_tokens
    points = _Points(probe, plan)
    for round_index in range(plan.repeats + 1):
        keep = round_index > 0  # round 0 warms the replica up (first shapes, caches)
        for prompt_tokens in plan.prompt_tokens:
            if prompt_tokens <= window:
                await points.ttft(prompt_tokens, keep, points.fit_ttft)
        for batch in plan.batches:
            await points.itl(batch, plan.decode_prompt_tokens, keep, points.fit_itl)
        for prompt_tokens in plan.check_prompt_tokens:
            await points.ttft(prompt_tokens, keep, points.check_ttft)
        for batch in plan.check_batches:
            await points.itl(batch, plan.check_decode_prompt_tokens, keep, points.check_itl)
    return Calibration(
        probe.facts,
        tuple(points.fit_ttft),
        tuple(points.fit_itl),
        tuple(points.check_ttft),
        tuple(points.check_itl),
    )


class _Points:
    """What one calibration run has measured so far, fit and check points apart."""

    def __init__(self, probe: ReplicaProbe, plan: CalibrationPlan) -> None:
        self._probe = probe
        self._plan = plan
        self.fit_ttft: list[TtftPoint] = []
        self.fit_itl: list[ItlPoint] = []
        self.check_ttft: list[TtftPoint] = []
        self.check_itl: list[ItlPoint] = []

    async def ttft(self, prompt_tokens: int, keep: bool, into: list[TtftPoint]) -> None:
        ttft_s = await self._probe.ttft_s(prompt_tokens, self._plan.requests_per_block)
        if keep:
            into.append(TtftPoint(prompt_tokens, ttft_s))

    async def itl(self, batch: int, prompt_tokens: int, keep: bool, into: list[ItlPoint]) -> None:
        output_tokens = self._plan.decode_output_tokens
        itl_s = await self._probe.itl_s(batch, prompt_tokens, output_tokens)
        if keep:
            into.append(ItlPoint(batch, prompt_tokens + output_tokens / 2, itl_s))


def fitted_fields(
    calibration: Calibration,
    base: Profile,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, Any]:
    """Profile fields for the measured replica: its KV cache and window as it reports them, the
    scheduler limits given (vLLM does not export them), and the fitted step costs. The weights'
    read is a fixed cost per step, so it is inside ``t_fixed_s`` (``weights_bytes`` 0); per-token
    costs are written as flops at the base profile's ``peak_flops * mfu_ratio``. A fitted replica is
    warm: no warm-up."""
    facts, fit = calibration.facts, calibration.fit
    speed = base.peak_flops * base.mfu_ratio
    fields: dict[str, Any] = {}
    if facts.kv_capacity_tokens is not None:
        fields["kv_capacity_tokens"] = facts.kv_capacity_tokens
    if facts.block_size_tokens is not None:
        fields["block_size_tokens"] = facts.block_size_tokens
    fields["max_model_len"] = facts.max_model_len
    if max_num_seqs is not None:
        fields["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        fields["max_num_batched_tokens"] = max_num_batched_tokens
    if facts.kv_bytes_per_token is not None:
        fields["kv_bytes_per_token"] = facts.kv_bytes_per_token
    fields.update(
        t_fixed_s=_round(fit.t_fixed_s),
        seq_overhead_s=_round(fit.seq_overhead_s),
        frontend_latency_s=_round(fit.frontend_latency_s),
        weights_bytes=0.0,
        flops_per_token=_round(fit.token_s * speed),
        attention_flops_per_token_ctx=_round(fit.attention_token_ctx_s * speed),
        warmup_s=0.0,
    )
    return fields


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def point_table(calibration: Calibration) -> list[str]:
    """Measured medians against the fit, one line per point (check points: how far off the fit's
    prediction is), for the operator to judge the fit."""
    fit = calibration.fit
    lines = ["point                             measured   fitted   error"]
    for label, ttft in (("TTFT", calibration.ttft), ("TTFT check", calibration.check_ttft)):
        for prompt_tokens, values in _grouped([(p.prompt_tokens, p.ttft_s) for p in ttft]):
            lines.append(_row(f"{label} prompt {prompt_tokens}", values, fit.ttft_s(prompt_tokens)))
    for label, itl in (("ITL", calibration.itl), ("ITL check", calibration.check_itl)):
        for (batch, context), values in _grouped([((p.batch, p.context_tokens), p.itl_s) for p in itl]):
            lines.append(_row(f"{label} batch {batch} ctx {context:g}", values, fit.itl_s(batch, context)))
    return lines


def _grouped(points: Sequence[tuple[Any, float]]) -> list[tuple[Any, list[float]]]:
    grouped: dict[Any, list[float]] = {}
    for key, value in points:
        grouped.setdefault(key, []).append(value)
    return sorted(grouped.items())


def _row(label: str, values: list[float], fitted_s: float) -> str:
    measured_s = statistics.median(values)
    error = (fitted_s - measured_s) / measured_s if measured_s > 0 else 0.0
    return f"{label:<30} {measured_s * 1000:>8.2f} ms {fitted_s * 1000:>6.2f} ms {error:>+7.0%}"
