"""Latency samples and counts over a sliding time window, in memory bounded by the window.

Each event is recorded once, into the one-second slot of the moment it happened: a latency into a
log-binned histogram (bins 5 % wide, from 0.1 ms to 10,000 s), a count into a sum. Slots older than
the window are dropped as new ones open, so memory is bounded by the window whatever the request
rate. Quantiles are read from the merged bins (relative error under the bin ratio, 5 %); rates
divide the window's sums by the window, or by the time since the first slot while the window is not
yet full. Time is passed in by the caller.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SLOT_S = 1.0
_BIN_RATIO = 1.05
_BIN_FLOOR_S = 1e-4
_BIN_COUNT = math.ceil(math.log(1e4 / _BIN_FLOOR_S) / math.log(_BIN_RATIO))
BIN_UPPER_BOUNDS: tuple[float, ...] = tuple(_BIN_FLOOR_S * _BIN_RATIO**i for i in range(_BIN_COUNT + 1))


def bin_counts(bounds: Sequence[float], values: Iterable[float]) -> list[tuple[int, int]]:
    """``(bin, count)`` for each bin of ``bounds`` that ``values`` fall in, the bin of a value being
    ``bisect_left(bounds, value)`` (the first bound at or above it; ``len(bounds)`` above them all).

    The values are sorted first, so binning costs a bisect per occupied bin rather than per value:
    a stream's few dozen inter-token gaps fall in a handful of bins, and a Python loop step costs
    far more than sorting floats."""
    ordered = sorted(values)
    n = len(ordered)
    top = len(bounds)
    counts = []
    i = 0
    while i < n:
        b = bisect_left(bounds, ordered[i])
        j = n if b == top else max(bisect_right(ordered, bounds[b], i), i + 1)
        counts.append((b, j - i))
        i = j
    return counts


@dataclass(slots=True)
class _Slot:
    index: int
    bins: dict[int, int] = field(default_factory=dict)


class LatencyWindow:
    """Latency samples of the last ``window_s`` seconds, as a histogram with 5 % wide bins."""

    __slots__ = ("_slots", "_window_slots")

    def __init__(self, window_s: float) -> None:
        self._window_slots = max(1, math.ceil(window_s / SLOT_S))
        self._slots: deque[_Slot] = deque()

    def observe(self, value_s: float, now_s: float) -> None:
        slots = self._slots
        if not slots or slots[-1].index != int(now_s // SLOT_S):
            self._open(now_s)
        bins = slots[-1].bins
        b = bisect_left(BIN_UPPER_BOUNDS, value_s)
        bins[b] = bins.get(b, 0) + 1

    def observe_many(self, values_s: Sequence[float], now_s: float) -> None:
        """Several samples taken by ``now_s`` (a stream's inter-token gaps), binned in one pass."""
        slots = self._slots
        if not slots or slots[-1].index != int(now_s // SLOT_S):
            self._open(now_s)
        bins = slots[-1].bins
        for b, n in bin_counts(BIN_UPPER_BOUNDS, values_s):
            bins[b] = bins.get(b, 0) + n

    def _open(self, now_s: float) -> None:
        """Open the slot of ``now_s``'s second (once a second at most) and drop those past the window."""
        index = int(now_s // SLOT_S)
        self._slots.append(_Slot(index))
        self._prune(index)

    def _prune(self, index: int) -> None:
        while self._slots and self._slots[0].index <= index - self._window_slots:
            self._slots.popleft()

    def merged(self, now_s: float) -> dict[int, int]:
        self._prune(int(now_s // SLOT_S))
        total: dict[int, int] = {}
        for slot in self._slots:
            for b, n in slot.bins.items():
                total[b] = total.get(b, 0) + n
        return total

    def quantile(self, q: float, now_s: float) -> float | None:
        """The ``q`` quantile of the window's samples (upper edge of its bin); None when empty."""
        bins = self.merged(now_s)
        n = sum(bins.values())
        if n == 0:
            return None
        rank = max(1, math.ceil(q * n))
        seen = 0
        for b in sorted(bins):
            seen += bins[b]
            if seen >= rank:
                return BIN_UPPER_BOUNDS[min(b, len(BIN_UPPER_BOUNDS) - 1)]
        raise AssertionError("rank beyond sample count")


class _SlotWindow:
    """Per-second slots of sums over the last ``window_s`` seconds, read as totals or per-second rates.

    A slot is ``[second, sum, ...]``; subclasses decide how many sums a slot carries and add to the
    one ``_slot`` returns, so recording costs one lookup however many sums change together."""

    __slots__ = ("_first_s", "_slots", "_width", "_window_s", "_window_slots")

    def __init__(self, window_s: float, width: int) -> None:
        self._window_s = window_s
        self._window_slots = max(1, math.ceil(window_s / SLOT_S))
        self._width = width
        self._slots: deque[list[int]] = deque()
        self._first_s: float | None = None

    def _slot(self, now_s: float) -> list[int]:
        """The slot of ``now_s``'s second, opened (and the window pruned) on its first use."""
        index = int(now_s // SLOT_S)
        if self._first_s is None:
            self._first_s = now_s
        slots = self._slots
        if not slots or slots[-1][0] != index:
            slots.append([index] + [0] * self._width)
            self._prune(index)
        return slots[-1]

    def _prune(self, index: int) -> None:
        while self._slots and self._slots[0][0] <= index - self._window_slots:
            self._slots.popleft()

    def _rates(self, now_s: float) -> list[float]:
        """Each sum over the window divided by the seconds it covers (all zero before any add)."""
        if self._first_s is None:
            return [0.0] * self._width
        self._prune(int(now_s // SLOT_S))
        span_s = min(self._window_s, max(SLOT_S, now_s - self._first_s))
        return [sum(slot[column] for slot in self._slots) / span_s for column in range(1, self._width + 1)]


class CountWindow(_SlotWindow):
    """A count over the last ``window_s`` seconds (the ``/signals`` decision counts)."""

    __slots__ = ()

    def __init__(self, window_s: float) -> None:
        super().__init__(window_s, 1)

    def add(self, n: int, now_s: float) -> None:
        self._slot(now_s)[1] += n

    def total(self, now_s: float) -> int:
        self._prune(int(now_s // SLOT_S))
        return sum(slot[1] for slot in self._slots)


class ServedWindow(_SlotWindow):
    """Finished requests over the last ``window_s`` seconds: their prompt tokens, output tokens and
    count, read as per-second rates. The three always change together, so each second's slot holds
    all three sums and a request is recorded with one slot lookup."""

    __slots__ = ()

    def __init__(self, window_s: float) -> None:
        super().__init__(window_s, 3)

    def add(self, prompt_tokens: int, output_tokens: int, now_s: float) -> None:
        slot = self._slot(now_s)
        slot[1] += prompt_tokens
        slot[2] += output_tokens
        slot[3] += 1

    def rates_per_s(self, now_s: float) -> tuple[float, float, float]:
        """Prompt tokens, output tokens and requests per second."""
        prompt, output, requests = self._rates(now_s)
        return prompt, output, requests
