"""The P/D benchmark's rows: per trace and target, goodput, TTFT, the inter-token gaps and how badly
decodes stall, with ratios against the trace's mixed row; as a markdown table and as a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.loadtest.report import Slo, Summary
from kvgate.loadtest.runner import RunResult

MIXED = "kvgate mixed"
SIM_LAG_LIMIT_RATIO = 0.05


@dataclass(frozen=True, slots=True)
class Row:
    trace: str
    target: str
    summary: Summary
    result: RunResult
    lag_ratio: float
    """The worst replica's ``kvgate_sim_lag_ratio``: above ``SIM_LAG_LIMIT_RATIO`` the simulator
    ran slower than its schedule and the row's latencies are not the model's."""

    def gaps_s(self) -> list[float]:
        return sorted(gap for r in self.result.records if r.ok for gap in r.itl_s)

    def worst_gap_p95_s(self) -> float | None:
        """The p95 over streams of each stream's longest inter-token gap: how badly decodes stall."""
        return _quantile(sorted(max(r.itl_s) for r in self.result.records if r.ok and r.itl_s), 0.95)


def _quantile(values: Sequence[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def table(rows: Sequence[Row], slo: Slo) -> str:
    """One markdown table for every trace, with each row's ratios against its trace's mixed row."""
    lines = [
        f"SLO: TTFT <= {slo.ttft_s:g} s and mean inter-token gap <= {slo.itl_s * 1000:g} ms",
        "",
        "| trace | target | requests | ok | goodput % | TTFT p50 s | TTFT p95 s | ITL p50 ms | ITL p95 ms "
        "| ITL p99 ms | worst gap p95 ms | goodput vs mixed | TTFT p95 vs mixed | ITL p99 vs mixed "
        "| worst gap vs mixed | sim lag |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row.summary
        base = next(r for r in rows if r.trace == row.trace and r.target == MIXED)
        b = base.summary
        worst, base_worst = row.worst_gap_p95_s(), base.worst_gap_p95_s()
        lines.append(
            f"| {row.trace} | {row.target} | {s.requests} | {s.ok} | {100 * s.goodput_ratio:.1f} "
            f"| {_fmt(s.ttft_p50_s)} | {_fmt(s.ttft_p95_s)} | {_fmt(s.itl_p50_s, 1000, 1)} "
            f"| {_fmt(s.itl_p95_s, 1000, 1)} | {_fmt(s.itl_p99_s, 1000, 1)} | {_fmt(worst, 1000, 1)} "
            f"| {_ratio(s.goodput_ratio, b.goodput_ratio)} | {_ratio(s.ttft_p95_s, b.ttft_p95_s)} "
            f"| {_ratio(s.itl_p99_s, b.itl_p99_s)} | {_ratio(worst, base_worst)} "
            f"| {row.lag_ratio:.3f}{' LAGGED' if row.lag_ratio > SIM_LAG_LIMIT_RATIO else ''} |"
        )
    lines.append(
        f"\nsim lag: the worst simulated replica's lag over its busy time; above {SIM_LAG_LIMIT_RATIO} "
        "(LAGGED) the simulator could not keep its schedule and that row's latencies are not the model's."
    )
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(row.trace for row in rows))
    fig, axes = plt.subplots(len(traces), 3, figsize=(14, 4 * len(traces)), squeeze=False)
    for (goodput_ax, stall_ax, cdf_ax), trace in zip(axes, traces, strict=True):
        mine = [row for row in rows if row.trace == trace]
        names = [row.target for row in mine]
        goodput_ax.bar(names, [100 * row.summary.goodput_ratio for row in mine], color="tab:green")
        goodput_ax.set_ylabel("requests meeting both SLOs (%)")
        goodput_ax.set_title(f"{trace}: goodput")
        worst = [1000 * (row.worst_gap_p95_s() or 0.0) for row in mine]
        p99 = [1000 * (row.summary.itl_p99_s or 0.0) for row in mine]
        x = range(len(mine))
        stall_ax.bar([i - 0.2 for i in x], p99, width=0.4, label="ITL p99")
        stall_ax.bar([i + 0.2 for i in x], worst, width=0.4, label="longest gap per stream, p95")
        stall_ax.set_xticks(list(x), names)
        stall_ax.set_ylabel("ms")
        stall_ax.set_title(f"{trace}: ITL stability")
        stall_ax.legend()
        for row in mine:
            gaps = row.gaps_s()
            if gaps:
                cdf_ax.plot(
                    [1000 * g for g in gaps],
                    [(i + 1) / len(gaps) for i in range(len(gaps))],
                    label=row.target,
                )
        cdf_ax.set_xscale("log")
        cdf_ax.set_xlabel("inter-token gap (ms)")
        cdf_ax.set_ylabel("share of gaps")
        cdf_ax.set_title(f"{trace}: inter-token gap CDF")
        cdf_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
