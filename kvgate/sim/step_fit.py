"""The simulator's step-time model fitted to what a real replica reports of itself.

A replica's own latency histograms give two families of points: time to first token of a lone
request against its prompt length (one prefill step, plus the front end's tokenisation and hand-off),
and inter-token latency against the number of sequences decoding together (one decode step each).
The step model they are fitted to is the profile's (``kvgate.sim.profile.step_duration_s``) with the
weights' read folded into the fixed cost, which is what a short run can tell apart::

    step_s = t_fixed_s + seqs * seq_overhead_s + tokens * token_s + attention_ctx * attention_token_ctx_s
    ttft_s(P) = frontend_latency_s + step_s(seqs=1, tokens=P, attention_ctx=P²/2)
    itl_s(B)  = step_s(seqs=B, tokens=B, attention_ctx=B * context)

The prefill points fix ``token_s`` and ``attention_token_ctx_s`` (a straight line plus a square in
the prompt length); the decode points fix
``t_fixed_s`` (the intercept) and, from the slope less what prefill already explains per token,
``seq_overhead_s``, the per-sequence cost of sampling and bookkeeping that dominates a small
model's decode; what the lone prefill's intercept leaves over is the front end's latency. Every
coefficient is kept at or above zero: a noisy run can make a cost small, never negative. Medians
per point come in; this module only does arithmetic.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TtftPoint:
    """Time to first token of a lone request with ``prompt_tokens`` (nothing cached), as reported."""

    prompt_tokens: int
    ttft_s: float


@dataclass(frozen=True, slots=True)
class ItlPoint:
    """Inter-token latency with ``batch`` sequences decoding together at about ``context_tokens``."""

    batch: int
    context_tokens: float
    itl_s: float


@dataclass(frozen=True, slots=True)
class StepFit:
    t_fixed_s: float
    seq_overhead_s: float
    token_s: float
    attention_token_ctx_s: float
    frontend_latency_s: float

    def step_s(self, seqs: int, tokens: int, attention_ctx_tokens: float) -> float:
        return (
            self.t_fixed_s
            + seqs * self.seq_overhead_s
            + tokens * self.token_s
            + attention_ctx_tokens * self.attention_token_ctx_s
        )

    def ttft_s(self, prompt_tokens: int) -> float:
        """A lone request's predicted time to first token."""
        return self.frontend_latency_s + self.step_s(1, prompt_tokens, prompt_tokens * prompt_tokens / 2)

    def itl_s(self, batch: int, context_tokens: float) -> float:
        """The predicted inter-token latency of ``batch`` sequences decoding together."""
        return self.step_s(batch, batch, batch * context_tokens)


def fit_step_model(ttft: Sequence[TtftPoint], itl: Sequence[ItlPoint]) -> StepFit:
    """The step model through the median of each point (at least two prompt lengths and two batch
    sizes); a ``ValueError`` when there are fewer."""
    by_prompt = _medians([(p.prompt_tokens, p.ttft_s) for p in ttft])
    by_batch = _medians([(p.batch, p.itl_s) for p in itl])
    if len(by_prompt) < 2 or len(by_batch) < 2:
        raise ValueError("need time to first token at two prompt lengths and latency at two batch sizes")
    intercept_prefill, token_s, square = _quadratic_nonnegative(by_prompt)
    attention_token_ctx_s = 2 * square
    t_fixed_s, slope = _line_nonnegative(by_batch)
    context_tokens = statistics.median(p.context_tokens for p in itl)
    seq_overhead_s = max(0.0, slope - token_s - attention_token_ctx_s * context_tokens)
    frontend_latency_s = max(0.0, intercept_prefill - t_fixed_s - seq_overhead_s)
    return StepFit(
        t_fixed_s=t_fixed_s,
        seq_overhead_s=seq_overhead_s,
        token_s=token_s,
        attention_token_ctx_s=attention_token_ctx_s,
        frontend_latency_s=frontend_latency_s,
    )


def _medians(points: Sequence[tuple[int, float]]) -> list[tuple[float, float]]:
    grouped: dict[int, list[float]] = {}
    for x, y in points:
        grouped.setdefault(x, []).append(y)
    return [(float(x), statistics.median(ys)) for x, ys in sorted(grouped.items())]


def _line_nonnegative(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with ``a, b >= 0``."""
    a, b = _nonnegative_least_squares([(1.0, x) for x, _ in points], [y for _, y in points])
    return a, b


def _quadratic_nonnegative(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares ``y = a + b x + c x^2`` with every coefficient >= 0."""
    rows = [(1.0, x, x * x) for x, _ in points]
    a, b, c = _nonnegative_least_squares(rows, [y for _, y in points])
    return a, b, c


def _nonnegative_least_squares(rows: Sequence[tuple[float, ...]], ys: Sequence[float]) -> tuple[float, ...]:
    """The least-squares coefficients, all >= 0: every subset of the columns is fitted freely and
    the best fit whose coefficients are all >= 0 wins (the columns here are two or three, so trying
    every subset is cheaper than being clever). Columns are scaled to keep the systems well posed."""
    width = len(rows[0])
    scales = [max(abs(row[j]) for row in rows) or 1.0 for j in range(width)]
    scaled = [[row[j] / scales[j] for j in range(width)] for row in rows]
    best: tuple[float, list[float]] = (math.inf, [0.0] * width)
    for mask in range(1, 1 << width):
        columns = [j for j in range(width) if mask >> j & 1]
        if len(columns) > len(rows):
            continue
        solved = _least_squares([[row[j] for j in columns] for row in scaled], ys)
        if solved is None or min(solved) < 0:
            continue
        coefficients = [0.0] * width
        for j, value in zip(columns, solved, strict=True):
            coefficients[j] = value
        residual = sum(
            (y - sum(c * v for c, v in zip(coefficients, row, strict=True))) ** 2
            for row, y in zip(scaled, ys, strict=True)
        )
        if residual < best[0]:
            best = (residual, coefficients)
    return tuple(c / scale for c, scale in zip(best[1], scales, strict=True))


def _least_squares(rows: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    """Ordinary least squares through the normal equations; None when they are singular."""
    size = len(rows[0])
    augmented = []
    for i in range(size):
        normal_row = [sum(r[i] * r[j] for r in rows) for j in range(size)]
        augmented.append([*normal_row, sum(r[i] * y for r, y in zip(rows, ys, strict=True))])
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(augmented[r][col]))
        augmented[col], augmented[pivot] = augmented[pivot], augmented[col]
        if abs(augmented[col][col]) < 1e-12:
            return None
        for row in range(size):
            if row != col:
                factor = augmented[row][col] / augmented[col][col]
                augmented[row] = [v - factor * p for v, p in zip(augmented[row], augmented[col], strict=True)]
    return [augmented[i][size] / augmented[i][i] for i in range(size)]
