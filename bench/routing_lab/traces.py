"""The traces routing is judged on: one fleet shape, three loads (below saturation, overload, many prefixes).

Four simulated Llama-3.1-8B H100 replicas, each cut to 50,000 KV tokens and 16 sequences so that a
handful of long requests fills one; a mix of multi-turn sessions over shared system prompts of about
2,000 words, short chats, long documents and long generations; SLO TTFT 2 s and mean inter-token
gap 50 ms. ``below`` runs just under what the fleet can serve (routing, not shedding, decides who
meets the SLO), ``overload`` about twice that with a 2.5x burst in its middle third, and
``many-prefix`` spreads the sessions over 64 system prompts (more than the fleet's caches hold at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgate.loadtest.workload import Trace, Workload, build_trace
from kvgate.loadtest.workload_file import parse_workload

SLO_TTFT_S = 2.0
SLO_ITL_S = 0.05
BURST = ((0.0, 1.0), (0.333, 2.5), (0.667, 1.0))
"""The overload trace's rate multiplier by share of the run: 2.5x in the middle third."""
FLEET_OVERRIDES: Mapping[str, Any] = {"kv_capacity_tokens": 50_000, "max_num_seqs": 16, "warmup_s": 0}


def _classes(system_prompts: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "session",
            "weight": 0.5,
            "system_prompts": system_prompts,
            "system_prompt_tokens": {"uniform": [2400, 2800]},
            "turns": {"uniform": [3, 6]},
            "live_sessions": 48,
            "prompt_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "min": 20, "max": 600}},
            "output_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "min": 20, "max": 400}},
        },
        {
            "name": "chat",
            "weight": 0.3,
            "prompt_tokens": {"lognormal": {"median": 100, "sigma": 0.5, "min": 10, "max": 400}},
            "output_tokens": {"lognormal": {"median": 80, "sigma": 0.5, "min": 10, "max": 300}},
        },
        {
            "name": "document",
            "weight": 0.1,
            "prompt_tokens": {"uniform": [6000, 14000]},
            "output_tokens": {"lognormal": {"median": 200, "sigma": 0.3, "min": 50, "max": 400}},
        },
        {
            "name": "generation",
            "weight": 0.1,
            "prompt_tokens": {"lognormal": {"median": 200, "sigma": 0.5, "min": 20, "max": 800}},
            "output_tokens": {"uniform": [800, 1600]},
        },
    ]


@dataclass(frozen=True, slots=True)
class LabTrace:
    name: str
    rate_rps: float
    duration_s: float
    system_prompts: int = 16
    schedule: tuple[tuple[float, float], ...] = ()
    replicas: int = 4
    slo_ttft_s: float = SLO_TTFT_S
    slo_itl_s: float = SLO_ITL_S
    profile_overrides: Mapping[str, Any] = field(default_factory=lambda: dict(FLEET_OVERRIDES))

    def workload(self) -> Workload:
        return parse_workload(
            {
                "name": self.name,
                "api": "chat",
                "duration_s": self.duration_s,
                "rate_rps": self.rate_rps,
                "schedule": [list(step) for step in self.schedule],
                "slo_ttft_s": self.slo_ttft_s,
                "slo_itl_s": self.slo_itl_s,
                "classes": _classes(self.system_prompts),
            }
        )

    def trace(self, seed: int) -> Trace:
        return build_trace(self.workload(), seed)


TRACES: Mapping[str, LabTrace] = {
    trace.name: trace
    for trace in (
        LabTrace("below", rate_rps=18.0, duration_s=90.0),
        LabTrace("overload", rate_rps=16.0, duration_s=90.0, schedule=BURST),
        LabTrace("many-prefix", rate_rps=16.0, duration_s=90.0, system_prompts=64),
    )
}
