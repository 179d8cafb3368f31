"""One trace against several targets in one run, interleaved, with ratios against a baseline.

Running target A for ten minutes and then target B lets any drift (a warming cache, a noisy
neighbour, a slow disk) land on one side only. Here the trace is cut into time slices and every
slice is played against every target before the next slice starts, the order rotating from slice
to slice (AB, BA, AB, ...), so both see the same requests under the same conditions. Records are
shifted back onto the trace's own timeline so each target's plots read as one continuous run.
Ratios are target over baseline: goodput above 1 and TTFT p95 or rejects below 1 mean better.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kvgate.loadtest.client import RequestRecord
from kvgate.loadtest.report import Slo, Summary, summarize
from kvgate.loadtest.runner import (
    RunOptions,
    RunResult,
    SignalSample,
    Target,
    discover_model,
    new_session,
    run_with_session,
)
from kvgate.loadtest.workload import Trace, build_trace


def slices(trace: Trace, count: int) -> list[tuple[float, Trace]]:
    """The trace cut into ``count`` consecutive parts, each with its start offset and shifted to 0.

    Open loop cuts by time (equal windows of the duration); closed loop cuts by request index and
    gives each part an equal share of the duration."""
    count = max(1, count)
    width_s = trace.duration_s / count
    parts: list[tuple[float, Trace]] = []
    requests = trace.requests
    for i in range(count):
        start_s = i * width_s
        if trace.workload.closed_loop:
            chunk = requests[i * len(requests) // count : (i + 1) * len(requests) // count]
            shifted = chunk
        else:
            end_s = trace.duration_s if i + 1 == count else start_s + width_s
            chunk = tuple(r for r in requests if start_s <= (r.at_s or 0.0) < end_s)
            shifted = tuple(replace(r, at_s=(r.at_s or 0.0) - start_s) for r in chunk)
        parts.append((start_s, replace(trace, requests=shifted, duration_s=width_s)))
    return parts


def order(targets: Sequence[Target], slice_index: int) -> list[Target]:
    """Rotate the targets by one per slice: AB, BA, AB, ... (ABC, BCA, CAB, ... for three)."""
    shift = slice_index % len(targets)
    return [*targets[shift:], *targets[:shift]]


async def run_compare(
    targets: Sequence[Target],
    trace: Trace,
    options: RunOptions,
    *,
    slice_count: int = 4,
    same_prompts: bool = False,
) -> list[RunResult]:
    """Play every slice of ``trace`` against every target, interleaved; one merged result per target.

    Unless ``same_prompts``, each target gets the trace with its own prompt texts (same classes,
    lengths and send times), so gateways sharing replicas never hit the cache another one warmed."""
    if len({t.name for t in targets}) != len(targets) or len(targets) < 2:
        raise ValueError("compare needs at least two targets with distinct names")
    traces = {
        t.name: trace
        if same_prompts
        else build_trace(trace.workload, trace.seed, salt=target_salt(trace.salt, i))
        for i, t in enumerate(targets)
    }
    sliced = {name: slices(t, slice_count) for name, t in traces.items()}
    parts: dict[str, list[tuple[float, RunResult]]] = {t.name: [] for t in targets}
    async with new_session(options.connector_limit) as session:
        models = {t.name: t.model or await discover_model(session, t.base_url) for t in targets}
        for index in range(max(1, slice_count)):
            for target in order(targets, index):
                start_s, part = sliced[target.name][index]
                result = await run_with_session(session, target, models[target.name], part, options)
                parts[target.name].append((start_s, result))
    return [_merge(target, models[target.name], parts[target.name]) for target in targets]


def target_salt(base_salt: int, position: int) -> int:
    """Distinct prompt salts per target position, and per base salt (up to 63 targets)."""
    return base_salt * 64 + position + 1


def _merge(target: Target, model: str, parts: list[tuple[float, RunResult]]) -> RunResult:
    records: list[RequestRecord] = []
    signals: list[SignalSample] = []
    for start_s, result in parts:
        records += [
            replace(
                r,
                sent_at_s=r.sent_at_s + start_s,
                scheduled_at_s=None if r.scheduled_at_s is None else r.scheduled_at_s + start_s,
            )
            for r in result.records
        ]
        signals += [replace(s, at_s=s.at_s + start_s) for s in result.signals]
    return RunResult(
        target=target,
        model=model,
        records=tuple(sorted(records, key=lambda r: r.index)),
        wall_s=sum(result.wall_s for _, result in parts),
        cpu_s=sum(result.cpu_s for _, result in parts),
        signals=tuple(signals),
        started_epoch_s=parts[0][1].started_epoch_s if parts else time.time(),
        closed_loop=any(result.closed_loop for _, result in parts),
        trace_exhausted=any(result.trace_exhausted for _, result in parts),
    )


def ratios(summaries: Sequence[Summary], baseline: str) -> dict[str, dict[str, float | None]]:
    """Goodput, TTFT p95 and rejects of each target divided by the baseline's (None where 0/0)."""
    by_name = {s.target: s for s in summaries}
    if baseline not in by_name:
        raise ValueError(f"baseline {baseline!r} is not one of the targets: {', '.join(by_name)}")
    base = by_name[baseline]
    return {
        s.target: {
            "goodput": _ratio(s.goodput_rps, base.goodput_rps),
            "ttft_p95": _ratio(s.ttft_p95_s, base.ttft_p95_s),
            "rejects": _ratio(float(s.rejects), float(base.rejects)),
        }
        for s in summaries
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None:
        return None
    if base == 0:
        return 1.0 if value == 0 else None
    return value / base


def summaries_for(results: Sequence[RunResult], slo: Slo) -> list[Summary]:
    return [summarize(result, slo) for result in results]


def ratio_lines(table: Mapping[str, Mapping[str, float | None]], baseline: str) -> list[str]:
    """Plain lines for the terminal: ``name: goodput 1.23x, ttft_p95 0.50x, rejects -``."""
    out = []
    for name, row in table.items():
        cells = ", ".join(f"{k} {'-' if v is None else f'{v:.2f}x'}" for k, v in row.items())
        out.append(f"{name} vs {baseline}: {cells}")
    return out
