"""The figures beside a load-test report: latency CDFs, rates over time, and kvgate's own signals.

Kept apart from the numbers (``report``) because they are a different job with a heavy dependency:
matplotlib (Agg backend, modest DPI) is imported only when a figure is drawn, so summarising a run
or comparing two never loads it. The series the figures plot (``timeline``, ``signal_series``) are
plain functions of the records, tested without drawing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgate.loadtest.client import RequestRecord
from kvgate.loadtest.runner import RunResult, SignalSample

if TYPE_CHECKING:
    from kvgate.loadtest.report import Slo

PLOT_DPI = 80


def timeline(records: Sequence[RequestRecord], slo: Slo, bucket_s: float = 1.0) -> dict[str, list[float]]:
    """Per-bucket rates by completion time: sent, goodput and rejects (requests/s)."""
    if not records:
        return {"t_s": [], "sent": [], "goodput": [], "rejects": []}
    end_s = max(r.sent_at_s + r.e2e_s for r in records)
    buckets = int(end_s // bucket_s) + 1
    sent = [0.0] * buckets
    good = [0.0] * buckets
    rejects = [0.0] * buckets
    for r in records:
        sent[int(r.sent_at_s // bucket_s)] += 1 / bucket_s
        done = int((r.sent_at_s + r.e2e_s) // bucket_s)
        if slo.met_by(r):
            good[done] += 1 / bucket_s
        if r.rejected:
            rejects[done] += 1 / bucket_s
    return {"t_s": [i * bucket_s for i in range(buckets)], "sent": sent, "goodput": good, "rejects": rejects}


SIGNAL_FIELDS = (
    "queued_requests",
    "queued_prompt_tokens",
    "pending_prompt_tokens",
    "kv_occupancy_estimate_ratio",
    "kv_occupancy_scraped_ratio",
)


def signal_series(samples: Sequence[SignalSample]) -> dict[str, dict[str, list[float]]]:
    """Per pool, from kvgate's ``/signals``: time, requests and prompt tokens in kvgate's queue,
    prompt tokens admitted but awaiting their first token, and KV occupancy as kvgate reserved it
    and as the replicas reported it (NaN when not scraped). Missing counts read as 0."""
    series: dict[str, dict[str, list[float]]] = {}
    for sample in samples:
        pools = sample.payload.get("pools")
        if not isinstance(pools, Mapping):
            continue
        for pool, doc in pools.items():
            if not isinstance(doc, Mapping):
                continue
            row = series.setdefault(str(pool), {"t_s": [], **{name: [] for name in SIGNAL_FIELDS}})
            row["t_s"].append(sample.at_s)
            for name in SIGNAL_FIELDS:
                value = doc.get(name)
                if value is None:
                    value = math.nan if name == "kv_occupancy_scraped_ratio" else 0.0
                row[name].append(float(value))
    return series


def write_plots(out_dir: Path, results: Sequence[RunResult], slo: Slo) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    for name, target_s in (("ttft_cdf", slo.ttft_s), ("itl_cdf", slo.itl_s)):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for result in results:
            ok = [x for x in result.records if x.ok]
            if name == "ttft_cdf":
                values = sorted(x.ttft_s for x in ok if x.ttft_s is not None)
            else:
                values = sorted(gap for x in ok for gap in x.itl_s)
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=result.target.name)
        ax.axvline(target_s, color="grey", linestyle="--", linewidth=1, label=f"SLO {target_s:g} s")
        ax.set_xlabel(name.split("_")[0].upper() + " (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        paths.append(_save(fig, out_dir / f"{name}.png", plt))
    fig, axes = plt.subplots(len(results), 1, figsize=(7, 2.6 * len(results)), squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        series = timeline(result.records, slo, bucket_s=max(1.0, round(result.wall_s / 40)))
        ax.plot(series["t_s"], series["sent"], label="sent/s")
        ax.plot(series["t_s"], series["goodput"], label="goodput/s")
        ax.plot(series["t_s"], series["rejects"], label="rejects/s")
        ax.set_title(result.target.name, fontsize="small")
        ax.set_ylabel("req/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper right")
    axes[-1, 0].set_xlabel("time since start (s)")
    paths.append(_save(fig, out_dir / "rates.png", plt))
    with_signals = [(result, signal_series(result.signals)) for result in results if result.signals]
    if with_signals:
        fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
        for result, pools in with_signals:
            for pool, row in pools.items():
                label = f"{result.target.name}/{pool}" if len(results) > 1 else pool
                line = axes[0].plot(
                    row["t_s"], row["queued_prompt_tokens"], label=f"{label}: in kvgate queue"
                )
                color = line[0].get_color()
                axes[0].plot(
                    row["t_s"], row["pending_prompt_tokens"], color=color, linestyle="--",
                    label=f"{label}: awaiting prefill",
                )  # fmt: skip
                axes[1].plot(
                    row["t_s"], row["kv_occupancy_scraped_ratio"], color=color, label=f"{label}: replicas"
                )
                axes[1].plot(
                    row["t_s"], row["kv_occupancy_estimate_ratio"], color=color, linestyle="--",
                    label=f"{label}: kvgate reserved",
                )  # fmt: skip
        axes[0].set_ylabel("prompt tokens")
        axes[1].set_ylabel("KV occupancy")
        axes[1].set_ylim(0, 1.05)
        axes[1].set_xlabel("time since start (s)")
        for ax in axes:
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small", loc="upper right")
        paths.append(_save(fig, out_dir / "kvgate_signals.png", plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path
