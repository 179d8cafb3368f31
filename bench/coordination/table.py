"""The coordination benchmark's figures per phase, as a markdown table with ratios to the one-gateway
phase, and as a PNG (goodput, peak over-commit, preemptions)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.coordination.phase import TENANTS, Outcome, Phase


@dataclass(frozen=True, slots=True)
class Row:
    phase: Phase
    goodput_per_s: float
    good_pct: dict[str, float]
    """Per tenant, the share of its requests that finished within the TTFT objective."""
    overcommit_ratio: float
    cpu_ms_per_request: float
    first_retry_ok_pct: float
    itl_p50_ms: float
    itl_p95_ms: float


def _good(outcome: Outcome, ttft_slo_s: float, itl_slo_s: float) -> bool:
    return (
        outcome.finished
        and outcome.ttft_s is not None
        and outcome.ttft_s <= ttft_slo_s
        and outcome.itl_s is not None
        and outcome.itl_s <= itl_slo_s
    )


def row(phase: Phase, ttft_slo_s: float, itl_slo_s: float, fits: int) -> Row:
    good = [o for o in phase.outcomes if _good(o, ttft_slo_s, itl_slo_s)]
    itls = sorted(o.itl_s for o in phase.outcomes if o.itl_s is not None)
    finished = [o for o in phase.outcomes if o.finished]
    good_ids = {id(o) for o in good}
    pct = {}
    for tenant in TENANTS:
        sent = [o for o in phase.outcomes if o.tenant == tenant]
        pct[tenant] = 100.0 * sum(1 for o in sent if id(o) in good_ids) / max(1, len(sent))
    retried = [o for o in phase.outcomes if o.first_retry_ok is not None]
    return Row(
        phase,
        len(good) / max(phase.window_s, 1e-9),
        pct,
        phase.peak_admitted / fits,
        1000.0 * phase.gateway_cpu_s / max(1, len(finished)),
        100.0 * sum(1 for o in retried if o.first_retry_ok) / len(retried) if retried else float("nan"),
        1000.0 * itls[len(itls) // 2] if itls else float("nan"),
        1000.0 * itls[int(0.95 * (len(itls) - 1))] if itls else float("nan"),
    )


def table(rows: list[Row]) -> str:
    base = rows[0]
    lines = [
        "| gateways | Redis claims | goodput /s | vs 1 | preemptions | ITL p50/p95 ms | a good % "
        "| b good % | peak over-commit | gateway CPU ms/req | Redis CPU s | syncs /s | 1st retry ok % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.phase
        lines.append(
            f"| {p.gateways} | {'on' if p.coordinated else 'off'} | {r.goodput_per_s:.2f} "
            f"| {r.goodput_per_s / base.goodput_per_s:.2f}x | {p.preemptions:.0f} "
            f"| {r.itl_p50_ms:.1f}/{r.itl_p95_ms:.1f} "
            f"| {r.good_pct['a']:.1f} | {r.good_pct['b']:.1f} | {r.overcommit_ratio:.2f}x "
            f"| {r.cpu_ms_per_request:.2f} | {p.redis_cpu_s:.2f} | {p.syncs:.1f} "
            f"| {r.first_retry_ok_pct:.1f} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.phase.gateways} gw\n{'claims' if r.phase.coordinated else 'uncoord.'}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    colors = ["tab:blue" if r.phase.coordinated or r.phase.gateways == 1 else "tab:red" for r in rows]
    axes[0].bar(labels, [r.goodput_per_s for r in rows], color=colors)
    axes[0].set_title("goodput (streams/s within TTFT and ITL objectives)")
    axes[1].bar(labels, [r.overcommit_ratio for r in rows], color=colors)
    axes[1].axhline(1.0, color="black", linestyle="--", linewidth=1)
    axes[1].set_title("peak admitted at once / what the fleet holds")
    axes[2].bar(labels, [r.phase.preemptions for r in rows], color=colors)
    axes[2].set_title("preemptions")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
