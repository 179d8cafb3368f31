"""The goodput benchmark's own trace: ``mixed``'s short and 30,000-token requests beside
``shared-prefix`` sessions, open loop (``--trace`` plays one of the routing lab's instead)."""

from __future__ import annotations

from kvgate.loadtest.workload import Workload
from kvgate.loadtest.workload_file import parse_workload


def workload(rate_rps: float, duration_s: float, slo_ttft_s: float, slo_itl_s: float) -> Workload:
    """``mixed``'s two classes next to ``shared-prefix`` sessions, open loop, Poisson."""
    return parse_workload(
        {
            "name": "mixed+shared-prefix",
            "api": "chat",
            "duration_s": duration_s,
            "rate_rps": rate_rps,
            "slo_ttft_s": slo_ttft_s,
            "slo_itl_s": slo_itl_s,
            "classes": [
                {
                    "name": "session",
                    "weight": 0.6,
                    "system_prompts": 16,
                    "system_prompt_tokens": {"uniform": [2000, 4000]},
                    "turns": {"uniform": [3, 6]},
                    "live_sessions": 32,
                    "prompt_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "min": 20, "max": 600}},
                    "output_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "min": 20, "max": 400}},
                },
                {"name": "short", "weight": 0.35, "prompt_tokens": 50, "output_tokens": 20},
                {"name": "long", "weight": 0.05, "prompt_tokens": 30000, "output_tokens": 2000},
            ],
        }
    )
