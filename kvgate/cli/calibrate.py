"""``kvgate sim calibrate``: fit a simulator profile to a running vLLM replica from a short load.

It measures the replica's time to first token against prompt length and its inter-token latency
against the number of sequences decoding together, fits the simulator's step model
(``kvgate.sim.calibration``), prints measured against fitted per point, and writes a profile file
that ``kvgate sim --profile FILE`` (and ``kvgate up --profile FILE``) accepts. The replica should
serve nothing else meanwhile: its own latency histograms are the measurement. Exit 0 on success,
1 when the target cannot be measured (unreachable, not vLLM, refuses the load), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import aiohttp

from kvgate.cli.command import CommandError, http_url
from kvgate.sim.calibration import (
    Calibration,
    CalibrationPlan,
    ReplicaProbe,
    calibrate,
    fitted_fields,
    point_table,
)
from kvgate.sim.profile import DEFAULT_PROFILE, PROFILES
from kvgate.sim.profile_file import profile_document


def register_calibrate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "calibrate",
        help="fit a profile to a running vLLM replica from a short load",
        description="Measure a running vLLM replica (TTFT against prompt length, inter-token latency "
        "against batch size, from its own /metrics histograms), fit the simulator's step model and "
        "write a profile file for `kvgate sim --profile FILE`.",
    )
    parser.add_argument("--target", required=True, help="the replica's base URL, e.g. http://10.0.0.5:8000")
    parser.add_argument("--model", help="served model to load (default: the replica's first)")
    parser.add_argument("--out", type=Path, help="profile file to write (default: print it)")
    parser.add_argument(
        "--base",
        default=DEFAULT_PROFILE,
        choices=sorted(PROFILES),
        help=f"built-in profile the fit starts from (default {DEFAULT_PROFILE})",
    )
    parser.add_argument("--name", help="the fitted profile's name (default: the --out file's stem)")
    parser.add_argument("--max-num-seqs", type=int, help="the replica's --max-num-seqs (default: base's)")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="the replica's --max-num-batched-tokens (default: base's); prompts measured stay within it",
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds of every point (default 5)")
    parser.add_argument(
        "--prompt-tokens",
        default="16,512,1024,2048",
        help="prompt lengths for TTFT, comma-separated (default 16,512,1024,2048)",
    )
    parser.add_argument(
        "--batches", default="1,2,4,8,16", help="batch sizes for ITL, comma-separated (default 1,2,4,8,16)"
    )
    parser.add_argument(
        "--check-prompt-tokens",
        default="",
        help="prompt lengths measured beside the fit but left out of it, to see how well it predicts",
    )
    parser.add_argument(
        "--check-batches", default="", help="batch sizes measured beside the fit but left out of it"
    )
    parser.set_defaults(run=run_calibrate, prog=parser.prog)


def run_calibrate(args: argparse.Namespace) -> int:
    url = http_url(args.target, "--target").rstrip("/").removesuffix("/v1")
    if args.repeats < 1:
        raise CommandError(f"--repeats must be at least 1, got {args.repeats}")
    base = PROFILES[args.base]
    budget = args.max_num_batched_tokens or base.max_num_batched_tokens
    prompt_tokens = tuple(p for p in _positive_ints(args.prompt_tokens, "--prompt-tokens") if p <= budget)
    batches = _positive_ints(args.batches, "--batches")
    if len(set(prompt_tokens)) < 2 or len(set(batches)) < 2:
        raise CommandError(
            f"need two prompt lengths within --max-num-batched-tokens ({budget}) and two batch sizes"
        )
    plan = CalibrationPlan(
        prompt_tokens=prompt_tokens,
        batches=batches,
        repeats=args.repeats,
        check_prompt_tokens=_positive_ints(args.check_prompt_tokens, "--check-prompt-tokens", optional=True),
        check_batches=_positive_ints(args.check_batches, "--check-batches", optional=True),
    )
    try:
        calibration = asyncio.run(_measure(url, args.model, plan))
    except (aiohttp.ClientError, OSError, RuntimeError, KeyError, ValueError) as exc:
        raise CommandError(f"cannot calibrate against {url}: {exc}", status=1) from None
    for line in point_table(calibration):
        print(line, flush=True)
    name = args.name or (args.out.stem if args.out else f"{calibration.facts.model}-fitted")
    fields = fitted_fields(calibration, base, args.max_num_seqs, args.max_num_batched_tokens)
    fit = calibration.fit
    notes = [
        f"Fitted by `kvgate sim calibrate --target {url}` to {calibration.facts.model}:",
        f"{len(calibration.ttft)} TTFT blocks at prompt lengths {', '.join(map(str, prompt_tokens))}, "
        f"{len(calibration.itl)} ITL blocks at batch sizes {', '.join(map(str, batches))}.",
        f"Per step {fit.t_fixed_s * 1e3:.3g} ms fixed + {fit.seq_overhead_s * 1e3:.3g} ms per sequence + "
        f"{fit.token_s * 1e6:.3g} us per token; front end {fit.frontend_latency_s * 1e3:.3g} ms per request.",
        "Use: kvgate sim --profile THIS_FILE --model " + calibration.facts.model,
    ]
    document = profile_document(args.base, name, fields, notes)
    if args.out is None:
        print(document, end="")
    else:
        args.out.write_text(document)
        print(f"wrote {args.out}", flush=True)
    return 0


async def _measure(url: str, model: str | None, plan: CalibrationPlan) -> Calibration:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        probe = await ReplicaProbe.connect(session, url, model)
        return await calibrate(probe, plan)


def _positive_ints(text: str, flag: str, optional: bool = False) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CommandError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if (not values and not optional) or (values and min(values) < 1):
        raise CommandError(f"{flag} takes positive integers, got {text!r}")
    return values
