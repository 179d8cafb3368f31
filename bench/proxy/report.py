"""docs/proxy-report.md: what ``python -m bench proxy --report FILE`` measured, as markdown.

The report says what each figure is and how to read it; the design the figures check is in
docs/gateway.md ("Performance"). Its one-off section is carried over when it is written again
(``bench.harness.report``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.report import machine, run_date, table, write_report

CPU_TARGETS_MS = {"non-stream": 0.25, "stream paced 50 chunks / 5 ms": 2.5}
"""Gateway CPU per request the design allows on a 2-core machine, by scenario (docs/gateway.md)."""
ADDED_P50_TARGET_MS = 1.0

ABOUT_SCENARIOS = [
    "Zero-delay backends (raw asyncio + httptools, their own process), the gateway (`kvgate serve`'s "
    "stack in its own process: uvicorn, uvloop, httptools; its defaults, so the json access log is on "
    "and tracing off; CPU read with psutil) and the driver (aiohttp, a third process) share the "
    "machine. Each scenario runs direct to the backends and through the gateway in the same run; "
    '"added" is through the gateway minus direct. Every decision is on the path: tokenising, '
    "admission, routing, the ledger, health, usage, metrics and `/signals`.",
    "",
    "- `non-stream`, `stream 50 chunks` (written back-to-back), `stream paced 50 chunks / 5 ms` (one "
    "token per read, as from a replica): at the run's concurrency;",
    "- `non-stream 1000/s open loop`: one request every millisecond whatever the answers do, the "
    "latency added at a load the machine carries;",
    "- `non-stream serial (c=1)`: one request at a time, the gateway's own added latency with nothing "
    "queued.",
]
HOW_TO_READ = [
    "- **Added latency at full concurrency is the machine's, not the gateway's.** The driver, the "
    "backends and the gateway share the cores at saturation, so a proxied request waits for CPU "
    "behind the others: added p50 ≈ concurrency / rate through the gateway - concurrency / rate "
    "direct. The open-loop and serial rows show what the gateway itself adds.",
    "- **CPU per request falls with load**: busy event loops handle several sockets per wake-up.",
    "- **A paced stream's latency is its whole 250 ms**; what it gains through the gateway is the "
    "backend's 5 ms sleeps firing late on a busier machine, not the relay.",
]


@dataclass(frozen=True, slots=True)
class ScenarioFigures:
    label: str
    requests: int
    cpu_ms: float
    """The gateway's CPU (user + system) per request."""
    added_p50_ms: float
    added_p99_ms: float
    via_per_s: float
    direct_per_s: float


@dataclass(slots=True)
class ProxyFigures:
    """One ``--report`` run: each part is empty when it was not measured."""

    command: str
    concurrency: int
    scenarios: list[ScenarioFigures] = field(default_factory=list)
    profile: list[tuple[str, float]] = field(default_factory=list)
    """py-spy's top functions and their share of the gateway's samples (``--py-spy``)."""
    decision_us: dict[str, float] = field(default_factory=dict)
    client_us: dict[str, float] = field(default_factory=dict)
    access_log_us: dict[str, float] = field(default_factory=dict)
    tracing_us: dict[str, float] = field(default_factory=dict)


def write_proxy_report(path: Path, figures: ProxyFigures) -> None:
    write_report(path, render(figures))


def render(figures: ProxyFigures) -> list[str]:
    lines = [
        "# Proxy benchmark",
        "",
        "Written by `python -m bench proxy --report FILE`. The design these figures check: "
        "[gateway.md](gateway.md#performance).",
        "",
        f"{run_date()} · {machine()} · `{figures.command}`",
    ]
    if figures.scenarios:
        lines += ["", "## End to end: the gateway's CPU and the latency it adds", "", *ABOUT_SCENARIOS, ""]
        lines += table(
            ("scenario", "requests", "gateway CPU per request", "target", "added p50", "added p99",
             "per s through the gateway", "per s direct"),
            [(s.label, s.requests, f"{s.cpu_ms:.3f} ms", _target(s.label), f"{s.added_p50_ms:.2f} ms",
              f"{s.added_p99_ms:.2f} ms", f"{s.via_per_s:.0f}", f"{s.direct_per_s:.0f}")
             for s in figures.scenarios],
        )  # fmt: skip
        lines += [
            "",
            f"Concurrency {figures.concurrency}; target added p50 ≤ {ADDED_P50_TARGET_MS:g} ms.",
            "",
        ]
        lines += HOW_TO_READ
    if figures.profile:
        lines += ["", "## Where the gateway's samples go (py-spy)", ""]
        lines += [
            "Inclusive shares of the samples taken while uvicorn serves. py-spy samples a running "
            "thread's wall time, so a process descheduled inside a socket write charges that write "
            "more than its CPU.",
            "",
        ]
        lines += table(("share", "function"), [(f"{share:.1%}", f"`{fn}`") for fn, share in figures.profile])
    lines += _micro_section(
        "The decision path alone",
        "`--decisions N`: price, admit, first token, `finished` and `release` for N requests against four "
        "healthy replicas, in process, no sockets.",
        ("requests", "CPU per request"),
        figures.decision_us,
    )
    lines += _micro_section(
        "The upstream client alone",
        "`--client N`: N non-stream requests to the zero-delay backends, in process on uvloop, through "
        "an aiohttp session set up as the gateway's other upstream calls are, then through the "
        "completion routes' `ReplicaClient`.",
        ("client", "CPU per request"),
        figures.client_us,
    )
    lines += _micro_section(
        "An access-log line",
        "`--access-log N`: one answered request's line written N times to `/dev/null`, in process; the "
        "best of five rounds.",
        ("how", "CPU per line"),
        figures.access_log_us,
    )
    lines += _micro_section(
        "A request's spans",
        "`--tracing N`: one answered request's spans built and ended N times, in process, exporting "
        "nothing; the best of three rounds. At R requests per second and a `sample_ratio` of S, tracing "
        "costs R x (S x sampled + (1 - S) x sampled out) of CPU per second.",
        ("request", "CPU per request"),
        figures.tracing_us,
    )
    return lines


def _target(label: str) -> str:
    target_ms = CPU_TARGETS_MS.get(label)
    return "" if target_ms is None else f"≤ {target_ms:g} ms"


def _micro_section(title: str, about: str, header: tuple[str, str], figures: dict[str, float]) -> list[str]:
    if not figures:
        return []
    return [
        "",
        f"## {title}",
        "",
        about,
        "",
        *table(header, [(k, f"{v:.1f} µs") for k, v in figures.items()]),
    ]
