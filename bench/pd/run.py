"""One P/D run: per trace, a mixed fleet and a prefill/decode fleet of the same size behind kvgate
(and one behind vllm-router's P/D mode, when installed), the trace played through them all."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import peers
from bench.harness.fleet import start_fleet_child
from bench.harness.gateway import start_gateway
from bench.harness.gateway_config import Pool, gateway_config
from bench.harness.metrics import scrape_all
from bench.harness.processes import Children, children
from bench.pd.table import MIXED, Row, plot, table
from bench.pd.workloads import workload
from kvgate.loadtest.compare import run_compare, summaries_for
from kvgate.loadtest.report import Slo
from kvgate.loadtest.runner import RunOptions, Target
from kvgate.loadtest.workload import build_trace
from kvgate.sim.fleet import DEFAULT_MODEL
from kvgate.sim.ports import free_ports

PD = "kvgate P/D"
ROUTER_PD = "vllm-router P/D"
LAG = "kvgate_sim_lag_ratio"


async def sim_lag_ratio(session: aiohttp.ClientSession, fleet: Mapping[str, Sequence[str]]) -> float:
    """The worst replica's ``kvgate_sim_lag_ratio``."""
    return (await scrape_all(session, [u for urls in fleet.values() for u in urls], (LAG,))).max(LAG)


def config(fleet: Mapping[str, Sequence[str]], port: int) -> dict[str, Any]:
    """The same gateway for both layouts but the pools: one mixed pool, or a prefill+decode pair."""
    return gateway_config(
        [Pool(urls, name=role, role=role) for role, urls in fleet.items()],
        port=port,
        health={"interval_s": 0.5},
        routing={"policy": "kvgate", "warmup_s": 0},
        admission={"max_queue_wait_s": 30},
    )


def start_router(
    started: Children, binary: str, fleet: Mapping[str, Sequence[str]], log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """``vllm-router`` in its P/D mode, as its README starts it: the prefill and decode URLs."""
    port = free_ports(2)
    command = [binary, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(port + 1)]
    command += ["--vllm-pd-disaggregation", "--kv-connector", "nixl", "--log-level", "warning"]
    for url in fleet["prefill"]:
        command += ["--prefill", url]
    for url in fleet["decode"]:
        command += ["--decode", url]
    return started.start(command, output=log), f"http://127.0.0.1:{port}"


async def run_trace(name: str, args: argparse.Namespace, slo: Slo, router: str | None) -> list[Row]:
    trace = build_trace(workload(name, args.rate, args.duration_s, slo), args.seed)
    decode = args.gpus - args.prefill
    print(
        f"\n== {name}: {len(trace.requests)} requests over {args.duration_s:g} s at {args.rate:g} req/s "
        f"({trace.prompt_tokens} prompt tokens); {args.gpus} simulated GPUs per target: {args.gpus} mixed, "
        f"or {args.prefill} prefill + {decode} decode",
        flush=True,
    )
    split = {"prefill": args.prefill, "decode": decode}
    fleet: dict[str, Any] = {"time_scale": args.time_scale, "seed": args.seed, "overrides": {"warmup_s": 0.0}}
    with children() as started:
        fleets = {
            MIXED: start_fleet_child(started, {"mixed": args.gpus}, **fleet),
            PD: start_fleet_child(started, split, **fleet),
        }
        gateways = {
            target: start_gateway(started, config(urls, free_ports()), args.out / f"gateway-{name}-{i}.yaml")
            for i, (target, urls) in enumerate(fleets.items())
        }
        routed = None
        if router is not None:
            fleets[ROUTER_PD] = start_fleet_child(started, split, **fleet)
            routed = start_router(started, router, fleets[ROUTER_PD], args.out / f"vllm-router-{name}.log")
        urls = {target: gateway.url for target, gateway in gateways.items()}
        async with aiohttp.ClientSession() as session:
            for gateway in gateways.values():
                await gateway.ready(session)
            if routed is not None:
                proc, url = routed
                why_not = await peers.ready(session, proc, url)
                if why_not is None:
                    urls[ROUTER_PD] = url
                else:
                    print(
                        f"{ROUTER_PD}: did not start ({why_not}; output in {args.out}), left out", flush=True
                    )
        targets = [Target(target, url, DEFAULT_MODEL) for target, url in urls.items()]
        options = RunOptions(progress=sys.stderr)
        results = await run_compare(targets, trace, options, slice_count=args.slices, same_prompts=True)
        async with aiohttp.ClientSession() as session:
            lags = {target: await sim_lag_ratio(session, fleets[target]) for target in urls}
    return [
        Row(name, result.target.name, summary, result, lags[result.target.name])
        for result, summary in zip(results, summaries_for(results, slo), strict=True)
    ]


async def bench(args: argparse.Namespace) -> None:
    slo = Slo(args.slo_ttft_s, args.slo_itl_s)
    router = peers.locate("vllm-router", args.peer_bin_dir)
    if router is None:
        print(f"{ROUTER_PD}: vllm-router not found (--peer-bin-dir, or pip install vllm-router), left out")
    rows: list[Row] = []
    for name in args.traces.split(","):
        rows += await run_trace(name.strip(), args, slo, router)
        print("\n" + table([r for r in rows if r.trace == name.strip()], slo), flush=True)
    report, png = args.report or args.out / "pd.md", args.png or args.out / "pd.png"
    report.write_text(table(rows, slo) + "\n")
    plot(rows, png)
    print(f"\ntable: {report}\nplot: {png}")
