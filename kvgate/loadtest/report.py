"""Turns run results into numbers a reader can trust: summary, ``report.md``, ``results.json``, plots.

The summary is computed from the per-request records alone: latency percentiles over successful
requests, goodput as the requests that met both SLOs (TTFT, and mean inter-token gap) per second of
the run, rejects as final 429s, and tokens as the server reported them in ``usage``. It also judges
the generator itself: the lag between schedule and send (an open loop that could not keep its
schedule says so) and the process CPU per request (a generator using most of a core distorts what
it measures, and the report says that too). The figures beside the report are drawn by ``plots``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from kvgate.loadtest.client import RequestRecord
from kvgate.loadtest.plots import write_plots
from kvgate.loadtest.runner import RunResult
from kvgate.loadtest.workload import Trace

LAG_LIMIT_S = 0.05
CPU_BOUND_RATIO = 0.8


@dataclass(frozen=True, slots=True)
class Slo:
    """What a request must meet to count as goodput: time to first token and mean inter-token gap.

    ``ttft_per_prompt_token_s`` grows the TTFT objective with the prompt (1 s + prompt / 16k tok/s is
    ``Slo(1.0, 0.05, 1 / 16000)``): a 100k-token document cannot be read in the time a chat is."""

    ttft_s: float
    itl_s: float
    ttft_per_prompt_token_s: float = 0.0

    def ttft_budget_s(self, prompt_tokens: int) -> float:
        return self.ttft_s + self.ttft_per_prompt_token_s * prompt_tokens

    def met_by(self, record: RequestRecord) -> bool:
        return record.meets_slo(self.ttft_budget_s(record.prompt_tokens), self.itl_s)


@dataclass(frozen=True, slots=True)
class Summary:
    target: str
    model: str
    requests: int
    ok: int
    errors: int
    rejects: int
    goodput_requests: int
    goodput_ratio: float
    goodput_rps: float
    throughput_rps: float
    prompt_tokens: int
    completion_tokens: int
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    retries: int
    wait_honoured_s: float
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    schedule_kept: bool
    wall_s: float
    cpu_s: float
    cpu_per_request_ms: float
    cpu_per_output_token_us: float
    cpu_ratio: float
    cpu_bound: bool

    def warnings(self) -> list[str]:
        out = []
        if not self.schedule_kept:
            out.append(
                f"the generator could not keep the schedule: send lag p99 {_fmt_s(self.lag_p99_s)}, "
                f"max {_fmt_s(self.lag_max_s)} (limit {LAG_LIMIT_S * 1000:.0f} ms); rates below are lower "
                "than asked"
            )
        if self.cpu_bound:
            out.append(
                f"the generator used {self.cpu_ratio:.0%} of one core: it may have distorted this benchmark; "
                "run it on its own machine or lower the rate"
            )
        return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(result: RunResult, slo: Slo) -> Summary:
    records = result.records
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    e2e = [r.e2e_s for r in ok]
    lags = [lag for r in records if (lag := r.lag_s) is not None]
    good = sum(1 for r in records if slo.met_by(r))
    rejects = sum(1 for r in records if r.rejected)
    wall_s = max(result.wall_s, 1e-9)
    lag_p99_s = percentile(lags, 0.99)
    cpu_ratio = result.cpu_s / wall_s
    completion_tokens = sum(r.completion_tokens for r in records)
    return Summary(
        target=result.target.name,
        model=result.model,
        requests=len(records),
        ok=len(ok),
        errors=len(records) - len(ok) - rejects,
        rejects=rejects,
        goodput_requests=good,
        goodput_ratio=good / len(records) if records else 0.0,
        goodput_rps=good / wall_s,
        throughput_rps=len(ok) / wall_s,
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=completion_tokens,
        output_tokens_per_s=sum(r.completion_tokens for r in ok) / wall_s,
        ttft_p50_s=percentile(ttft, 0.5),
        ttft_p95_s=percentile(ttft, 0.95),
        ttft_p99_s=percentile(ttft, 0.99),
        itl_p50_s=percentile(itl, 0.5),
        itl_p95_s=percentile(itl, 0.95),
        itl_p99_s=percentile(itl, 0.99),
        e2e_p50_s=percentile(e2e, 0.5),
        e2e_p95_s=percentile(e2e, 0.95),
        retries=sum(r.retries for r in records),
        wait_honoured_s=sum(r.wait_honoured_s for r in records),
        lag_p50_s=percentile(lags, 0.5),
        lag_p99_s=lag_p99_s,
        lag_max_s=max(lags) if lags else None,
        schedule_kept=lag_p99_s is None or lag_p99_s <= LAG_LIMIT_S,
        wall_s=result.wall_s,
        cpu_s=result.cpu_s,
        cpu_per_request_ms=1000.0 * result.cpu_s / len(records) if records else 0.0,
        cpu_per_output_token_us=1e6 * result.cpu_s / completion_tokens if completion_tokens else 0.0,
        cpu_ratio=cpu_ratio,
        cpu_bound=cpu_ratio >= CPU_BOUND_RATIO,
    )


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _rows(s: Summary) -> list[tuple[str, str]]:
    def times(*values: float | None) -> str:
        return " / ".join(_fmt_s(v) for v in values)

    return [
        ("requests", f"{s.requests}"),
        ("ok / errors / rejects (429)", f"{s.ok} / {s.errors} / {s.rejects}"),
        (
            "goodput (met both SLOs)",
            f"{s.goodput_requests} ({s.goodput_ratio:.1%}), {s.goodput_rps:.2f} req/s",
        ),
        ("throughput", f"{s.throughput_rps:.2f} req/s, {s.output_tokens_per_s:.0f} output tok/s"),
        ("tokens in / out (server usage)", f"{s.prompt_tokens} / {s.completion_tokens}"),
        ("TTFT p50 / p95 / p99", times(s.ttft_p50_s, s.ttft_p95_s, s.ttft_p99_s)),
        ("ITL p50 / p95 / p99", times(s.itl_p50_s, s.itl_p95_s, s.itl_p99_s)),
        ("end-to-end p50 / p95", times(s.e2e_p50_s, s.e2e_p95_s)),
        ("retries, wait honoured", f"{s.retries}, {s.wait_honoured_s:.1f} s"),
        ("send lag p50 / p99 / max", times(s.lag_p50_s, s.lag_p99_s, s.lag_max_s)),
        (
            "generator CPU",
            f"{s.cpu_per_request_ms:.2f} ms/request ({s.cpu_per_output_token_us:.0f} µs/output token), "
            f"{s.cpu_ratio:.0%} of one core",
        ),
        ("wall time", f"{s.wall_s:.1f} s"),
    ]


def summary_table(summaries: Sequence[Summary]) -> str:
    header = "| | " + " | ".join(s.target for s in summaries) + " |"
    rule = "|---|" + "---|" * len(summaries)
    columns = [_rows(s) for s in summaries]
    lines = [header, rule]
    for i, (label, _) in enumerate(columns[0] if columns else []):
        lines.append(f"| {label} | " + " | ".join(column[i][1] for column in columns) + " |")
    return "\n".join(lines)


def write_report(
    out_dir: Path,
    trace: Trace,
    results: Sequence[RunResult],
    slo: Slo,
    *,
    ratios: Mapping[str, Mapping[str, float | None]] | None = None,
    baseline: str | None = None,
    notes: Sequence[str] = (),
) -> list[Path]:
    """Write ``report.md``, ``results.json`` and the plots; return the paths written. ``notes`` are
    lines for the header (a replay's reuse ceiling, say)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(result, slo) for result in results]
    plots = write_plots(out_dir, results, slo)
    workload = trace.workload
    lines = [
        f"# Load test: {workload.name}",
        "",
        workload.description,
        "",
        f"- targets: {', '.join(f'`{r.target.name}` {r.target.url} (model `{r.model}`)' for r in results)}",
        f"- trace: seed {trace.seed}, prompt salt {trace.salt}, {len(trace.requests)} requests, "
        f"{trace.prompt_tokens} prompt tokens, "
        + (
            f"closed loop at concurrency {workload.concurrency}"
            if workload.closed_loop
            else f"open loop ({workload.process}, CV {workload.cv:g}) at {workload.rate_rps:g} req/s"
        )
        + f" for {workload.duration_s:g} s",
        *(
            [f"- classes: {'; '.join(_describe_class(c) for c in workload.classes)}"]
            if workload.classes
            else []
        ),
        f"- SLOs: TTFT <= {_describe_ttft(slo)} and mean ITL <= {slo.itl_s:g} s",
        *(f"- {note}" for note in notes),
        "",
        "## Summary",
        "",
        summary_table(summaries),
        "",
    ]
    for summary in summaries:
        lines += [f"> **{summary.target}**: {warning}" for warning in summary.warnings()]
    for result in results:
        if result.trace_exhausted:
            lines.append(
                f"> **{result.target.name}**: the trace ran out before the duration; raise --requests"
            )
    if len({r.class_name for result in results for r in result.records}) > 1:
        lines += ["", "## By request class", "", class_table(results, slo), ""]
    if ratios:
        lines += ["", f"## Ratios against `{baseline}`", "", ratio_table(ratios), ""]
    lines += ["", "## Plots", ""]
    lines += [f"![{path.stem}]({path.name})" for path in plots]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n")
    results_path = out_dir / "results.json"
    results_path.write_bytes(
        orjson.dumps(
            {
                "workload": _workload_doc(trace),
                "slo": asdict(slo),
                "baseline": baseline,
                "ratios": ratios,
                "summaries": [asdict(s) for s in summaries],
                "runs": [_run_doc(result) for result in results],
            }
        )
    )
    return [report, results_path, *plots]


def _describe_class(klass: Any) -> str:
    text = (
        f"{klass.name} (weight {klass.weight:g}): prompt {klass.prompt_tokens.describe()}, "
        f"output {klass.output_tokens.describe()}"
    )
    if klass.system_prompts:
        text += f", {klass.system_prompts} system prompts of {klass.system_prompt_tokens.describe()}"
    if klass.turns.describe() != "1":
        text += f", {klass.turns.describe()} turns"
    return text


def _describe_ttft(slo: Slo) -> str:
    if not slo.ttft_per_prompt_token_s:
        return f"{slo.ttft_s:g} s"
    return f"{slo.ttft_s:g} s + prompt / {1 / slo.ttft_per_prompt_token_s:,.0f} tokens/s"


def class_table(results: Sequence[RunResult], slo: Slo) -> str:
    """Per target and request class: count, goodput share, TTFT p50/p95 and ITL p95."""
    lines = [
        "| target | class | requests | goodput | TTFT p50 / p95 | ITL p95 |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        names = sorted({r.class_name for r in result.records})
        for name in names:
            records = [r for r in result.records if r.class_name == name]
            ok = [r for r in records if r.ok]
            good = sum(1 for r in records if slo.met_by(r))
            ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
            itl = [gap for r in ok for gap in r.itl_s]
            lines.append(
                f"| {result.target.name} | {name} | {len(records)} | {good / len(records):.1%} | "
                f"{_fmt_s(percentile(ttft, 0.5))} / {_fmt_s(percentile(ttft, 0.95))} | "
                f"{_fmt_s(percentile(itl, 0.95))} |"
            )
    return "\n".join(lines)


def ratio_table(ratios: Mapping[str, Mapping[str, float | None]]) -> str:
    keys = ("goodput", "ttft_p95", "rejects")
    lines = ["| target | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in ratios.items():
        cells = ["-" if row.get(k) is None else f"{row[k]:.2f}x" for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _workload_doc(trace: Trace) -> dict[str, Any]:
    workload = trace.workload
    return {
        "name": workload.name,
        "seed": trace.seed,
        "salt": trace.salt,
        "requests": len(trace.requests),
        "prompt_tokens": trace.prompt_tokens,
        "duration_s": workload.duration_s,
        "rate_rps": None if workload.closed_loop else workload.rate_rps,
        "concurrency": workload.concurrency,
        "process": workload.process,
        "cv": workload.cv,
        "schedule": [[s.at_ratio, s.rate_x] for s in workload.schedule],
    }


def _run_doc(result: RunResult) -> dict[str, Any]:
    return {
        "target": result.target.name,
        "url": result.target.url,
        "model": result.model,
        "started_epoch_s": result.started_epoch_s,
        "wall_s": result.wall_s,
        "cpu_s": result.cpu_s,
        "records": [{**asdict(r), "itl_s": [round(gap, 6) for gap in r.itl_s]} for r in result.records],
        "signals": [{"at_s": s.at_s, **s.payload} for s in result.signals],
    }
