"""The ``/signals`` document: per-pool work, windowed latency quantiles, token and request rates,
admission decisions and the autoscaling policy's last answer.

``GatewayMetrics`` records each event into the pool's windows here (``pool_windows``,
``decision_window``) and each recommendation (``set_desired``); ``snapshot`` reads them beside the
work the gateway reports at that instant (``PoolWork``) and writes the document, which
``kvgate.autoscaler.signals.pool_signals`` reads back into the policy's input (a test reads every
field this module writes through it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.gateway.telemetry.pool_work import PoolWork
from kvgate.gateway.telemetry.sliding_windows import CountWindow, LatencyWindow, ServedWindow
from kvgate.vocabulary.clock import Clock


@dataclass(frozen=True, slots=True)
class PoolWindows:
    """One pool's windows: what the recorder writes each event into and ``snapshot`` reads."""

    ttft: LatencyWindow
    itl: LatencyWindow
    queue_wait: LatencyWindow
    e2e: LatencyWindow
    served: ServedWindow
    decisions: dict[str, CountWindow]
    """One count per admission outcome (``admit``, ``queue``, ``reject``), opened by its first."""


@dataclass(frozen=True, slots=True)
class Desired:
    """The autoscaling policy's last answer for a pool."""

    replicas: int
    reason: str
    forecast_replicas: float | None = None
    """Demand the policy's forecast expects over its lead, in replicas (None: no forecast)."""
    forecast_error_replicas: float | None = None
    """The latest forecast whose lead has passed minus the most demand that came over it."""


class SignalsWindow:
    """Every pool's windows and last recommendation; ``snapshot`` reads them into ``/signals``."""

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
            windows = self._pools[pool] = PoolWindows(
                LatencyWindow(w), LatencyWindow(w), LatencyWindow(w), LatencyWindow(w), ServedWindow(w), {}
            )
        return windows

    def decision_window(self, pool: str, decision: str) -> CountWindow:
        """The window counting ``decision`` outcomes in ``pool`` (created on first use)."""
        decisions = self.pool_windows(pool).decisions
        window = decisions.get(decision)
        if window is None:
            window = decisions[decision] = CountWindow(self.window_s)
        return window

    def set_desired(
        self,
        pool: str,
        replicas: int,
        reason: str,
        forecast_replicas: float | None = None,
        forecast_error_replicas: float | None = None,
    ) -> None:
        self._desired[pool] = Desired(replicas, reason, forecast_replicas, forecast_error_replicas)

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
            "ttft_p95_s": windows.ttft.quantile(q, now_s),
            "itl_p95_s": windows.itl.quantile(q, now_s),
            "queue_wait_p95_s": windows.queue_wait.quantile(q, now_s),
            "e2e_p95_s": windows.e2e.quantile(q, now_s),
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
