"""The PNGs: the model's three scalers on one figure, the real runs on another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.autoscale.fluid_fleet import BURST
from bench.autoscale.model_mode import Timeline
from bench.autoscale.real_loop import RealRun
from bench.autoscale.real_plan import REAL_PROFILE, SCALE_RATIO
from bench.autoscale.scenario import p95


def plot(runs: dict[str, Timeline], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    colors = {"work": "tab:blue", "conjunction": "tab:green", "requests": "tab:red"}
    labels = {
        "work": "kvgate policy",
        "conjunction": "kvgate policy, no capacity figures",
        "requests": "request-rate scaler",
    }
    for name, tl in runs.items():
        minutes = [t / 60 for t in tl.time_s]
        axes[0].plot(minutes, tl.prompt_tokens_per_s, color=colors[name], label=labels[name])
        axes[1].step(minutes, tl.replicas, where="post", color=colors[name], label=f"{labels[name]}: asked")
        axes[1].step(
            minutes, tl.ready, where="post", color=colors[name], linestyle=":", label=f"{labels[name]}: ready"
        )
        axes[2].plot(minutes, tl.ttft_p95_s, color=colors[name], label=labels[name])
        axes[3].plot(minutes, tl.occupancy_ratio, color=colors[name], label=labels[name])
    _policy_lines(ttft_axis=axes[2], occupancy_axis=axes[3])
    titles = (
        "prompt tokens/s served (60 s)",
        "replicas",
        "TTFT p95 (s, 60 s window)",
        "KV occupancy (reserved)",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_ylabel(title)
        ax.axvspan(BURST[0] / 60, BURST[1] / 60, color="orange", alpha=0.12)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("minutes (shaded: burst, 2x requests/s and 8x prompt length)")
    fig.suptitle("Same burst, two scaling signals: work (KV occupancy + TTFT + tokens) vs request rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _policy_lines(ttft_axis: Any, occupancy_axis: Any) -> None:
    """The policy's thresholds: TTFT p95 1.5 s (on a log scale), KV occupancy 0.8 and 0.35."""
    ttft_axis.axhline(1.5, color="grey", linestyle="--", linewidth=0.8)
    ttft_axis.set_yscale("log")
    for ratio in (0.8, 0.35):
        occupancy_axis.axhline(ratio, color="grey", linestyle="--", linewidth=0.8)


def _series(run: RealRun, key: str) -> list[float]:
    return [float(p.get(key) or 0.0) for _, p in run.samples]


def client_ttft_p95(run: RealRun, bin_s: float = 5.0) -> tuple[list[float], list[float]]:
    """TTFT p95 of the requests sent in each ``bin_s`` (centre of the bin, seconds)."""
    bins: dict[int, list[float]] = {}
    for sent_s, record in run.records:
        if record.ttft_s is not None:
            bins.setdefault(int(sent_s // bin_s), []).append(record.ttft_s)
    keys = sorted(bins)
    return [(k + 0.5) * bin_s for k in keys], [p95(bins[k]) or 0.0 for k in keys]


def plot_real(runs: list[RealRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    colors = {"kvgate": "tab:blue", "requests": "tab:red"}
    labels = {"kvgate": "kvgate policy (KV, TTFT, tokens)", "requests": "requests/s scaler"}
    first = runs[0]
    bin_s = 5.0
    bins = [k * bin_s for k in range(int(first.plan.duration_s // bin_s) + 1)]
    counts = [0.0] * len(bins)
    tokens = [0.0] * len(bins)
    for at_s, prompt_tokens in first.offered:
        k = min(int(at_s // bin_s), len(bins) - 1)
        counts[k] += 1 / bin_s
        tokens[k] += prompt_tokens / bin_s
    axes[0].step(bins, counts, where="post", color="black", label="requests/s offered")
    tokens_axis = axes[0].twinx()
    tokens_axis.step(bins, tokens, where="post", color="tab:purple", label="prompt tokens/s offered")
    tokens_axis.set_ylabel("prompt tokens/s", color="tab:purple", fontsize=8)
    tokens_axis.legend(loc="upper right", fontsize=7)
    for run in runs:
        color = colors[run.name]
        ts = [t for t, _ in run.samples]
        axes[1].step(
            [t for t, _, _ in run.desired],
            [n for _, n, _ in run.desired],
            where="post",
            color=color,
            label=f"{labels[run.name]}: asked",
        )
        axes[1].step(
            ts, _series(run, "replicas_ready"), where="post", color=color, linestyle=":", label="ready"
        )
        axes[2].plot(ts, _series(run, "kv_occupancy_scraped_ratio"), color=color, label=f"{labels[run.name]}")
        axes[2].plot(ts, _series(run, "kv_occupancy_estimate_ratio"), color=color, linestyle=":", alpha=0.6)
        ttft_bins, p95s = client_ttft_p95(run)
        axes[3].plot(ttft_bins, p95s, color=color, label=labels[run.name])
    _policy_lines(ttft_axis=axes[3], occupancy_axis=axes[2])
    titles = (
        "offered load (requests/s)",
        "replicas (solid asked, dotted ready)",
        "KV occupancy (solid scraped, dotted reserved)",
        "client TTFT p95 (s, 5 s bins)",
    )
    start, end = first.plan.burst
    for ax, title in zip(axes, titles, strict=True):
        ax.set_ylabel(title, fontsize=8)
        ax.axvspan(start, end, color="orange", alpha=0.12)
        ax.grid(alpha=0.3)
        ax.legend(loc="center right", fontsize=7)
    axes[-1].set_xlabel(
        f"wall seconds (x{SCALE_RATIO:g} = policy seconds; shaded: burst, 2x requests/s with 16x prompts)"
    )
    fig.suptitle(
        f"Real closed loop: kvgate sim ({REAL_PROFILE}) + kvgate serve + load generator + sim actuator",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
