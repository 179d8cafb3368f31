"""The two traces the P/D benchmark plays: long prompts with short answers beside chat turns
(``prefill-heavy``), and short prompts with long answers beside a few long prompts (``decode-heavy``)."""

from __future__ import annotations

from kvgate.loadtest.report import Slo
from kvgate.loadtest.workload import Workload
from kvgate.loadtest.workload_file import parse_workload

TRACES = ("prefill-heavy", "decode-heavy")
CHAT = {"lognormal": {"median": 300, "sigma": 0.4, "min": 50, "max": 1000}}


def workload(name: str, rate_rps: float, duration_s: float, slo: Slo) -> Workload:
    """The two traces: the long prompts are what a mixed replica interleaves with its decodes."""
    if name == "prefill-heavy":
        classes = [
            {
                "name": "long-prompt",
                "weight": 0.7,
                "prompt_tokens": {"uniform": [3000, 8000]},
                "output_tokens": 64,
            },
            {"name": "chat", "weight": 0.3, "prompt_tokens": CHAT, "output_tokens": {"uniform": [150, 300]}},
        ]
    elif name == "decode-heavy":
        classes = [
            {
                "name": "long-answer",
                "weight": 0.9,
                "prompt_tokens": CHAT,
                "output_tokens": {"uniform": [400, 900]},
            },
            {
                "name": "long-prompt",
                "weight": 0.1,
                "prompt_tokens": {"uniform": [4000, 8000]},
                "output_tokens": 100,
            },
        ]
    else:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    return parse_workload(
        {
            "name": name,
            "api": "chat",
            "duration_s": duration_s,
            "rate_rps": rate_rps,
            "slo_ttft_s": slo.ttft_s,
            "slo_itl_s": slo.itl_s,
            "classes": classes,
        }
    )
