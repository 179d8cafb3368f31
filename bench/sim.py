"""Benchmark of the replica simulator: its profile's figures, and its own cost on real sockets.

Part 1 drives the engine with a manual clock and prints the default profile's TTFT, ITL, prefill
rate and KV capacity next to the figures they are meant to land near. Part 2 serves
``--replicas`` replicas in a child process (``python -m kvgate sim``), opens ``--streams``
concurrent streams per replica for ``--duration-s`` seconds, and prints the child's CPU time per
streamed token and how far its step loops ran behind schedule. A run whose lag ratio exceeds 5 %
is reported as invalid. With ``--kv-events`` the replicas also publish vLLM's KV cache events, which
this process subscribes to and drains, so the difference between two runs is what publishing costs.
Not a test: numbers only.

    python -m bench sim [--replicas 4] [--streams 64] [--duration-s 20] [--kv-events]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import cast

import aiohttp
import orjson
import psutil
import zmq
import zmq.asyncio

from bench.harness.cli import benchmark_parser, recorded
from bench.harness.fleet import SimSpec, start_sim
from bench.harness.metrics import scrape_all
from bench.harness.processes import children
from kvgate.sim.engine import Engine
from kvgate.sim.ports import free_ports
from kvgate.sim.profile import DEFAULT_PROFILE, resolve_profile

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


_BODY = orjson.dumps(
    {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "Tell me about KV caches. " * 40}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
)
_SUMMED = ("vllm:generation_tokens_total", "kvgate_sim_lag_seconds_total", "kvgate_sim_busy_seconds_total")


class _StreamClient(asyncio.Protocol):
    """A client as lean as can be, so the machine's CPU goes to the simulator: it sends one
    streaming request after another on a kept-alive connection and counts SSE events."""

    def __init__(self, port: int, deadline: float, counts: list[int], done: asyncio.Future[None]) -> None:
        self._request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (port, len(_BODY), _BODY)
        )
        self._deadline = deadline
        self._counts = counts
        self._done = done
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._counts[0] += data.count(b"data: ")
        if data.endswith(b"0\r\n\r\n") and self._transport is not None:
            if time.monotonic() < self._deadline:
                self._transport.write(self._request)
            else:
                self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


async def _stream(port: int, deadline: float, counts: list[int]) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    await loop.create_connection(lambda: _StreamClient(port, deadline, counts, done), "127.0.0.1", port)
    await done


async def _metrics(session: aiohttp.ClientSession, urls: list[str]) -> dict[str, float]:
    page = await scrape_all(session, urls, _SUMMED)
    return {name: page.sum(name) for name in _SUMMED}


async def _drain_events(endpoint: str, batches: list[int]) -> None:
    """A subscriber that reads every batch a replica publishes, and counts them."""
    socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    try:
        while True:
            await socket.recv_multipart()
            batches[0] += 1
    finally:
        socket.close(linger=0)


async def serving_cost(
    replicas: int, streams: int, duration_s: float, time_scale: float, events: bool
) -> None:
    profiler = os.environ.get("KVGATE_BENCH_PROFILE")
    prefix = ["-m", "cProfile", "-o", profiler] if profiler else []
    events_port = free_ports(replicas) if events else None
    batches = [0]
    with children() as started:
        spec = SimSpec(replicas, time_scale=time_scale, kv_events_port=events_port)
        sim = start_sim(started, spec, python_args=prefix)
        urls = list(sim.urls)
        port = int(urls[0].rsplit(":", 1)[1])
        process = psutil.Process(sim.process.pid)
        endpoints = (
            [] if events_port is None else [f"tcp://127.0.0.1:{events_port + i}" for i in range(replicas)]
        )
        drains = [asyncio.create_task(_drain_events(endpoint, batches)) for endpoint in endpoints]
        async with aiohttp.ClientSession() as session:
            await sim.ready(session)
            counts = [0]
            cpu_before = process.cpu_times()
            own_before = time.process_time()
            metrics_before = await _metrics(session, urls)
            started_s = time.monotonic()
            deadline = started_s + duration_s
            await asyncio.gather(
                *(_stream(port + i, deadline, counts) for i in range(replicas) for _ in range(streams))
            )
            elapsed = time.monotonic() - started_s
            own_s = time.process_time() - own_before
            cpu_after = process.cpu_times()
            metrics_after = await _metrics(session, urls)
        for task in drains:
            task.cancel()
    cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    tokens, lag_s, busy_s = (metrics_after[name] - metrics_before[name] for name in _SUMMED)
    lag_ratio = lag_s / busy_s if busy_s else 0.0
    per_token_us = cpu_s / tokens * 1e6 if tokens else float("nan")
    setup = f"{replicas} replicas x {streams} streams, {elapsed:.1f} s, scale {time_scale:g}"
    print(f"== serving cost: {setup}{', KV events on' if events else ''}")
    rate = f"({tokens / elapsed:,.0f}/s; client saw {counts[0]:,} events)"
    print(f"streamed tokens        {tokens:>10,.0f}   {rate}")
    user_s = cpu_after.user - cpu_before.user
    share = f"({cpu_s / elapsed * 100:.0f} % of one core; user {user_s:.2f} s, system {cpu_s - user_s:.2f} s)"
    print(f"simulator CPU          {cpu_s:>10.2f} s    {share}")
    print(f"client CPU             {own_s:>10.2f} s    ({own_s / elapsed * 100:.0f} % of one core)")
    print(f"CPU per streamed token {per_token_us:>10.1f} us   (target <= {_CPU_TARGET_US:g} us)")
    print(f"step-loop lag          {lag_ratio * 100:>10.2f} %    (target < {_LAG_LIMIT_RATIO * 100:g} %)")
    if events:
        print(f"KV event batches       {batches[0]:>10,}   (received by this process)")
    if lag_ratio >= _LAG_LIMIT_RATIO:
        print("RUN INVALID: the simulator lagged its schedule materially; raise --time-scale")


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("sim", __doc__)
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--kv-events", action="store_true", help="replicas publish KV events, drained here")
    args = parser.parse_args(argv)
    with recorded(args.out):
        profile_figures(args.profile)
        asyncio.run(
            serving_cost(args.replicas, args.streams, args.duration_s, args.time_scale, args.kv_events)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
