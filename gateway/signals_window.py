"""Per-pool work and latency signals over a sliding time window, for ``GET /signals``.

Two kinds of input feed this module. Work is a *state*: the gateway reports it when asked, through
the ``PoolWorkSource`` protocol (prompt tokens queued and pending, resident sequences, remaining
decode tokens, per-replica KV occupancy and readiness), so it is always current and returns to
zero when nothing is in flight. Latencies and token counts are *events*: each is recorded once,
into one-second slots of a log-binned histogram or a counter, and slots older than the window are
dropped, so memory is bounded by the window whatever the request rate. Quantiles are read from the
merged bins (relative error under the bin ratio, 5 %); rates divide the window's counts by the
window, or by the time since the first slot when the window is not yet full. The clock is injected.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoscaler.signals import PoolSignals
from vocabulary.replica import Role

Clock = Callable[[], float]

SLOT_S = 1.0
_BIN_RATIO = 1.05
_BIN_FLOOR_S = 1e-4
_BIN_COUNT = math.ceil(math.log(1e4 / _BIN_FLOOR_S) / math.log(_BIN_RATIO))
BIN_UPPER_BOUNDS: tuple[float, ...] = tuple(_BIN_FLOOR_S * _BIN_RATIO**i for i in range(_BIN_COUNT + 1))
LATENCY_KINDS = ("ttft", "itl", "queue_wait", "e2e")


@dataclass(frozen=True, slots=True)
class ReplicaWork:
    """One replica's state as the gateway sees it."""

    replica: str
    kv_capacity_tokens: int
    kv_occupancy_estimate_ratio: float
    """kvgate's reservations (prompt + max output per resident sequence) over capacity."""
    kv_occupancy_scraped_ratio: float | None
    """The replica's own ``vllm:kv_cache_usage_perc``; None when never scraped or stale."""
    ready: bool
    warming: bool = False
    """Ready but still inside the warm-up ramp (taking a reduced share of traffic)."""


@dataclass(frozen=True, slots=True)
class ModelWork:
    """Work for one model in one pool, in tokens and sequences."""

    model: str
    queued_requests: int = 0
    queued_prompt_tokens: int = 0
    """Prompt tokens of requests waiting in kvgate's admission queue."""
    pending_prompt_tokens: int = 0
    """Prompt tokens of admitted requests that have not produced a first token yet."""
    resident_sequences: int = 0
    remaining_decode_tokens: int = 0
    """Sum of ``max_output_tokens - produced`` over resident sequences: a worst-case bound."""


@dataclass(frozen=True, slots=True)
class PoolWork:
    pool: str
    role: Role
    models: tuple[ModelWork, ...] = ()
    replicas: tuple[ReplicaWork, ...] = ()

    def total(self, name: str) -> int:
        """Sum of one ``ModelWork`` field over the pool's models."""
        return sum(int(getattr(m, name)) for m in self.models)

    @property
    def kv_occupancy_estimate_ratio(self) -> float:
        return _weighted_occupancy(
            [(r.kv_capacity_tokens, r.kv_occupancy_estimate_ratio) for r in self.replicas]
        )

    @property
    def kv_occupancy_scraped_ratio(self) -> float | None:
        scraped = [
            (r.kv_capacity_tokens, r.kv_occupancy_scraped_ratio)
            for r in self.replicas
            if r.kv_occupancy_scraped_ratio is not None
        ]
        return _weighted_occupancy(scraped) if scraped else None


class PoolWorkSource(Protocol):
    """What the gateway reports about its pools at the instant it is asked."""

    def pool_work(self) -> Iterable[PoolWork]: ...


