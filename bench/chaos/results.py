"""What a chaos run wrote: every figure as JSON, a table of checks and figures per scenario as
markdown, and the work gauges over each scenario as a PNG."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from bench.chaos.checks import Run, Scenario
from bench.chaos.gauges import KV_ESTIMATE
from bench.harness.report import machine, run_date, table, write_report


def write_results(run: Run, scenarios: list[Scenario], wall_s: float) -> None:
    """``results.json`` (every figure), ``results.md`` (a table per scenario) and the gauges' PNG."""
    failed = sum(not c.ok for s in scenarios for c in s.checks)
    total = sum(len(s.checks) for s in scenarios)
    header = {
        "date": run_date(),
        "mode": "quick" if run.args.quick else "full",
        "machine": machine(),
        "wall_s": round(wall_s, 1),
        "checks_failed": failed,
        "checks_total": total,
        "config_keys_unknown_today": run.unknown_keys,
    }
    doc = {**header, "scenarios": [asdict(s) for s in scenarios]}
    (run.out / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    lines = [
        "# Chaos benchmark results",
        "",
        f"{header['date']} · {header['mode']} run · {header['machine']} · {header['wall_s']} s · "
        f"**{total - failed}/{total} checks pass**",
        "",
        "Config keys unknown to this gateway (dropped; their checks fail): "
        + (", ".join(f"`{k}`" for k in run.unknown_keys) or "none"),
        "",
    ]
    for s in scenarios:
        lines += [f"## {s.name}: {s.title}", ""]
        lines += table(
            ("check", "result", "detail"),
            [(c.name, "PASS" if c.ok else "**FAIL**", c.detail) for c in s.checks],
        )
        lines.append("")
        lines += table(("figure", "value"), [(k, json.dumps(v, default=str)) for k, v in s.figures.items()])
        if s.events:
            lines += ["", "Events: " + "; ".join(f"+{t:g} s {what}" for t, what in s.events)]
        lines.append("")
    if any(s.timeline for s in scenarios):
        plot(run.out / "chaos_gauges.png", scenarios)
        lines += ["![work gauges over time](chaos_gauges.png)", ""]
    write_report(run.out / "results.md", lines)


def plot(path: Path, scenarios: list[Scenario]) -> None:
    """Resident sequences, queued requests and KV estimate (%) over each scenario, events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in scenarios if s.timeline]
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.6 * len(shown)), squeeze=False)
    for ax, s in zip(axes[:, 0], shown, strict=True):
        times = [t for t, _ in s.timeline]
        ax.plot(times, [w["kvgate_resident_sequences"] for _, w in s.timeline], label="resident sequences")
        ax.plot(times, [w["kvgate_queued_requests"] for _, w in s.timeline], label="queued requests")
        ax.plot(times, [100 * w[KV_ESTIMATE] for _, w in s.timeline], label="KV estimate %", linestyle=":")
        for at_s, what in s.events:
            ax.axvline(at_s, color="grey", linewidth=0.8)
            ax.annotate(what[:28], (at_s, ax.get_ylim()[1] * 0.9), fontsize=6, rotation=90, va="top")
        ax.set_title(s.name, fontsize=9)
        ax.set_xlabel("s")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
