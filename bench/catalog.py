"""Every benchmark and lab, one line each: its name on the command line, its module, what it measures.

``python -m bench`` prints this list; ``python -m bench NAME ARGS`` imports the module and runs its
``main(ARGS)``. Modules are imported only when run: a listing costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    module: str
    """Where ``main(argv: list[str] | None) -> int`` is."""
    measures: str

    def main(self) -> Callable[[list[str] | None], int]:
        return cast(Callable[[list[str] | None], int], importlib.import_module(self.module).main)


CATALOG: tuple[Benchmark, ...] = (
    Benchmark(
        "admission",
        "bench.admission",
        "2x overload through kvgate, admission on against off: TTFT, preemptions, 429s, Retry-After error",
    ),
    Benchmark(
        "autoscale",
        "bench.autoscale.__main__",
        "a burst against kvgate's scaling policy and a request-rate scaler: real processes, or a fluid model",
    ),
    Benchmark(
        "autoscale_lab",
        "bench.autoscale_lab.__main__",
        "scaling policies, KEDA/HPA-style baselines and an oracle in closed loop, in virtual time",
    ),
    Benchmark(
        "chaos",
        "bench.chaos.__main__",
        "disconnect storms, slow clients, a replica killed, Redis restarted: the invariants after each",
    ),
    Benchmark(
        "coordination",
        "bench.coordination.__main__",
        "1, 2 and 4 gateways sharing Redis claims, and uncoordinated ones, at 2x overload",
    ),
    Benchmark(
        "decision_cost",
        "bench.decision_cost",
        "the admission decision alone, as one of 2 and 4 coordinated gateways, with ITL limits (in process)",
    ),
    Benchmark(
        "goodput",
        "bench.goodput.__main__",
        "goodput by routing policy on one trace: kvgate, round-robin, least-request, the Rust routers",
    ),
    Benchmark(
        "neighbours",
        "bench.neighbours.__main__",
        "what one huge prompt being counted adds to the latency of small requests beside it",
    ),
    Benchmark(
        "pd",
        "bench.pd.__main__",
        "mixed against prefill/decode disaggregated, at the same number of simulated GPUs",
    ),
    Benchmark(
        "proxy",
        "bench.proxy.__main__",
        "the gateway's CPU per request and the latency it adds against direct calls; or against routers",
    ),
    Benchmark("routing", "bench.routing", "routing decision time against fleet size; prefix-index memory"),
    Benchmark(
        "routing_lab",
        "bench.routing_lab.__main__",
        "routing policies on the simulator's engines in simulated time: deterministic, seconds",
    ),
    Benchmark("sim", "bench.sim", "the simulator's fidelity to its profile, and its own CPU per token"),
    Benchmark(
        "streams",
        "bench.streams.__main__",
        "what each open token stream costs one gateway process: memory, CPU per token, loop lag",
    ),
    Benchmark(
        "traces",
        "bench.traces.__main__",
        "writes a production-shaped trace (Mooncake JSONL) for kvgate loadtest --trace and the replays",
    ),
    Benchmark(
        "tokenize",
        "bench.tokenize",
        "the event-loop stall of counting a 1 MB prompt; the CPU abusive prompts burn",
    ),
)


def find(name: str) -> Benchmark | None:
    return next((benchmark for benchmark in CATALOG if benchmark.name == name), None)
