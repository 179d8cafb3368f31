"""One goodput run: a fleet per target, kvgate's gateways and the installed routers in front, the
trace played through them all in interleaved slices, the fleets' counters read before and after."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.goodput.figures import PolicyRun, PromiseTrust, fleet_counters, gateway_page
from bench.goodput.table import plot, print_table
from bench.goodput.trace import workload
from bench.harness import peers
from bench.harness.fleet import start_fleet_child
from bench.harness.gateway import start_gateway
from bench.harness.gateway_config import Pool, gateway_config
from bench.harness.processes import children
from bench.routing_lab import traces
from bench.traces.shapes import SHAPES
from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.loadtest.client import RetryPolicy
from kvgate.loadtest.compare import run_compare, summaries_for
from kvgate.loadtest.mooncake import BlockText, mooncake_trace, read_mooncake, window
from kvgate.loadtest.report import Slo, class_table
from kvgate.loadtest.reuse import reuse_ceiling
from kvgate.loadtest.runner import RunOptions, Target
from kvgate.loadtest.workload import Trace, Workload, build_trace
from kvgate.routing.prefix_hash import BLOCK_SIZE_TOKENS
from kvgate.sim.fleet import DEFAULT_MODEL
from kvgate.sim.ports import free_ports


def config(
    urls: Sequence[str],
    port: int,
    policy: str,
    kv_capacity_tokens: int,
    admission: bool = True,
    max_sequences: int = 256,
    slo: Slo | None = None,
) -> dict[str, Any]:
    """A gateway differing from the others only in ``routing.policy``; with ``admission`` off every
    request is routed at once, as the Rust routers do, so the rows compare routing alone. With
    ``slo``, the model's objectives are the trace's, as an operator serving that SLO sets them: a
    request that would wait past its TTFT objective is refused at once, and each replica runs no more
    sequences than keep its inter-token latency within the ITL objective."""
    objectives = {} if slo is None else {"ttft_slo_s": slo.ttft_s, "itl_slo_s": slo.itl_s}
    return gateway_config(
        # What the replicas hold: their cache is whole blocks.
        Pool(urls, kv_capacity_tokens=kv_capacity_tokens // BLOCK_SIZE_TOKENS * BLOCK_SIZE_TOKENS,
             max_sequences=max_sequences),
        port=port,
        health={"interval_s": 0.5},
        routing={"policy": policy, "warmup_s": 0},
        admission={
            "max_queue_wait_s": 30,
            # The driver's clients honour a Retry-After of at most 30 s (``--retries``).
            "retry_after_cap_s": 30,
            "enabled": admission,
            "models": {DEFAULT_MODEL: objectives} if objectives else {},
        },
    )  # fmt: skip


def installed_peers(args: argparse.Namespace) -> list[tuple[peers.Peer, str]]:
    """The chosen peers whose program is found, each with its path; one line for each that is not."""
    found = []
    for peer in peers.select(args.peers):
        binary = peers.locate(peer.program, args.peer_bin_dir)
        if binary is None:
            print(f"{peer.name}: {peer.program} not found (pip install 'kvgate[bench]'), left out")
        else:
            found.append((peer, binary))
    return found


def replay_trace(args: argparse.Namespace) -> tuple[Trace, list[str]]:
    """``--replay`` as a trace (a shape of ``bench.traces`` or a Mooncake file), and its reuse
    ceilings: what one cache of all the fleet's replicas would hit (``kvgate.loadtest.reuse``)."""
    if args.replay in SHAPES:
        requests = SHAPES[args.replay](args.rate, args.duration_s, args.seed)
        speed, name = args.speed, f"{args.replay} at {args.rate:g} req/s x{args.speed:g}"
    else:
        requests = window(read_mooncake(Path(args.replay)), args.start_s, args.window_s)
        speed, name = args.speed, f"{Path(args.replay).name} x{args.speed:g}"
    span_s = max(1e-3, (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000.0 / speed)
    replay = Workload(
        name=name, classes=(), api="completions", duration_s=span_s, rate_rps=len(requests) / span_s
    )
    args.duration_s, args.rate = span_s, len(requests) / span_s
    trace = mooncake_trace(requests, replay, BlockText(TiktokenTokenizer.from_name()), speed=speed)
    fleet_tokens = args.kv_capacity_tokens * args.replicas
    ceiling = reuse_ceiling(requests, fleet_tokens).hit_ratio
    notes = [f"reuse ceiling {ceiling:.3f} (one cache of {fleet_tokens:,} tokens)"]
    if args.cpu_offload_tokens:
        tiers = fleet_tokens + args.cpu_offload_tokens * args.replicas
        with_host = reuse_ceiling(requests, tiers).hit_ratio
        notes.append(f"with the host tier {with_host:.3f} (one cache of {tiers:,} tokens)")
    return trace, notes


async def bench(args: argparse.Namespace) -> None:
    notes: list[str] = []
    if args.replay:
        trace, notes = replay_trace(args)
        slo = Slo(args.slo_ttft_s, args.slo_itl_s, 1.0 / args.slo_ttft_prompt_tokens_per_s)
    elif args.trace == "mixed":
        slo = Slo(args.slo_ttft_s, args.slo_itl_s)
        trace = build_trace(workload(args.rate, args.duration_s, slo.ttft_s, slo.itl_s), args.seed)
    else:
        slo = Slo(args.slo_ttft_s, args.slo_itl_s)
        trace = traces.TRACES[args.trace].trace(args.seed)
    classes: dict[str, int] = {}
    for request in trace.requests:
        classes[request.class_name] = classes.get(request.class_name, 0) + 1
    mix = ", ".join(f"{n} {c}" for c, n in sorted(classes.items()))
    found = installed_peers(args)
    print(
        f"{len(trace.requests)} requests over {args.duration_s:g} s at {args.rate:g} req/s ({mix}; "
        f"{trace.prompt_tokens} prompt tokens); {len(args.policies) + len(found)} fleets of {args.replicas} "
        f"simulated llama-3.1-8b-h100 replicas (KV {args.kv_capacity_tokens} tokens each, time scale "
        f"{args.time_scale:g}), one gateway or router per target, {args.slices} interleaved slices"
        + (f"; host tier {args.cpu_offload_tokens:,} tokens each" if args.cpu_offload_tokens else "")
    )
    for note in notes:
        print(note)
    profile = {"kv_capacity_tokens": args.kv_capacity_tokens, "max_num_seqs": args.max_num_seqs}
    if args.cpu_offload_tokens:
        profile["cpu_offload_tokens"] = args.cpu_offload_tokens
    fleet: dict[str, Any] = {"time_scale": args.time_scale, "seed": args.seed}
    fleet["overrides"] = {"warmup_s": 0.0, **profile}
    with children() as started:
        names = [*args.policies, *(p.name for p, _ in found)]
        fleets = {
            name: start_fleet_child(started, {"mixed": args.replicas}, kv_events=True, **fleet)["mixed"]
            for name in names
        }
        slo_admission = slo if args.slo_admission == "on" else None
        gateways = {
            policy: start_gateway(
                started,
                config(
                    fleets[policy],
                    free_ports(),
                    policy,
                    args.kv_capacity_tokens,
                    args.admission == "on",
                    args.max_num_seqs,
                    slo_admission,
                ),
                args.out / f"gateway-{policy}.yaml",
            )
            for policy in args.policies
        }
        routers = {
            peer: peers.start_peer(
                started, peer, binary, fleets[peer.name], args.out / f"{peer.name.replace(':', '-')}.log"
            )
            for peer, binary in found
        }
        urls = {policy: gateway.url for policy, gateway in gateways.items()}
        async with aiohttp.ClientSession() as session:
            for gateway in gateways.values():
                await gateway.ready(session)
            for peer, (proc, url) in routers.items():
                why_not = await peers.ready(session, proc, url)
                if why_not is None:
                    urls[peer.name] = url
                else:
                    print(f"{peer.name}: did not start ({why_not}; output in {args.out}), left out")
            before = {name: await fleet_counters(session, fleets[name]) for name in urls}
            pages = {name: await gateway_page(session, g.url) for name, g in gateways.items()}
            targets = [Target(name, url, DEFAULT_MODEL) for name, url in urls.items()]
            # The openai SDK's manners; the gateways cap Retry-After at 30 s (``config``).
            retry = RetryPolicy(max_retries=args.retries) if args.retries else None
            results = await run_compare(
                targets,
                trace,
                RunOptions(retry=retry, progress=sys.stderr),
                slice_count=args.slices,
                same_prompts=True,
            )
            after = {name: await fleet_counters(session, fleets[name]) for name in urls}
            trust = {
                name: PromiseTrust.between(pages[name], await gateway_page(session, g.url))
                for name, g in gateways.items()
            }
    runs = [
        dataclasses.replace(
            PolicyRun.of(result, summary, before[result.target.name], after[result.target.name]),
            trust=trust.get(result.target.name),
        )
        for result, summary in zip(results, summaries_for(results, slo), strict=True)
    ]
    print_table(runs, slo)
    print("\nby request class:\n" + class_table(results, slo))
    png = args.png or args.out / "goodput.png"
    plot(runs, slo, png)
    print(f"\nplot: {png}")
