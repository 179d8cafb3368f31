"""``--mode real``: what a closed-loop run is made of (its plan, the gateway's config, the load) and
the two scalers that act on it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.autoscale.scenario import MIN_REPLICAS
from bench.harness.gateway_config import Model, Pool, gateway_config
from kvgate.autoscaler.recommendation import Recommendation
from kvgate.loadtest.workload import Workload
from kvgate.loadtest.workload_file import parse_workload

SCALE_RATIO = 6.0
"""Policy seconds per wall second in the real run: every window and the cold start are divided by it."""
REAL_PROFILE = "llama-3.1-70b-4xh100"
REAL_MODEL = "meta-llama/Llama-3.1-70B-Instruct"
REAL_KV_BYTES_PER_TOKEN = 327_680
REAL_PREFILL_TOKENS_PER_S = 12_000.0
"""The profile's measured prefill rate per replica (docs/simulator.md), the token-rate floor's C."""
REAL_BASE_PROMPT_TOKENS = 500
REAL_BURST_PROMPT_TOKENS = 8000
ADMIN_TOKEN = "bench-autoscale"


@dataclass(frozen=True, slots=True)
class RealPlan:
    base_rps: float
    warm_s: float
    burst_s: float
    tail_s: float
    cold_start_s: float
    seed: int

    @property
    def duration_s(self) -> float:
        return self.warm_s + self.burst_s + self.tail_s

    @property
    def burst(self) -> tuple[float, float]:
        return self.warm_s, self.warm_s + self.burst_s


def scaled_policy(plan: RealPlan) -> dict[str, Any]:
    """The seed's policy with every duration divided by ``SCALE_RATIO`` (latency targets unscaled)."""
    return {
        "interval_s": 15.0 / SCALE_RATIO,
        "signals_window_s": 60.0 / SCALE_RATIO,
        "policy": {
            "min_replicas": MIN_REPLICAS,
            "max_replicas": 8,
            "scale_out_window_s": 60.0 / SCALE_RATIO,
            "scale_in_window_s": 600.0 / SCALE_RATIO,
            "scale_in_sizing_window_s": 60.0 / SCALE_RATIO,
            "scale_down_delay_s": 300.0 / SCALE_RATIO,
            "growth_window_s": 60.0 / SCALE_RATIO,
            "backlog_drain_s": 60.0 / SCALE_RATIO,
            "cold_start_s": plan.cold_start_s,
            "prefill_capacity_tokens_per_s": REAL_PREFILL_TOKENS_PER_S,
            "scale_out_itl_s": 0.15,
            "scale_in_itl_s": 0.06,
        },
    }


def gateway(plan: RealPlan, replica_urls: list[str], port: int) -> dict[str, Any]:
    """One pool of the profile's replicas, the admin API the actuator resizes it through, and the
    autoscaler section, so the gateway runs the policy on its own ``/signals``."""
    return gateway_config(
        Pool(replica_urls, kv_capacity_tokens=420_000),
        port=port,
        model=Model(REAL_MODEL, kv_bytes_per_token=REAL_KV_BYTES_PER_TOKEN),
        auth={"admin_token": ADMIN_TOKEN},
        health={"interval_s": 1.0, "timeout_s": 1.0},
        routing={"warmup_s": 30.0 / SCALE_RATIO},
        autoscaler=scaled_policy(plan),
    )


def real_workloads(plan: RealPlan) -> list[Workload]:
    """The normal mix all along, plus as many requests again with 16x longer prompts in the burst."""
    start, end = plan.burst
    total = plan.duration_s
    output = {"lognormal": {"median": 120, "sigma": 0.4, "min": 20, "max": 400}}
    base = parse_workload(
        {
            "name": "normal",
            "api": "chat",
            "duration_s": total,
            "rate_rps": plan.base_rps,
            "classes": [
                {
                    "name": "normal",
                    "prompt_tokens": {
                        "lognormal": {"median": REAL_BASE_PROMPT_TOKENS, "sigma": 0.4, "min": 50, "max": 2000}
                    },
                    "output_tokens": output,
                }
            ],
        }
    )
    burst = parse_workload(
        {
            "name": "burst",
            "api": "chat",
            "duration_s": total,
            "rate_rps": plan.base_rps,
            "schedule": [[0.0, 0.0], [start / total, 1.0], [end / total, 0.0]],
            "classes": [
                {
                    "name": "long",
                    "prompt_tokens": {
                        "lognormal": {
                            "median": REAL_BURST_PROMPT_TOKENS,
                            "sigma": 0.3,
                            "min": 4000,
                            "max": 14000,
                        }
                    },
                    "output_tokens": output,
                }
            ],
        }
    )
    return [base, burst]


RealBrain = Callable[[dict[str, Any], float], Recommendation | None]
"""(the /signals document, seconds since the load started) -> what to ask the actuator for."""


def kvgate_brain(pool: str) -> RealBrain:
    """Acts on what the gateway's own policy publishes on /signals (as KEDA would on the metric)."""

    def decide(doc: dict[str, Any], now_s: float) -> Recommendation | None:
        p = doc["pools"][pool]
        if p.get("desired_replicas") is None:
            return None
        return Recommendation(pool, int(p["desired_replicas"]), str(p.get("desired_reason", "")))

    return decide


def request_rate_brain(pool: str, target_rps_per_replica: float, arrivals_s: list[float]) -> RealBrain:
    """HPA on ingress requests/s (arrivals over the signals window, as a load balancer counts them):
    up at once, down to the highest answer of the stabilisation window."""
    history: deque[tuple[float, int]] = deque()
    stabilization_s = 300.0 / SCALE_RATIO
    window_s = 60.0 / SCALE_RATIO

    def decide(doc: dict[str, Any], now_s: float) -> Recommendation | None:
        p = doc["pools"][pool]
        arrived = bisect.bisect_right(arrivals_s, now_s) - bisect.bisect_right(arrivals_s, now_s - window_s)
        raw = max(MIN_REPLICAS, math.ceil(arrived / window_s / target_rps_per_replica))
        history.append((now_s, raw))
        while history[0][0] < now_s - stabilization_s:
            history.popleft()
        current = int(p["replicas_current"])
        desired = raw if raw >= current else max(n for _, n in history)
        return Recommendation(pool, min(8, desired), "requests_per_s")

    return decide


def baseline_real_capacity_rps() -> float:
    """Requests/s one replica of the profile sustains at the normal mix: its prefill rate over the
    normal prompt (decode and KV allow more at this mix)."""
    return REAL_PREFILL_TOKENS_PER_S / REAL_BASE_PROMPT_TOKENS
