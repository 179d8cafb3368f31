"""The goodput benchmark's table (per target, against round-robin, retries, whether the simulator
and the generator kept up) and its plot (goodput, prefix-cache hit rate, TTFT CDFs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.goodput.figures import PolicyRun, RetryOutcomes, fmt
from kvgate.loadtest.compare import ratios
from kvgate.loadtest.report import Slo

BASELINE = "round_robin"
SIM_LAG_LIMIT_RATIO = 0.05


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base == 0:
        return "-"
    return f"{value / base:.2f}x"


def print_table(runs: Sequence[PolicyRun], slo: Slo) -> None:
    print(
        f"\nSLO: TTFT <= {slo.ttft_s:g} s"
        + (
            f" + prompt / {1 / slo.ttft_per_prompt_token_s:,.0f} tokens/s"
            if slo.ttft_per_prompt_token_s
            else ""
        )
        + f" and mean inter-token gap <= {slo.itl_s * 1000:g} ms\n"
        f"{'target':<18} {'requests':>8} {'ok':>5} {'429':>5} {'goodput':>8} {'good %':>7} {'good/s':>7} "
        f"{'ttft p50':>9} {'ttft p95':>9} {'itl p95 ms':>10} {'prefix hit':>10} {'+host':>6} {'hit 1st':>7} "
        f"{'saved M':>7} {'prefill M':>9} {'preempt':>7} {'sim lag':>8}"
    )
    for run in runs:
        s = run.summary
        print(
            f"{run.policy:<18} {s.requests:>8} {s.ok:>5} {s.rejects:>5} {s.goodput_requests:>8} "
            f"{100 * s.goodput_ratio:>6.1f}% {s.goodput_rps:>7.2f} {fmt(s.ttft_p50_s):>9} "
            f"{fmt(s.ttft_p95_s):>9} {fmt(s.itl_p95_s, 1000, 1):>10} {run.hit_ratio:>10.3f} "
            f"{run.host_hit_ratio:>6.3f} "
            f"{run.first_schedule_hit_ratio:>7.3f} {run.hit_tokens / 1e6:>7.3f} "
            f"{run.prefilled_tokens / 1e6:>9.3f} "
            f"{run.preemptions:>7} {run.lag_ratio:>8.3f}"
        )
    base = next((run for run in runs if run.policy == BASELINE), runs[0])
    table = ratios([run.summary for run in runs], base.policy)
    print(f"\nagainst {base.policy} (goodput and hit rate above 1, TTFT and ITL below 1 are better):")
    for run in runs:
        if run is base:
            continue
        s, b = run.summary, base.summary
        print(
            f"  {run.policy:<18} goodput {_ratio(table[run.policy]['goodput'], 1.0)} per second of its "
            f"own run, {_ratio(s.goodput_requests, b.goodput_requests)} of the trace's requests, "
            f"ttft p95 {_ratio(s.ttft_p95_s, b.ttft_p95_s)}, itl p95 {_ratio(s.itl_p95_s, b.itl_p95_s)}, "
            f"prefix hit rate {_ratio(run.hit_ratio, base.hit_ratio)} "
            f"(first schedules {_ratio(run.first_schedule_hit_ratio, base.first_schedule_hit_ratio)})"
        )
    print()
    for run in runs:
        print(f"  {run.policy:<18} {RetryOutcomes.of(run.result.records).line()}")
        if run.trust is not None:
            print(f"  {'':<18} {run.trust.line()}")
    print()
    for run in runs:
        s = run.summary
        lag = "LAGGED: results invalid" if run.lag_ratio > SIM_LAG_LIMIT_RATIO else "kept up"
        schedule = "kept its schedule" if s.schedule_kept else "fell behind its schedule"
        bound = "CPU-bound" if s.cpu_bound else "not CPU-bound"
        print(
            f"  {run.policy:<18} simulator {lag} (lag ratio {run.lag_ratio:.3f}, limit "
            f"{SIM_LAG_LIMIT_RATIO}); generator {schedule} (send lag p99 {fmt(s.lag_p99_s, 1000, 1)} ms), "
            f"{bound} ({s.cpu_ratio:.0%} of one core, {s.cpu_per_request_ms:.1f} ms/request)"
        )


def plot(runs: Sequence[PolicyRun], slo: Slo, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [run.policy for run in runs]
    fig, (goodput_ax, hit_ax, ttft_ax) = plt.subplots(1, 3, figsize=(13, 4))
    goodput_ax.bar(names, [100 * run.summary.goodput_ratio for run in runs], color="tab:green")
    goodput_ax.set_ylabel("requests meeting both SLOs (%)")
    goodput_ax.set_title("goodput")
    hit_ax.bar(names, [100 * run.hit_ratio for run in runs], color="tab:blue")
    hit_ax.set_ylabel("prefix-cache hits / queries (tokens, %)")
    hit_ax.set_title("fleet prefix-cache hit rate")
    for ax in (goodput_ax, hit_ax):
        ax.tick_params(axis="x", labelrotation=30)
    for run in runs:
        ttft = sorted(r.ttft_s for r in run.result.records if r.ok and r.ttft_s is not None)
        if ttft:
            ttft_ax.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label=run.policy)
    ttft_ax.axvline(slo.ttft_s, color="grey", linestyle="--", label="TTFT SLO")
    ttft_ax.set_xscale("log")
    ttft_ax.set_xlabel("time to first token (s)")
    ttft_ax.set_ylabel("share of successful requests")
    ttft_ax.set_title("TTFT CDF")
    ttft_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
