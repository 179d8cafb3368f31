"""How far the gateway's estimates are from what replicas report, per model.

Two things are learned from finished requests. The prompt ratio (estimated ÷ actual prompt tokens,
the actual being the replica's ``usage.prompt_tokens``) tells whether the tokeniser seam over- or
under-counts. The distribution of actual output lengths tells how much of a resident sequence's
``max_output - produced`` it will really generate, which the Retry-After estimate needs: reserving
the worst case is right for admission, expecting it is wrong for drain time. Memory is bounded: a
fixed set of geometric length buckets per model, exponentially decayed so that recent traffic
dominates (half of the weight comes from the last ``half_life_requests`` requests).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

_BUCKETS_PER_OCTAVE = 4
_MAX_LENGTH_TOKENS = 1 << 21
_EDGES: tuple[int, ...] = tuple(
    sorted(
        {
            round(2 ** (i / _BUCKETS_PER_OCTAVE))
            for i in range(_BUCKETS_PER_OCTAVE * _MAX_LENGTH_TOKENS.bit_length())
        }
    )
)
"""Upper edges (inclusive) of the length buckets: 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, 16, ..."""

_RENORMALISE_AT = 1e150


@dataclass(frozen=True, slots=True)
class PromptCalibration:
    requests: int
    estimated_tokens_total: int
    actual_tokens_total: int
    ratio_ewma: float
    """Smoothed estimated ÷ actual prompt tokens: above 1, the gateway over-counts."""

    @property
    def ratio(self) -> float:
        """Estimated ÷ actual over everything observed."""
        return self.estimated_tokens_total / self.actual_tokens_total if self.actual_tokens_total else 1.0


@dataclass(slots=True)
class _PromptTotals:
    """One model's running prompt totals, updated in place by every finished request."""

    requests: int
    estimated_tokens_total: int
    actual_tokens_total: int
    ratio_ewma: float


class OutputLengths:
    """Exponentially decayed histogram of actual output lengths for one model."""

    def __init__(self, half_life_requests: float = 500.0, min_weight: float = 8.0) -> None:
        self._decay = 0.5 ** (1.0 / half_life_requests)
        self._min_weight = min_weight
        self._next_weight = 1.0
        self._counts = [0.0] * (len(_EDGES) + 1)
        self._sums = [0.0] * (len(_EDGES) + 1)
        self.observed = 0

    def observe(self, output_tokens: int) -> None:
        index = bisect.bisect_left(_EDGES, max(0, output_tokens))
        self._counts[index] += self._next_weight
        self._sums[index] += self._next_weight * output_tokens
        self.observed += 1
        self._next_weight /= self._decay
        if self._next_weight > _RENORMALISE_AT:
            scale = 1.0 / self._next_weight
            self._counts = [c * scale for c in self._counts]
            self._sums = [s * scale for s in self._sums]
            self._next_weight = 1.0

    def expected_remaining_tokens(self, produced_tokens: int, max_output_tokens: int) -> float:
        """Expected tokens still to come from a sequence that produced ``produced_tokens`` of at most
        ``max_output_tokens``: mean of ``min(L, max) - produced`` over learned lengths ``L > produced``,
        or the worst case ``max - produced`` while too few such lengths were seen."""
        worst = float(max(0, max_output_tokens - produced_tokens))
        if worst == 0.0:
            return 0.0
        start = bisect.bisect_left(_EDGES, produced_tokens + 1)
        weight = 0.0
        total = 0.0
        for index in range(start, len(self._counts)):
            count = self._counts[index]
            if count <= 0.0:
                continue
            mean = self._sums[index] / count
            weight += count
            total += count * (min(max(mean, produced_tokens + 1.0), max_output_tokens) - produced_tokens)
        if weight < self._min_weight * self._next_weight * self._decay:
            return worst
        return min(worst, total / weight)

    def quantile_tokens(self, q: float) -> int | None:
        total = sum(self._counts)
        if total <= 0.0:
            return None
        target = q * total
        running = 0.0
        for index, count in enumerate(self._counts):
            running += count
            if running >= target and count > 0.0:
                return _EDGES[index] if index < len(_EDGES) else _MAX_LENGTH_TOKENS
        return _MAX_LENGTH_TOKENS


class Calibration:
    def __init__(self, half_life_requests: float = 500.0, prompt_ratio_alpha: float = 0.05) -> None:
        if not 0.0 < prompt_ratio_alpha <= 1.0:
            raise ValueError(f"prompt_ratio_alpha must be in (0, 1], got {prompt_ratio_alpha}")
        self._half_life_requests = half_life_requests
        self._alpha = prompt_ratio_alpha
        self._outputs: dict[str, OutputLengths] = {}
        self._prompts: dict[str, _PromptTotals] = {}
        self.version = 0
        """Bumped whenever the learned output lengths change, so derived estimates can be cached."""

    def observe_prompt(self, model: str, estimated_tokens: int, actual_tokens: int) -> None:
        if actual_tokens <= 0 or estimated_tokens < 0:
            return
        sample = estimated_tokens / actual_tokens
        seen = self._prompts.get(model)
        if seen is None:
            self._prompts[model] = _PromptTotals(1, estimated_tokens, actual_tokens, sample)
            return
        seen.requests += 1
        seen.estimated_tokens_total += estimated_tokens
        seen.actual_tokens_total += actual_tokens
        seen.ratio_ewma += self._alpha * (sample - seen.ratio_ewma)

    def observe_output(self, model: str, output_tokens: int) -> None:
        self.outputs(model).observe(output_tokens)
        self.version += 1

    def prompt(self, model: str) -> PromptCalibration | None:
        seen = self._prompts.get(model)
        if seen is None:
            return None
        return PromptCalibration(
            seen.requests, seen.estimated_tokens_total, seen.actual_tokens_total, seen.ratio_ewma
        )

    def outputs(self, model: str) -> OutputLengths:
        lengths = self._outputs.get(model)
        if lengths is None:
            lengths = self._outputs[model] = OutputLengths(self._half_life_requests)
        return lengths

    def expected_remaining_tokens(self, model: str, produced_tokens: int, max_output_tokens: int) -> float:
        lengths = self._outputs.get(model)
        if lengths is None:
            return float(max(0, max_output_tokens - produced_tokens))
        return lengths.expected_remaining_tokens(produced_tokens, max_output_tokens)

    def models(self) -> list[str]:
        return sorted(set(self._outputs) | set(self._prompts))
