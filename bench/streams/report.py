"""docs/streams.md and its plot, from the open streams benchmark's points.

The table has one row per point; the plot shows, against the number of open streams, memory per
stream, CPU per token and the event loop's lag p99 (points at the long-lived pacing only, so the
lines say how each grows with N). Interpretation and comparisons across commits go under the
one-off heading, which a rewrite keeps (``bench.harness.report``).
"""

from __future__ import annotations

from pathlib import Path

from bench.harness.report import machine, run_date, table, write_report
from bench.streams.figures import PointResult
from bench.streams.gateway_child import LAG_PERIOD_S

KIB = 1024
MIB = 1024 * 1024


def write_streams_report(path: Path, results: list[PointResult], command: str, descriptors: int) -> None:
    plot = path.with_suffix(".png")
    write_plot(plot, results)
    write_report(path, render(results, command, descriptors, plot.name))


def render(results: list[PointResult], command: str, descriptors: int, plot_name: str) -> list[str]:
    rows = []
    for r in results:
        g, n = r.gateway, r.point.streams
        errors = r.via.errors + r.direct.errors
        work_after = sum(g.work_after.values())
        rows.append(
            (
                f"{n:,}",
                f"{r.point.itl_ms:g}",
                f"{r.via.window_tokens / r.via.window_s:,.0f}",
                f"{g.idle_rss_bytes / MIB:.0f} → {g.open_rss_bytes / MIB:.0f}",
                f"{g.per_stream_bytes(n) / KIB:.1f}",
                f"{r.retained_per_token_bytes:.0f}",
                f"{r.cpu_per_token_s * 1e6:.1f} ({r.net_cpu_per_token_s * 1e6:.1f})",
                f"{g.cpu_s / r.via.window_s:.2f}",
                f"{g.lag_s.p99 * 1000:.1f} ({g.lag_idle_s.p99 * 1000:.1f})",
                f"{g.opening_lag_max_s * 1000:.0f} / {g.full_collections}"
                f" / {g.full_collection_max_s * 1000:.0f}",
                f"{r.via.itl_s.p50 * 1000:.1f} / {r.via.itl_s.p99 * 1000:.1f}",
                f"{r.direct.itl_s.p50 * 1000:.1f} / {r.direct.itl_s.p99 * 1000:.1f}",
                f"{errors}",
                f"{work_after:g}",
            )
        )
    header = (
        "streams",
        "ITL ms",
        "tokens/s",
        "gateway RSS MiB idle → open",
        "KiB / stream",
        "RSS growth B / token",
        "CPU µs / token (net of idle)",
        "gateway cores",
        "loop lag p99 ms (idle)",
        "opening: lag max ms / full GCs / longest ms",
        "client ITL p50 / p99 ms via gateway",
        "direct",
        "errors",
        "work gauges after",
    )
    return [
        "# Open streams in one gateway process",
        "",
        f"Measured {run_date()} on {machine()}, file descriptors limited to {descriptors:,} a process.",
        "",
        f"    {command}",
        "",
        "One gateway process (uvicorn on uvloop with the gateway's edge protocol, as `kvgate serve` runs "
        "it; admission and routing on, four replicas, capacities set so every stream is admitted) holds "
        "N streams open at once. The replicas are `bench.streams.backend` (raw asyncio + httptools, "
        "one timer per token, ~200-byte vLLM-shaped chunks, usage chunk and `[DONE]` at the end); the "
        "clients are `bench.streams.driver` processes on raw sockets. Streams open at a fixed rate; "
        "once all are open and settled a steady window is measured. Each point runs straight to the "
        "replicas first (the `direct` column: what the drivers and replicas add on their own), then "
        "through a fresh gateway.",
        "",
        "- **KiB / stream**: gateway RSS at the window's end minus its RSS idle (after a few warm-up "
        "streams), over N. **RSS growth / token**: RSS growth over the window over the tokens relayed "
        "in it, what a stream keeps for every token it has carried.",
        "- **CPU / token**: gateway user + system CPU seconds over the window (`/proc` via psutil) over "
        "the tokens the clients received in it; in brackets less the gateway's idle CPU rate (health "
        "probes, scrapes) over as long.",
        f"- **Loop lag**: inside the gateway process a task sleeps {LAG_PERIOD_S * 1000:g} ms at a time "
        "and records how late it wakes (finer than the 0.1 s timer of "
        "`kvgate_event_loop_lag_seconds`); p99 over the window, "
        "in brackets idle before the streams. **Opening**: the largest lag while the streams were "
        "opening, and the full (generation 2) garbage collections from the first stream to the "
        "window's end with the longest.",
        "- **Client ITL**: gaps between token reads at the clients, over the window, against the "
        "replicas' pacing (ITL ms).",
        "- **Errors**: non-200, error events, connections ended before `[DONE]`; must be 0. **Work "
        "gauges after**: the sum of `kvgate_resident_sequences`, `kvgate_pending_prompt_tokens`, "
        "`kvgate_queued_requests`, `kvgate_queued_prompt_tokens` and `kvgate_remaining_decode_tokens` "
        "from `/metrics` a second after the last stream ended; must be 0.",
        "",
        *table(header, rows),
        "",
        f"![memory per stream, CPU per token and loop lag against open streams]({plot_name})",
    ]


def write_plot(path: Path, results: list[PointResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slowest_ms = max(r.point.itl_ms for r in results)
    held = sorted((r for r in results if r.point.itl_ms == slowest_ms), key=lambda r: r.point.streams)
    streams = [r.point.streams for r in held]
    panels: list[tuple[str, dict[str, list[float]]]] = [
        (
            "memory per open stream (KiB)",
            {"RSS over idle": [r.gateway.per_stream_bytes(r.point.streams) / KIB for r in held]},
        ),
        ("gateway CPU per token (µs)", {"user + system": [r.cpu_per_token_s * 1e6 for r in held]}),
        (
            "event loop (ms)",
            {
                "lag p99, steady window": [r.gateway.lag_s.p99 * 1000 for r in held],
                "longest full GC, opening to window end": [
                    r.gateway.full_collection_max_s * 1000 for r in held
                ],
            },
        ),
    ]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for axis, (title, series) in zip(axes, panels, strict=True):
        for label, values in series.items():
            axis.plot(streams, values, marker="o", label=label)
        axis.set_title(title)
        axis.set_xlabel(f"open streams (one token every {slowest_ms:g} ms each)")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        if len(series) > 1:
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
