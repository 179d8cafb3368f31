"""Token lengths drawn from a distribution: fixed, uniform, or lognormal clamped to a range."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard


class Distribution(Protocol):
    def sample(self, rng: random.Random) -> int: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Fixed:
    value_tokens: int

    def sample(self, rng: random.Random) -> int:
        return self.value_tokens

    def describe(self) -> str:
        return f"{self.value_tokens}"


@dataclass(frozen=True, slots=True)
class Uniform:
    low_tokens: int
    high_tokens: int

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low_tokens, self.high_tokens)

    def describe(self) -> str:
        return f"uniform[{self.low_tokens}, {self.high_tokens}]"


@dataclass(frozen=True, slots=True)
class LogNormal:
    median_tokens: float
    sigma: float
    min_tokens: int
    max_tokens: int

    def sample(self, rng: random.Random) -> int:
        value = round(self.median_tokens * math.exp(self.sigma * rng.gauss(0.0, 1.0)))
        return min(max(value, self.min_tokens), self.max_tokens)

    def describe(self) -> str:
        shape = f"lognormal(median {self.median_tokens:g}, sigma {self.sigma:g})"
        return f"{shape} in [{self.min_tokens}, {self.max_tokens}]"


def parse_distribution(raw: Any, where: str, errors: list[str]) -> Distribution:
    """``50``, ``{fixed: 50}``, ``{uniform: [a, b]}`` or ``{lognormal: {median, sigma, min, max}}``."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return Fixed(raw)
    if isinstance(raw, Mapping) and len(raw) == 1:
        kind, spec = next(iter(raw.items()))
        if kind == "fixed" and isinstance(spec, int) and spec >= 0:
            return Fixed(spec)
        if (
            kind == "uniform"
            and isinstance(spec, list)
            and len(spec) == 2
            and all(isinstance(x, int) for x in spec)
            and 0 <= spec[0] <= spec[1]
        ):
            return Uniform(spec[0], spec[1])
        if kind == "lognormal" and isinstance(spec, Mapping):
            median, sigma = spec.get("median"), spec.get("sigma", 0.5)
            low, high = spec.get("min", 1), spec.get("max")
            if is_number(median) and median > 0 and is_number(sigma) and sigma >= 0:
                high = high if isinstance(high, int) else round(median * 10)
                if isinstance(low, int) and 0 <= low <= high:
                    return LogNormal(float(median), float(sigma), low, high)
    errors.append(
        f"{where}: want an integer, {{fixed: n}}, {{uniform: [low, high]}} or "
        f"{{lognormal: {{median, sigma, min, max}}}}, got {raw!r}"
    )
    return Fixed(1)


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
