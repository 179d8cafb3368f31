"""Benchmark of the replica simulator: its profile's figures, and its own cost on real sockets.

Part 1 drives the engine with a manual clock and prints the default profile's TTFT, ITL, prefill
rate and KV capacity next to the figures they are meant to land near. Part 2 serves
``--replicas`` replicas in a child process (``python -m loadtest.sim``), opens ``--streams``
concurrent streams per replica for ``--duration-s`` seconds, and prints the child's CPU time per
streamed token and how far its step loops ran behind schedule. A run whose lag ratio exceeds 5 %
is reported as invalid. Not a test: numbers only.

    .venv/bin/python -m loadtest.bench_sim [--replicas 4] [--streams 64] [--duration-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from loadtest.sim.engine import Engine
from loadtest.sim.fleet import free_port
from loadtest.sim.profile import DEFAULT_PROFILE, resolve_profile

_LAG_LIMIT_RATIO = 0.05
_CPU_TARGET_US = 15.0


def profile_figures(name: str) -> None:
    profile = resolve_profile(name, {"warmup_s": 0})
    print(f"== profile {profile.name} (simulated time, manual clock)")
    print(f"KV capacity            {profile.kv_capacity_tokens:>10,} tokens   (target ~450k)")
    print(f"cold start             {profile.cold_start_s:>10.0f} s        (target ~60 s)")
    for prompt_tokens in (256, 1024, 4096, 16384):
        engine = Engine(profile)
        request = engine.add_request("ttft", list(range(prompt_tokens)), 1, 0.0)
        now_s = 0.0
        while request.first_token_s is None:
            now_s = engine.step(now_s).end_s
        ttft_s = request.first_token_s
        rate = prompt_tokens / ttft_s
        figure = f"{ttft_s * 1e3:>10.1f} ms       ({rate:,.0f} tok/s; target 25-30k)"
        print(f"TTFT {prompt_tokens:>6} prompt tok   {figure}")
    for batch, target in ((1, "6-7"), (64, "10-12")):
        engine = Engine(profile)
        for i in range(batch):
            engine.add_request(f"itl{i}", list(range(i * 2000, i * 2000 + 1500)), 64, 0.0, ignore_eos=True)
        now_s = 0.0
        durations = []
        for _ in range(40):
            result = engine.step(now_s)
            now_s = result.end_s
            if result.num_decode_seqs == batch:
                durations.append(result.duration_s)
        itl_ms = sum(durations) / len(durations) * 1e3
        print(f"ITL batch {batch:>3}, ctx 1.5k {itl_ms:>10.2f} ms       (target {target} ms)")


async def _stream(session: aiohttp.ClientSession, url: str, deadline: float, counts: list[int]) -> None:
    body = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "Tell me about KV caches. " * 40}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    while time.monotonic() < deadline:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            async for chunk in response.content.iter_any():
                counts[0] += chunk.count(b"data: ")


def _scrape(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (
                "vllm:generation_tokens_total",
                "kvgate_sim_lag_seconds_total",
                "kvgate_sim_busy_seconds_total",
            ):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def serving_cost(replicas: int, streams: int, duration_s: float, time_scale: float) -> None:
    port = free_port()
    profiler = os.environ.get("KVGATE_BENCH_PROFILE")
    prefix = ["-m", "cProfile", "-o", profiler] if profiler else []
    args = [sys.executable, *prefix, "-m", "loadtest.sim", "--replicas", str(replicas), "--port", str(port)]
    args += ["--control-port", str(free_port()), "--cold-start-s", "0", "--time-scale", str(time_scale)]
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    urls = [f"http://127.0.0.1:{port + i}" for i in range(replicas)]
    try:
        process = psutil.Process(child.pid)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(100):
                try:
                    async with session.get(urls[-1] + "/health") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            # Warm-up (graph capture) is part of the profile; let it pass before measuring.
            await asyncio.sleep(0)
            counts = [0]
            cpu_before = process.cpu_times()
            metrics_before = await _metrics(session, urls)
            started = time.monotonic()
            deadline = started + duration_s
            await asyncio.gather(
                *(_stream(session, url, deadline, counts) for url in urls for _ in range(streams))
            )
            elapsed = time.monotonic() - started
            cpu_after = process.cpu_times()
            metrics_after = await _metrics(session, urls)
    finally:
        child.terminate()
        child.wait(10)
    cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    tokens = metrics_after["vllm:generation_tokens_total"] - metrics_before.get(
        "vllm:generation_tokens_total", 0
    )
    lag_s = metrics_after["kvgate_sim_lag_seconds_total"] - metrics_before.get(
        "kvgate_sim_lag_seconds_total", 0
    )
    busy_s = metrics_after["kvgate_sim_busy_seconds_total"] - metrics_before.get(
        "kvgate_sim_busy_seconds_total", 0
    )
    lag_ratio = lag_s / busy_s if busy_s else 0.0
    per_token_us = cpu_s / tokens * 1e6 if tokens else float("nan")
    print(f"== serving cost: {replicas} replicas x {streams} streams, {elapsed:.1f} s, scale {time_scale:g}")
    rate = f"({tokens / elapsed:,.0f}/s; client saw {counts[0]:,} chunks)"
    print(f"streamed tokens        {tokens:>10,.0f}   {rate}")
    print(f"simulator CPU          {cpu_s:>10.2f} s    ({cpu_s / elapsed * 100:.0f} % of one core)")
    print(f"CPU per streamed token {per_token_us:>10.1f} us   (target <= {_CPU_TARGET_US:g} us)")
    print(f"step-loop lag          {lag_ratio * 100:>10.2f} %    (target < {_LAG_LIMIT_RATIO * 100:g} %)")
    if lag_ratio >= _LAG_LIMIT_RATIO:
        print("RUN INVALID: the simulator lagged its schedule materially; raise --time-scale")


async def _metrics(session: aiohttp.ClientSession, urls: list[str]) -> dict[str, float]:
    total: dict[str, float] = {}
    for url in urls:
        async with session.get(url + "/metrics") as response:
            for name, value in _scrape(await response.text()).items():
                total[name] = total.get(name, 0.0) + value
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args()
    profile_figures(args.profile)
    asyncio.run(serving_cost(args.replicas, args.streams, args.duration_s, args.time_scale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
