"""``kvgate loadtest``: play a workload against a target (or compare several) and write a report.

``register`` adds the subcommand to the ``kvgate`` parser; each handler returns the exit status:
0 when the run finished, 1 when it could not start (bad workload, target unreachable: one line,
``kvgate loadtest: error: ...``), 2 when ``--fail-below-goodput`` was given and goodput fell short
of it. ``--rate`` (open loop) and ``--concurrency`` (closed loop) exclude each other; a workload
file may set either, and the flag given replaces it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.cli.command import CommandError, http_url
from kvgate.loadtest.client import RetryPolicy
from kvgate.loadtest.compare import ratio_lines, ratios, run_compare, summaries_for
from kvgate.loadtest.mooncake import BlockText, mooncake_trace, read_mooncake, window
from kvgate.loadtest.report import Slo, summarize, summary_table, write_report
from kvgate.loadtest.reuse import reuse_ceiling
from kvgate.loadtest.runner import RunOptions, Target, run
from kvgate.loadtest.workload import Trace, Workload, build_trace
from kvgate.loadtest.workload_file import PRESETS, load_workload, with_overrides

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``loadtest`` (and ``loadtest compare``); each sets ``run``, as ``kvgate`` dispatches."""
    parser = subparsers.add_parser(
        "loadtest",
        help="drive an OpenAI-compatible target with a token-aware workload and report goodput",
        description="Drive a gateway (or anything OpenAI-compatible) and write report.md, results.json "
        "and plots. Use `kvgate loadtest compare` to interleave one trace over several targets.",
    )
    _add_common(parser)
    parser.add_argument("--target", help="base URL, e.g. http://127.0.0.1:8080 (a trailing /v1 is fine)")
    parser.set_defaults(run=main_run, targets=None, prog=parser.prog)
    commands = parser.add_subparsers(dest="loadtest_command")
    compare = commands.add_parser(
        "compare",
        help="one trace against several targets, interleaved, with ratios against a baseline",
        description="Cut one trace into slices and play each slice against every target in rotating "
        "order (AB, BA, ...); print goodput, TTFT p95 and reject ratios against --baseline.",
    )
    _add_common(compare)
    compare.add_argument(
        "--target",
        dest="targets",
        action="append",
        required=True,
        metavar="NAME=URL",
        help="a target to compare; repeat for each (e.g. --target rr=http://... --target kv=http://...)",
    )
    compare.add_argument("--baseline", help="target name ratios are taken against (default: the first)")
    compare.add_argument("--slices", type=int, default=4, help="interleaving slices (default 4)")
    compare.add_argument(
        "--same-prompts",
        action="store_true",
        help="send every target the same prompt texts (default: own texts per target, same lengths and "
        "times, so targets sharing replicas do not hit each other's prefix cache)",
    )
    compare.set_defaults(run=main_compare, prog=compare.prog)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload", default="chat", help=f"preset ({', '.join(PRESETS)}) or YAML file (default chat)"
    )
    parser.add_argument("--duration", type=float, dest="duration_s", help="seconds of arrivals")
    loop = parser.add_mutually_exclusive_group()
    loop.add_argument("--rate", type=float, dest="rate_rps", help="open loop: requests/s (base rate)")
    loop.add_argument("--concurrency", type=int, help="closed loop: requests in flight (not with --rate)")
    parser.add_argument("--requests", type=int, dest="max_requests", help="cap on the trace's requests")
    replay = parser.add_argument_group("replaying a production trace (Mooncake format) instead of a workload")
    replay.add_argument(
        "--trace", type=Path, help="JSONL: timestamp (ms), input_length, output_length, hash_ids"
    )
    replay.add_argument("--speed", type=float, default=1.0, help="replay this many times faster (default 1)")
    replay.add_argument(
        "--start-s", type=float, default=0.0, help="start this far into the trace (default 0)"
    )
    replay.add_argument("--window-s", type=float, help="replay this many seconds of the trace (default: all)")
    replay.add_argument(
        "--cache-tokens",
        type=int,
        help="the fleet's KV cache in tokens, all replicas together: states the replay's reuse ceiling",
    )
    replay.add_argument(
        "--host-cache-tokens",
        type=int,
        default=0,
        help="the fleet's host-memory KV tier in tokens (default 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="fixes the trace (default 0)")
    parser.add_argument(
        "--prompt-salt",
        type=int,
        default=0,
        help="new prompt texts, same lengths and times (rerunning against a warm prefix cache)",
    )
    parser.add_argument("--model", help="model name (default: first of GET /v1/models)")
    parser.add_argument("--slo-ttft-s", type=float, help="TTFT target for goodput (default: workload's)")
    parser.add_argument("--slo-itl-s", type=float, help="mean ITL target for goodput (default: workload's)")
    parser.add_argument(
        "--slo-ttft-prompt-tokens-per-s",
        type=float,
        metavar="RATE",
        help="grow the TTFT target by the prompt over RATE (16000: 1 s + prompt / 16k tokens/s)",
    )
    parser.add_argument("--retry", action="store_true", help="honour Retry-After like the OpenAI SDK")
    parser.add_argument("--max-retries", type=int, default=2, help="retry budget per request (default 2)")
    parser.add_argument("--out", type=Path, default=Path("loadtest-report"), help="report directory")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line on stderr")
    parser.add_argument(
        "--fail-below-goodput", type=float, metavar="RATIO", help="exit 2 when goodput ratio is below this"
    )


def _prepare(args: argparse.Namespace) -> tuple[Workload, Trace, RunOptions, Slo, list[str]]:
    """The workload, its trace, how to run it, the goodput objective, and the report's notes."""
    if args.trace is not None:
        workload, trace, notes = _replay(args)
    else:
        workload = with_overrides(
            load_workload(args.workload),
            duration_s=args.duration_s,
            rate_rps=args.rate_rps,
            concurrency=args.concurrency,
            max_requests=args.max_requests,
            slo_ttft_s=args.slo_ttft_s,
            slo_itl_s=args.slo_itl_s,
        )
        trace, notes = build_trace(workload, args.seed, salt=args.prompt_salt), []
    options = RunOptions(
        retry=RetryPolicy(max_retries=args.max_retries) if args.retry else None,
        progress=None if args.no_progress else sys.stderr,
    )
    rate = args.slo_ttft_prompt_tokens_per_s
    if rate is not None and rate <= 0:
        raise ValueError(f"--slo-ttft-prompt-tokens-per-s: want > 0, got {rate:g}")
    slo = Slo(workload.slo_ttft_s, workload.slo_itl_s, 1.0 / rate if rate else 0.0)
    return workload, trace, options, slo, notes


def _replay(args: argparse.Namespace) -> tuple[Workload, Trace, list[str]]:
    """A Mooncake-format trace's window as a trace, with the reuse ceiling when the cache is known."""
    requests = window(read_mooncake(args.trace), args.start_s, args.window_s)
    if args.max_requests is not None:
        requests = requests[: args.max_requests]
    if not requests:
        raise ValueError(f"{args.trace}: no request in the window")
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000.0 / args.speed
    workload = Workload(
        name=args.trace.stem,
        classes=(),
        description=f"Replay of `{args.trace.name}` from {args.start_s:g} s"
        + (f" for {args.window_s:g} s" if args.window_s else "")
        + f" of its time, {args.speed:g}x as fast.",
        api="completions",
        duration_s=max(span_s, 1e-3),
        rate_rps=len(requests) / max(span_s, 1e-3),
        slo_ttft_s=args.slo_ttft_s if args.slo_ttft_s is not None else 1.0,
        slo_itl_s=args.slo_itl_s if args.slo_itl_s is not None else 0.05,
    )
    trace = mooncake_trace(
        requests, workload, BlockText(TiktokenTokenizer.from_name(), args.prompt_salt), speed=args.speed
    )
    notes = []
    if args.cache_tokens:
        gpu = reuse_ceiling(requests, args.cache_tokens)
        notes.append(
            f"reuse ceiling: {gpu.hit_ratio:.3f} (one LRU cache of the fleet's {args.cache_tokens:,} KV "
            "tokens on the same requests; a router's prefix hit rate is read against it)"
        )
        if args.host_cache_tokens:
            tiers = reuse_ceiling(requests, args.cache_tokens + args.host_cache_tokens)
            notes.append(
                f"reuse ceiling with the host tier ({args.host_cache_tokens:,} tokens more): "
                f"{tiers.hit_ratio:.3f}"
            )
    return workload, trace, notes


def _require_plots() -> None:
    """Fail before a run rather than after it when the plotting library (the ``loadtest`` extra)
    is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise CommandError("the report's plots need matplotlib: pip install 'kvgate[loadtest]'")


def main_run(args: argparse.Namespace) -> int:
    if not args.target:
        raise CommandError("--target URL is required", status=1)
    url = _http_url(args.target, "--target")
    _require_plots()
    try:
        _, trace, options, slo, notes = _prepare(args)
        target = Target(name=urlsplit(url).netloc, url=url, model=args.model)
        result = run_async(run(target, trace, options))
    except (ValueError, OSError, aiohttp.ClientError) as exc:
        raise CommandError(_one_line(exc), status=1) from None
    paths = write_report(args.out, trace, [result], slo, notes=notes)
    for note in notes:
        print(note)
    summary = summarize(result, slo)
    print(summary_table([summary]))
    for warning in summary.warnings():
        print(f"warning: {warning}")
    print(f"report: {paths[0]}")
    return _exit_status(args, [summary.goodput_ratio])


def main_compare(args: argparse.Namespace) -> int:
    _require_plots()
    try:
        targets = [_parse_target(spec, args.model) for spec in args.targets]
        baseline = args.baseline or targets[0].name
        _, trace, options, slo, notes = _prepare(args)
        results = run_async(
            run_compare(targets, trace, options, slice_count=args.slices, same_prompts=args.same_prompts)
        )
        summaries = summaries_for(results, slo)
        table = ratios(summaries, baseline)
    except (ValueError, OSError, aiohttp.ClientError) as exc:
        raise CommandError(_one_line(exc), status=1) from None
    paths = write_report(args.out, trace, results, slo, ratios=table, baseline=baseline, notes=notes)
    for note in notes:
        print(note)
    print(summary_table(summaries))
    for summary in summaries:
        for warning in summary.warnings():
            print(f"warning ({summary.target}): {warning}")
    print("\n".join(ratio_lines(table, baseline)))
    print(f"report: {paths[0]}")
    return _exit_status(args, [s.goodput_ratio for s in summaries])


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where it is installed: it costs the generator less CPU per streamed chunk."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def _parse_target(spec: str, model: str | None) -> Target:
    name, sep, url = spec.partition("=")
    if not sep or not name or not url:
        raise CommandError(f"--target wants NAME=URL, got {spec!r}", status=1)
    return Target(name=name, url=_http_url(url, "--target"), model=model)


def _http_url(url: str, flag: str) -> str:
    try:
        return http_url(url, flag)
    except CommandError as exc:
        raise CommandError(str(exc), status=1) from None


def _one_line(exc: BaseException) -> str:
    """An exception as one line: the first line of its text, or its type when it has none."""
    if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _exit_status(args: argparse.Namespace, goodput_ratios: list[float]) -> int:
    floor = args.fail_below_goodput
    if floor is not None and any(ratio < floor for ratio in goodput_ratios):
        return 2
    return 0
