"""What one point of the open streams benchmark measured, and how it is read back from JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Point:
    streams: int
    itl_ms: float

    @classmethod
    def parse(cls, text: str) -> Point:
        streams, _, itl_ms = text.partition("@")
        return cls(int(streams), float(itl_ms))

    def __str__(self) -> str:
        return f"{self.streams}@{self.itl_ms:g}"


@dataclass(frozen=True, slots=True)
class Quantiles:
    p50: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Quantiles:
        if not values:
            return cls(math.nan, math.nan)
        ordered = sorted(values)
        return cls(ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])


@dataclass(frozen=True, slots=True)
class Side:
    """One point's measurements on one side (straight to the backends, or through the gateway)."""

    streams_done: int
    errors: int
    first_error: str
    window_tokens: int
    window_s: float
    itl_s: Quantiles
    tokens: int = 0
    """Tokens received over the whole run, not only the window."""


@dataclass(frozen=True, slots=True)
class GatewayFigures:
    idle_rss_bytes: int
    window_start_rss_bytes: int
    open_rss_bytes: int
    after_rss_bytes: int
    cpu_s: float
    idle_cpu_per_s: float
    """CPU seconds per second with no stream open (health probes, scrapes, the lag sampler)."""
    lag_idle_s: Quantiles
    lag_s: Quantiles
    lag_max_s: float
    opening_lag_max_s: float
    """The largest lag while the streams were opening."""
    full_collections: int
    """Full (generation 2) garbage collections from the first stream to the window's end."""
    full_collection_max_s: float
    work_after: dict[str, float]

    def per_stream_bytes(self, streams: int) -> float:
        return (self.open_rss_bytes - self.idle_rss_bytes) / streams


@dataclass(frozen=True, slots=True)
class PointResult:
    point: Point
    direct: Side
    via: Side
    gateway: GatewayFigures

    @property
    def cpu_per_token_s(self) -> float:
        return self.gateway.cpu_s / max(self.via.window_tokens, 1)

    @property
    def retained_per_token_bytes(self) -> float:
        """How much the gateway's RSS grew over the window, per token relayed in it: what an open
        stream keeps for each token it has carried."""
        g = self.gateway
        return (g.open_rss_bytes - g.window_start_rss_bytes) / max(self.via.window_tokens, 1)

    @property
    def net_cpu_per_token_s(self) -> float:
        """Less what the gateway spends idle over as long."""
        idle_s = self.gateway.idle_cpu_per_s * self.via.window_s
        return (self.gateway.cpu_s - idle_s) / max(self.via.window_tokens, 1)


def result_of(fields: dict[str, Any]) -> PointResult:
    """A ``PointResult`` back from its JSON (``results.json``)."""

    def side(values: dict[str, Any]) -> Side:
        return Side(**(values | {"itl_s": Quantiles(**values["itl_s"])}))

    gateway = fields["gateway"]
    quantiles = {key: Quantiles(**gateway[key]) for key in ("lag_idle_s", "lag_s")}
    return PointResult(
        Point(**fields["point"]),
        side(fields["direct"]),
        side(fields["via"]),
        GatewayFigures(**(gateway | quantiles)),
    )


def print_row(result: PointResult) -> None:
    g, via, direct = result.gateway, result.via, result.direct
    print(
        f"{result.point!s:>10}  mem/stream {g.per_stream_bytes(result.point.streams) / 1024:6.1f} KiB"
        f"  CPU/token {result.cpu_per_token_s * 1e6:6.1f} us"
        f" (net of idle {result.net_cpu_per_token_s * 1e6:.1f})"
        f"  RSS growth {result.retained_per_token_bytes:.0f} B/token"
        f"  lag p99 {g.lag_s.p99 * 1000:6.2f} ms (idle {g.lag_idle_s.p99 * 1000:.2f})"
        f"  ITL p50/p99 via {via.itl_s.p50 * 1000:.1f}/{via.itl_s.p99 * 1000:.1f}"
        f" direct {direct.itl_s.p50 * 1000:.1f}/{direct.itl_s.p99 * 1000:.1f} ms"
        f" (pace {result.point.itl_ms:g})  errors {via.errors}+{direct.errors}"
        f"  work after {sum(g.work_after.values()):g}"
        f"  opening lag max {g.opening_lag_max_s * 1000:.0f} ms, {g.full_collections} full GCs"
        f" (longest {g.full_collection_max_s * 1000:.0f} ms)",
        flush=True,
    )
    if via.first_error or direct.first_error:
        print(f"    first error: {via.first_error or direct.first_error}")
