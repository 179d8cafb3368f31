"""``--mode real``: the figures of a run (when it scaled, how TTFT fared, what went wrong), printed."""

from __future__ import annotations

import collections
import itertools
from typing import Any

from bench.autoscale.real_loop import RealRun
from bench.autoscale.real_plan import SCALE_RATIO
from bench.autoscale.scenario import MIN_REPLICAS, pct


def real_figures(run: RealRun) -> dict[str, Any]:
    start, end = run.plan.burst
    desired = run.desired
    out_at = next((t for t, n, _ in desired if t >= start and n > MIN_REPLICAS), None)
    peak = max((n for _, n, _ in desired), default=MIN_REPLICAS)
    changes = [(t, b - a) for (_, a, _), (t, b, _) in itertools.pairwise(desired) if b != a]
    reversals = sum(1 for (_, d0), (_, d1) in itertools.pairwise(changes) if (d0 > 0) != (d1 > 0))
    ttft = [(t, p.get("ttft_p95_s")) for t, p in run.samples]
    slow_at = next((t for t, v in ttft if t >= start and v is not None and v > 1.5), None)
    recovered_at = None
    if slow_at is not None:
        recovered_at = next((t for t, v in ttft if t > slow_at and (v is None or v < 1.5)), None)
    ready_peak = max((int(p.get("replicas_ready", 0)) for _, p in run.samples), default=0)
    burst_ttfts = sorted(r.ttft_s for t, r in run.records if start <= t < end and r.ttft_s is not None)
    errors = collections.Counter(
        f"{r.status} {r.error or ''}"[:120] for _, r in run.records if not r.ok and not r.rejected
    )
    rejected = sum(1 for _, r in run.records if r.rejected)
    scale_ins = [t for t, d in changes if d < 0]
    return {
        "first_scale_out_s": None if out_at is None else out_at - start,
        "ttft_over_1_5_s_at_s": None if slow_at is None else slow_at - start,
        "ttft_back_under_1_5_s_at_s": None if recovered_at is None else recovered_at - start,
        "peak_desired": peak,
        "peak_ready": ready_peak,
        "reversals": reversals,
        "scale_ins_after_burst_s": [round(t - end, 1) for t in scale_ins],
        "burst_ttft_p50_s": pct(burst_ttfts, 0.5),
        "burst_ttft_p95_s": pct(burst_ttfts, 0.95),
        "requests": len(run.records),
        "rejected_429": rejected,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(5)),
        "sim_lag_ratio": run.sim_lag_ratio,
        "reasons": dict(sorted(collections.Counter(reason for _, _, reason in desired).items())),
    }


def print_real(run: RealRun, figures: dict[str, Any]) -> None:
    def secs(value: float | None) -> str:
        return "never" if value is None else f"{value:+.0f} s"

    print(f"== {run.name} (times from burst start, wall seconds; x{SCALE_RATIO:g} = policy seconds)")
    print(f"  first scale-out asked              {secs(figures['first_scale_out_s'])}")
    print(f"  TTFT p95 (gateway) over 1.5 s      {secs(figures['ttft_over_1_5_s_at_s'])}")
    print(f"  TTFT p95 back under 1.5 s          {secs(figures['ttft_back_under_1_5_s_at_s'])}")
    print(f"  peak replicas asked / ready        {figures['peak_desired']} / {figures['peak_ready']}")
    print(f"  reversals of direction             {figures['reversals']}")
    print(f"  scale-ins, s after the burst       {figures['scale_ins_after_burst_s']}")
    print(
        f"  burst requests TTFT p50 / p95      {figures['burst_ttft_p50_s']:.2f} s / "
        f"{figures['burst_ttft_p95_s']:.2f} s"
    )
    print(
        f"  requests / 429 / other errors      {figures['requests']} / {figures['rejected_429']} / "
        f"{figures['errors']} {figures['error_kinds'] or ''}"
    )
    print(f"  simulator lag ratio (worst)        {figures['sim_lag_ratio']}")
    print(f"  answers by reason                  {figures['reasons']}")