def _weighted_occupancy(pairs: list[tuple[int, float]]) -> float:
    capacity = sum(c for c, _ in pairs)
    return sum(c * r for c, r in pairs) / capacity if capacity > 0 else 0.0


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
        index = int(now_s // SLOT_S)
        slots = self._slots
        if not slots or slots[-1].index != index:
            slots.append(_Slot(index))
            self._prune(index)
        bins = slots[-1].bins
        b = bisect_left(BIN_UPPER_BOUNDS, value_s)
        bins[b] = bins.get(b, 0) + 1

    def observe_many(self, values_s: Sequence[float], now_s: float) -> None:
        """Several samples taken by ``now_s`` (a stream's inter-token gaps), binned in one pass."""
        index = int(now_s // SLOT_S)
        slots = self._slots
        if not slots or slots[-1].index != index:
            slots.append(_Slot(index))
            self._prune(index)
        bins = slots[-1].bins
        get = bins.get
        for value_s in values_s:
            b = bisect_left(BIN_UPPER_BOUNDS, value_s)
            bins[b] = get(b, 0) + 1

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


@dataclass(slots=True)
class PoolWindows:
    latency: dict[str, LatencyWindow]
    served: ServedWindow
    decisions: dict[str, CountWindow]


@dataclass(frozen=True, slots=True)
class Desired:
    replicas: int
    reason: str


class SignalsWindow:
    """Windowed per-pool aggregates: fed by one record call per event, read by ``snapshot``."""

    def __init__(self, clock: Clock, window_s: float = 60.0, quantile: float = 0.95) -> None:
        self._clock = clock
        self.window_s = window_s
        self.quantile = quantile
        self._pools: dict[str, PoolWindows] = {}
        self._desired: dict[str, Desired] = {}

    def pool_windows(self, pool: str) -> PoolWindows:
        windows = self._pools.get(pool)
        if windows is None:
            w = self.window_s
            windows = PoolWindows(
                latency={kind: LatencyWindow(w) for kind in LATENCY_KINDS},
                served=ServedWindow(w),
                decisions={},
            )
            self._pools[pool] = windows
        return windows

    def decision_window(self, pool: str, decision: str) -> CountWindow:
        """The window counting ``decision`` outcomes in ``pool`` (created on first use)."""
        decisions = self.pool_windows(pool).decisions
        window = decisions.get(decision)
        if window is None:
            window = decisions[decision] = CountWindow(self.window_s)
        return window

    def set_desired(self, pool: str, replicas: int, reason: str) -> None:
        self._desired[pool] = Desired(replicas, reason)

    def desired(self) -> Mapping[str, Desired]:
        return dict(self._desired)

    def snapshot(self, work: Iterable[PoolWork]) -> dict[str, Any]:
        """The ``/signals`` document (see docs/autoscaling.md for every field)."""
        now_s = self._clock()
        pools: dict[str, dict[str, Any]] = {}
        for pw in work:
            pools[pw.pool] = self._pool_doc(pw, now_s)
        return {"time_s": now_s, "window_s": self.window_s, "quantile": self.quantile, "pools": pools}

    def _pool_doc(self, pw: PoolWork, now_s: float) -> dict[str, Any]:
        windows = self.pool_windows(pw.pool)
        q = self.quantile
        desired = self._desired.get(pw.pool)
        prompt_tokens_per_s, output_tokens_per_s, requests_per_s = windows.served.rates_per_s(now_s)
        return {
            "role": str(pw.role),
            "replicas_current": len(pw.replicas),
            "replicas_ready": sum(1 for r in pw.replicas if r.ready),
            "replicas_warming": sum(1 for r in pw.replicas if r.ready and r.warming),
            "kv_occupancy_estimate_ratio": pw.kv_occupancy_estimate_ratio,
            "kv_occupancy_scraped_ratio": pw.kv_occupancy_scraped_ratio,
            "queued_requests": pw.total("queued_requests"),
            "queued_prompt_tokens": pw.total("queued_prompt_tokens"),
            "pending_prompt_tokens": pw.total("pending_prompt_tokens"),
            "resident_sequences": pw.total("resident_sequences"),
            "remaining_decode_tokens": pw.total("remaining_decode_tokens"),
            "ttft_p95_s": windows.latency["ttft"].quantile(q, now_s),
            "itl_p95_s": windows.latency["itl"].quantile(q, now_s),
            "queue_wait_p95_s": windows.latency["queue_wait"].quantile(q, now_s),
            "e2e_p95_s": windows.latency["e2e"].quantile(q, now_s),
            "prompt_tokens_per_s": prompt_tokens_per_s,
            "output_tokens_per_s": output_tokens_per_s,
            "requests_per_s": requests_per_s,
            "decisions": {d: w.total(now_s) for d, w in sorted(windows.decisions.items())},
            "desired_replicas": desired.replicas if desired else None,
            "desired_reason": desired.reason if desired else None,
            "replicas": [
                {
                    "replica": r.replica,
                    "ready": r.ready,
                    "warming": r.warming,
                    "kv_occupancy_estimate_ratio": r.kv_occupancy_estimate_ratio,
                    "kv_occupancy_scraped_ratio": r.kv_occupancy_scraped_ratio,
                }
                for r in pw.replicas
            ],
        }


def pool_signals(doc: Mapping[str, Any], time_s: float) -> list[PoolSignals]:
    """The policy's input from a ``/signals`` document, stamped with the reader's clock ``time_s``.

    The scraped KV occupancy is preferred when present (it is vLLM's own account, prefix-cache
    sharing included); the estimate is the fallback. A missing latency (no samples in the window)
    stays None: the policy reads it as "no evidence of slowness"."""
    samples = []
    for pool, p in sorted(doc.get("pools", {}).items()):
        scraped = p.get("kv_occupancy_scraped_ratio")
        samples.append(
            PoolSignals(
                time_s=time_s,
                pool=pool,
                role=Role(p.get("role", "mixed")),
                replicas_current=int(p["replicas_current"]),
                replicas_ready=int(p["replicas_ready"]),
                kv_occupancy_ratio=float(
                    scraped if scraped is not None else p["kv_occupancy_estimate_ratio"]
                ),
                ttft_p95_s=p.get("ttft_p95_s"),
                itl_p95_s=p.get("itl_p95_s"),
                queue_wait_p95_s=p.get("queue_wait_p95_s"),
                prompt_tokens_queued=int(p.get("queued_prompt_tokens", 0))
                + int(p.get("pending_prompt_tokens", 0)),
                resident_sequences=int(p.get("resident_sequences", 0)),
                prompt_tokens_per_s=float(p.get("prompt_tokens_per_s", 0.0)),
                output_tokens_per_s=float(p.get("output_tokens_per_s", 0.0)),
            )
        )
    return samples
