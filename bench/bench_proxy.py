"""Proxy overhead benchmark: gateway CPU per request and added latency against direct calls.

Three processes: zero-delay backends (raw asyncio + httptools, one process for all of them, so its
CPU is not counted), the gateway (uvicorn + uvloop, its CPU read from ``/proc`` via psutil), and
this driver (aiohttp clients at a fixed concurrency). Each scenario runs direct and through the
gateway in the same run: non-streaming requests, 50-chunk streams back-to-back, 50-chunk streams
paced ~5 ms apart, non-streaming requests at a fixed 1000 per second (open loop: added latency at
a load the machine carries) and one at a time (serial). Prints a table.
``--decisions N`` instead times the decision path alone, in this process: price, admit, first token,
``finished`` and ``release`` for N requests against four healthy replicas, no sockets (CPU
microseconds per request). ``--client N`` times the upstream client alone, in this process on
uvloop: N non-stream requests to the zero-delay backends through an aiohttp session set up as the
gateway's other upstream calls are, then through the completion routes' ``ReplicaClient`` (CPU
microseconds per request). ``--access-log N`` times an answered request's access-log line, N
lines per way of writing it, and ``--tracing N`` its spans, N requests sampled and N sampled out,
in this process (``bench.bench_record``).

``--report FILE`` runs the scenarios, then every part alone, and writes the figures as markdown
(``bench.proxy_report``): docs/proxy-report.md is that file, and the one-off measurements at its
end are kept when it is written again.

    python -m bench.bench_proxy [--concurrency 64] [--requests 4000] [--streams 600]
    python -m bench.bench_proxy --decisions 20000
    python -m bench.bench_proxy --client 20000
    python -m bench.bench_proxy --access-log 20000 --tracing 5000
    python -m bench.bench_proxy --report docs/proxy-report.md
    python -m bench.bench_proxy --peers all [--rounds 3] [--peer-bin-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import psutil

from bench.proxy_report import ProxyFigures, ScenarioFigures, write_proxy_report
from bench.raw_http import RequestProtocol
from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.ports import free_ports

if TYPE_CHECKING:
    from kvgate.gateway.request_path.decision_path import DecisionPath
    from kvgate.gateway.request_path.dispatcher import Route
    from kvgate.gateway.request_path.pricing import Uncounted
    from kvgate.gateway.state import ProxyRequest

MODEL = "bench-model"
CHUNKS = 50
PACE_HEADER = "x-bench-pace-ms"
PACE_PROMPT_PREFIX = "bench-pace-ms:"
"""The pace can also ride in the last message, which every router forwards: sglang-router drops
unknown headers and rewrites the body from its own request type (``user`` is lost, ``max_tokens``
becomes ``max_completion_tokens``)."""
NON_STREAM_REQUEST = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": CHUNKS}
NON_STREAM_BODY = orjson.dumps(NON_STREAM_REQUEST)
JSON_HEADERS = {"content-type": "application/json"}


class _BackendProtocol(RequestProtocol):
    """HTTP/1.1 keep-alive server answering every POST at once: JSON, or ``max_tokens`` SSE chunks."""

    __slots__ = ("_pace_ms",)

    def __init__(self) -> None:
        super().__init__()
        self._pace_ms = 0.0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._pace_ms = 0.0

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == PACE_HEADER.encode():
            self._pace_ms = float(value)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        if self._url == b"/health":
            self._transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"
            )
            return
        request = orjson.loads(bytes(self._body))
        chunks = int(request.get("max_tokens") or request.get("max_completion_tokens") or CHUNKS)
        content = request.get("messages", [{}])[-1].get("content")
        if isinstance(content, str) and content.startswith(PACE_PROMPT_PREFIX):
            self._pace_ms = float(content.removeprefix(PACE_PROMPT_PREFIX))
        if not request.get("stream"):
            body = orjson.dumps(
                {
                    "id": "cmpl-bench",
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * chunks}}],
                    "usage": {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks},
                }
            )
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
                body
            )
            self._transport.write(head + body)
            return
        self._transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        asyncio.get_running_loop().create_task(self._stream(chunks, self._pace_ms))

    async def _stream(self, chunks: int, pace_ms: float) -> None:
        assert self._transport is not None
        event = (
            b'data: {"id":"cmpl-bench","object":"chat.completion.chunk",'
            b'"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        )
        frame = b"%x\r\n%s\r\n" % (len(event), event)
        for _ in range(chunks):
            if self._transport.is_closing():
                return
            self._transport.write(frame)
            if pace_ms:
                await asyncio.sleep(pace_ms / 1000)
        done = b"data: [DONE]\n\n"
        self._transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def serve_backends(ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(_BackendProtocol, "127.0.0.1", port) for port in ports]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


@dataclass(frozen=True, slots=True)
class Result:
    latencies_s: list[float]
    wall_s: float

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    total: int,
    concurrency: int,
) -> Result:
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                async for _ in response.content.iter_any():
                    pass
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(latencies, time.perf_counter() - start)


async def drive_at_rate(
    session: aiohttp.ClientSession,
    urls: list[str],
    body: bytes,
    headers: dict[str, str],
    total: int,
    rate: float,
) -> Result:
    """Open loop: one request every ``1 / rate`` seconds whatever the answers do, so latency is
    measured at a load the machine carries rather than at saturation."""
    latencies: list[float] = []

    async def one(url: str) -> None:
        start = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            assert response.status == 200, response.status
        latencies.append(time.perf_counter() - start)

    loop = asyncio.get_running_loop()
    tasks = []
    start = loop.time()
    for i in range(total):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(urls[i % len(urls)])))
    await asyncio.gather(*tasks)
    return Result(latencies, loop.time() - start)


def _spawn(
    args: list[str], wrapper: list[str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """A child of this module; from ``cwd``'s checkout when given (``-m`` puts it first on the path)."""
    command = [*(wrapper or []), sys.executable, "-m", "bench.bench_proxy", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=cwd)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("ready"):
            return process
    process.kill()
    raise RuntimeError(f"child exited before it was ready: {command}")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(timeout=30)
    if process.stdout is not None:
        process.stdout.close()


def _gateway_config(ports: list[int], port: int) -> str:
    replicas = ", ".join(f"http://127.0.0.1:{p}" for p in ports)
    return orjson.dumps(
        {
            "server": {"host": "127.0.0.1", "port": port, "drain_delay_s": 0},
            "health": {"interval_s": 60},
            "models": [{"name": MODEL, "max_model_len": 8192, "kv_bytes_per_token": 131072}],
            "pools": [{"name": "bench", "replicas": replicas.split(", "), "kv_capacity_tokens": 100000}],
        }
    ).decode()


def serve_gateway(config_json: str) -> None:
    from kvgate.config.loader import parse_config
    from kvgate.gateway.edge.server import serve

    config = parse_config(orjson.loads(config_json), {})
    print("ready", flush=True)
    serve(config, log_level="warning")


SCENARIOS: list[tuple[str, bool, float]] = [
    ("non-stream", False, 0.0),
    ("stream", True, 0.0),
    ("stream paced", True, 5.0),
]
"""(name, stream, pace between chunks in ms); streams carry ``CHUNKS`` chunks."""


async def run(
    concurrency: int,
    requests: int,
    streams: int,
    only: set[str] | None = None,
    profile_out: str | None = None,
) -> tuple[list[ScenarioFigures], list[tuple[str, float]]]:
    """Each scenario's figures (printed as a table), and where the gateway's samples went when
    ``profile_out`` names py-spy's output."""
    first_port = free_ports(5)
    backend_ports = list(range(first_port, first_port + 4))
    gateway_port = first_port + 4
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    profiler = [py_spy, "record", "-o", profile_out, "-f", "raw", "-r", "1000", "--"] if profile_out else []
    processes: list[subprocess.Popen[str]] = []
    try:
        processes.append(_spawn(["--backend", ",".join(map(str, backend_ports))]))
        gateway = _spawn(["--gateway", _gateway_config(backend_ports, gateway_port)], wrapper=profiler)
        processes.append(gateway)
        async with aiohttp.ClientSession() as session:
            await wait_until_ok(session, gateway_url + "/readyz")
        gateway_cpu = psutil.Process(gateway.pid)
        if profile_out:
            gateway_cpu = gateway_cpu.children()[0]
        rows = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for name, stream, pace_ms in SCENARIOS:
                if only and name not in only:
                    continue
                total = streams if stream else requests
                body = orjson.dumps(
                    {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": CHUNKS,
                        "stream": stream,
                    }
                )
                headers = {"content-type": "application/json", PACE_HEADER: str(pace_ms)}
                direct_urls = [f"http://127.0.0.1:{p}/v1/chat/completions" for p in backend_ports]
                via_url = gateway_url + "/v1/chat/completions"
                await drive(session, direct_urls[0], body, headers, concurrency, concurrency)
                direct = await _drive_direct(session, direct_urls, body, headers, total, concurrency)
                await drive(session, via_url, body, headers, concurrency, concurrency)
                before = gateway_cpu.cpu_times()
                proxied = await drive(session, via_url, body, headers, total, concurrency)
                cpu_ms = _cpu_ms_since(gateway_cpu, before)
                label = f"{name} {CHUNKS} chunks{f' / {pace_ms:g} ms' if pace_ms else ''}" if stream else name
                rows.append((label, total, cpu_ms / total, direct, proxied))
            if not only or "open loop" in only:
                rows.append(
                    await _open_loop_latency(session, backend_ports, gateway_url, gateway_cpu, requests // 2)
                )
            if not only or "serial" in only:
                rows.append(
                    await _serial_latency(session, backend_ports[0], gateway_url, gateway_cpu, requests // 8)
                )
        _print_table(rows, concurrency)
        profile: list[tuple[str, float]] = []
        if profile_out:
            gateway_cpu.terminate()
            gateway.wait(timeout=60)
            print(f"\nwhere the gateway's samples go (py-spy, inclusive; stacks in {profile_out}):")
            profile = summarize_profile(profile_out)
            for function, share in profile:
                print(f"{share:6.1%}  {function}")
        return [_figures(*row) for row in rows], profile
    finally:
        for process in reversed(processes):
            _stop(process)


def _figures(label: str, total: int, cpu_ms: float, direct: Result, proxied: Result) -> ScenarioFigures:
    return ScenarioFigures(
        label,
        total,
        cpu_ms,
        added_p50_ms=(proxied.p(0.5) - direct.p(0.5)) * 1000,
        added_p99_ms=(proxied.p(0.99) - direct.p(0.99)) * 1000,
        via_per_s=total / proxied.wall_s,
        direct_per_s=total / direct.wall_s,
    )


async def _serial_latency(
    session: aiohttp.ClientSession,
    backend_port: int,
    gateway_url: str,
    gateway_cpu: psutil.Process,
    total: int,
) -> tuple[str, int, float, Result, Result]:
    """One request at a time: the gateway's added latency without CPU queueing in the way."""
    url = f"http://127.0.0.1:{backend_port}/v1/chat/completions"
    direct = await drive(session, url, NON_STREAM_BODY, JSON_HEADERS, total, 1)
    before = gateway_cpu.cpu_times()
    proxied = await drive(
        session, gateway_url + "/v1/chat/completions", NON_STREAM_BODY, JSON_HEADERS, total, 1
    )
    return ("non-stream serial (c=1)", total, _cpu_ms_since(gateway_cpu, before) / total, direct, proxied)


def _cpu_ms_since(process: psutil.Process, before: Any) -> float:
    """User + system milliseconds ``process`` spent since ``before`` (its earlier ``cpu_times()``)."""
    after = process.cpu_times()
    return float((after.user - before.user) + (after.system - before.system)) * 1000


OPEN_LOOP_RATE = 1000.0
"""Requests per second of the open-loop scenario: about a third of what the gateway carries at
concurrency 64 on this machine, so the latency added is the gateway's, not CPU queueing's."""


async def _open_loop_latency(
    session: aiohttp.ClientSession,
    backend_ports: list[int],
    gateway_url: str,
    gateway_cpu: psutil.Process,
    total: int,
) -> tuple[str, int, float, Result, Result]:
    direct_urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in backend_ports]
    direct = await drive_at_rate(session, direct_urls, NON_STREAM_BODY, JSON_HEADERS, total, OPEN_LOOP_RATE)
    before = gateway_cpu.cpu_times()
    via_urls = [gateway_url + "/v1/chat/completions"]
    proxied = await drive_at_rate(session, via_urls, NON_STREAM_BODY, JSON_HEADERS, total, OPEN_LOOP_RATE)
    label = f"non-stream {OPEN_LOOP_RATE:g}/s open loop"
    return (label, total, _cpu_ms_since(gateway_cpu, before) / total, direct, proxied)


def summarize_profile(path: str, top: int = 25) -> list[tuple[str, float]]:
    """The functions that most samples pass through, with their share of the samples.

    Reads py-spy's raw collapsed stacks (``frame;frame;... count``). Only samples taken while
    uvicorn serves count (not start-up, not imports), and the frames nearly every sample passes
    through (the runner, the event loop's entry) are left out: they say nothing about where a
    request's time goes. py-spy samples wall time of a running thread, so a process descheduled
    inside a system call (a socket write on a busy machine) charges that call more than its CPU."""
    through: Counter[str] = Counter()
    total = 0
    with open(path) as stacks:
        for line in stacks:
            stack, _, count = line.rstrip().rpartition(" ")
            if "uvicorn/" not in stack or "_find_and_load" in stack:
                continue
            samples = int(count)
            total += samples
            for function in {re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")}:
                through[function] += samples
    if not total:
        return []
    ranked = [(function, n / total) for function, n in through.most_common() if n / total < 0.95]
    return ranked[:top]


def _print_table(rows: list[tuple[str, int, float, Result, Result]], concurrency: int) -> None:
    print(f"\nconcurrency {concurrency}, 4 zero-delay backends, {os.cpu_count()} CPUs on this machine")
    print(
        f"{'scenario':<30}{'n':>6}{'gw CPU ms/req':>15}{'direct p50':>12}{'via p50':>10}{'added p50':>11}"
        f"{'direct p99':>12}{'via p99':>10}{'added p99':>11}{'req/s via':>11}"
    )
    for name, total, cpu_ms, direct, proxied in rows:
        d50, v50, d99, v99 = (
            x * 1000 for x in (direct.p(0.5), proxied.p(0.5), direct.p(0.99), proxied.p(0.99))
        )
        print(
            f"{name:<30}{total:>6}{cpu_ms:>15.3f}{d50:>12.2f}{v50:>10.2f}{v50 - d50:>11.2f}"
            f"{d99:>12.2f}{v99:>10.2f}{v99 - d99:>11.2f}{total / proxied.wall_s:>11.0f}"
        )
    print("latencies in ms; 'added' = through the gateway minus direct, same run, same client")


async def _drive_direct(
    session: aiohttp.ClientSession,
    urls: list[str],
    body: bytes,
    headers: dict[str, str],
    total: int,
    concurrency: int,
) -> Result:
    per = concurrency // len(urls)
    results = await asyncio.gather(
        *(drive(session, url, body, headers, total // len(urls), per) for url in urls)
    )
    return Result([x for r in results for x in r.latencies_s], max(r.wall_s for r in results))


async def time_clients(total: int, concurrency: int) -> tuple[float, float]:
    """CPU microseconds per request of aiohttp and of ``ReplicaClient`` (see the module docstring)."""
    from kvgate.config.server import Server
    from kvgate.gateway.replicas.replica_http import ReplicaClient
    from kvgate.gateway.replicas.upstream import create_session

    first_port = free_ports(4)
    ports = list(range(first_port, first_port + 4))
    backend = _spawn(["--backend", ",".join(map(str, ports))])
    body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": CHUNKS}
    )
    header_pairs = [(b"content-type", b"application/json"), (b"x-request-id", b"0123456789abcdef")]
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    path = "/v1/chat/completions"

    async def timed(one: Callable[[int], Awaitable[bytes]]) -> float:
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one(remaining)

        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm the pools
        remaining = total
        start_s = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return (time.process_time() - start_s) / total * 1e6

    try:
        session = create_session(Server())
        urls = [base + path for base in bases]
        string_headers = [(name.decode(), value.decode()) for name, value in header_pairs]

        async def via_aiohttp(i: int) -> bytes:
            async with session.post(urls[i % 4], data=body, headers=string_headers) as response:
                return await response.read()

        aiohttp_us = await timed(via_aiohttp)
        await session.close()
        client = ReplicaClient(connect_s=5.0, first_byte_s=60.0, idle_s=60.0, keepalive_s=30.0, limit=8192)

        async def via_replica_client(i: int) -> bytes:
            response = await client.post(bases[i % 4], path, body, header_pairs, stream=False)
            try:
                return await response.read()
            finally:
                response.release()

        replica_client_us = await timed(via_replica_client)
        await client.close()
        return aiohttp_us, replica_client_us
    finally:
        _stop(backend)


def _ready_path() -> DecisionPath:
    """The gateway's decision path over four healthy replicas, without a gateway around it."""
    from kvgate.config.loader import parse_config
    from kvgate.gateway.request_path.decision_path import DecisionPath
    from kvgate.gateway.state import GatewayState
    from kvgate.gateway.telemetry.metrics import GatewayMetrics
    from kvgate.routing.health import Outcome

    ports = range(9000, 9004)
    config = parse_config(orjson.loads(_gateway_config(list(ports), 0)), {})
    state = GatewayState.from_config(config)
    path = DecisionPath.build(state, config, GatewayMetrics())
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    return path


async def _admitted(path: DecisionPath, request: ProxyRequest) -> Route:
    """``request`` priced, admitted and routed, as ``Proxy._serve`` does before relaying it."""
    route_type, uncounted_type = _decision_types()
    request.arrived_s = path.clock()
    refusal = path.pricer.price_now(request)
    if isinstance(refusal, uncounted_type):
        refusal = await path.pricer.count(request, refusal)
    route = refusal if refusal is not None else path.dispatcher.admit_now(request)
    if asyncio.iscoroutine(route):
        route = await route
    assert isinstance(route, route_type), route
    return route


@functools.cache
def _decision_types() -> tuple[type[Route], type[Uncounted]]:
    """Imported once, not per timed request: an import statement costs ~0.7 µs even of a module
    already loaded, a few per cent of the decision path."""
    from kvgate.gateway.request_path.dispatcher import Route
    from kvgate.gateway.request_path.pricing import Uncounted

    return Route, Uncounted


def _answered(path: DecisionPath, request: ProxyRequest, route: Route) -> None:
    """The rest of a 200 answer's life: first token, usage, finished, closed, released."""
    now_s = path.clock()
    path.accounting.first_token(request, route.replica, now_s)
    request.prompt_tokens, request.completion_tokens = 8, CHUNKS
    path.accounting.finished(request, route.replica, None, now_s)
    path.accounting.closed(request, route.replica)
    path.dispatcher.release(request)


async def answered_request() -> ProxyRequest:
    """One request as ``Proxy._done`` receives it: priced, admitted, sent, answered 200 with usage,
    released."""
    from kvgate.gateway.state import ProxyRequest

    path = _ready_path()
    request = ProxyRequest(
        "0", "0", "/v1/chat/completions", MODEL, False, NON_STREAM_REQUEST, NON_STREAM_BODY, [], []
    )
    async with aiohttp.ClientSession() as session:
        path.pricer.session = session
        route = await _admitted(path, request)
    request.replica, request.started_s, request.status = route.replica, request.arrived_s, 200
    _answered(path, request, route)
    return request


async def time_decisions(total: int, held: int = 32) -> float:
    """CPU microseconds per request of the decision path alone (see the module docstring)."""
    from kvgate.gateway.state import ProxyRequest

    path = _ready_path()
    in_flight: list[tuple[ProxyRequest, Route]] = []
    async with aiohttp.ClientSession() as session:
        path.pricer.session = session
        start_s = time.process_time()
        for i in range(total):
            request = ProxyRequest(
                str(i),
                str(i),
                "/v1/chat/completions",
                MODEL,
                False,
                NON_STREAM_REQUEST,
                NON_STREAM_BODY,
                [],
                [],
            )
            in_flight.append((request, await _admitted(path, request)))
            if len(in_flight) > held:
                _answered(path, *in_flight.pop(0))
        return (time.process_time() - start_s) / total * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4000, help="non-stream requests per side")
    parser.add_argument("--streams", type=int, default=600, help="streams per side and scenario")
    parser.add_argument(
        "--py-spy", metavar="FILE", help="run the gateway under py-spy, collapsed stacks to FILE"
    )
    parser.add_argument(
        "--only",
        help="comma-separated scenarios: non-stream, stream (back-to-back), 'stream paced', 'open loop', "
        "serial",
    )
    parser.add_argument(
        "--decisions", type=int, metavar="N", help="time only the decision path for N requests, in process"
    )
    parser.add_argument(
        "--client", type=int, metavar="N", help="time only the upstream client for N requests, in process"
    )
    parser.add_argument(
        "--access-log",
        type=int,
        metavar="N",
        help="time only an access-log line, N lines per way of writing it, in process",
    )
    parser.add_argument(
        "--tracing",
        type=int,
        metavar="N",
        help="time only a request's spans, N requests sampled and N sampled out, in process",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help=f"run the scenarios and then each part alone (N {PART_REQUESTS} unless given), and write "
        "the figures as markdown to FILE, keeping its one-off section",
    )
    parser.add_argument(
        "--peers",
        metavar="NAMES",
        help="compare router CPU per request with these Rust routers instead (comma-separated, or "
        "all; bench.bench_proxy_peers)",
    )
    parser.add_argument("--peer-bin-dir", type=Path, help="where the routers' scripts are (with --peers)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target (with --peers)")
    parser.add_argument(
        "--kvgate-from",
        metavar="NAME=DIR",
        action="append",
        default=[],
        help="with --peers, also a gateway run from the checkout DIR (another commit, a compiled "
        "build), named NAME; repeatable",
    )
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--gateway", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.backend:
        import uvloop

        uvloop.run(serve_backends([int(p) for p in args.backend.split(",")]))
        return 0
    if args.gateway:
        serve_gateway(args.gateway)
        return 0
    if args.peers:
        import uvloop

        from bench.bench_proxy_peers import compare

        return uvloop.run(compare(args))
    if args.report:
        return report(args, sys.argv[1:] if argv is None else argv)
    if args.decisions:
        per_request_us = asyncio.run(time_decisions(args.decisions))
        print(f"decision path: {per_request_us:.1f} us CPU per request ({args.decisions} requests)")
        return 0
    if args.client:
        import uvloop

        aiohttp_us, replica_client_us = uvloop.run(time_clients(args.client, args.concurrency))
        print(f"upstream client, {args.client} non-stream requests at concurrency {args.concurrency}:")
        print(f"  aiohttp ClientSession  {aiohttp_us:7.1f} us CPU per request")
        print(f"  ReplicaClient          {replica_client_us:7.1f} us CPU per request")
        return 0
    if args.access_log or args.tracing:
        from bench.bench_record import time_access_log, time_tracing

        request = asyncio.run(answered_request())
        timed = time_access_log(request, args.access_log) if args.access_log else {}
        timed |= time_tracing(request, args.tracing) if args.tracing else {}
        for label, per_request_us in timed.items():
            print(f"{per_request_us:7.1f} us CPU  {label}")
        return 0
    asyncio.run(run(args.concurrency, args.requests, args.streams, _only(args), args.py_spy))
    return 0


PART_REQUESTS = 20000
"""Requests (or lines) each part is timed over in a report unless its own option says."""


def report(args: argparse.Namespace, argv: list[str]) -> int:
    """Every measurement of this benchmark, in one run, written as markdown to ``args.report``."""
    import uvloop

    from bench.bench_record import time_access_log, time_tracing

    scenarios, profile = asyncio.run(
        run(args.concurrency, args.requests, args.streams, _only(args), args.py_spy)
    )
    command = " ".join(["python -m bench.bench_proxy", *argv])
    figures = ProxyFigures(command, args.concurrency, scenarios, profile)
    decisions = args.decisions or PART_REQUESTS
    figures.decision_us = {f"{decisions}": asyncio.run(time_decisions(decisions))}
    aiohttp_us, replica_client_us = uvloop.run(time_clients(args.client or PART_REQUESTS, args.concurrency))
    figures.client_us = {"aiohttp `ClientSession`": aiohttp_us, "`ReplicaClient`": replica_client_us}
    request = asyncio.run(answered_request())
    figures.access_log_us = time_access_log(request, args.access_log or PART_REQUESTS)
    figures.tracing_us = time_tracing(request, args.tracing or PART_REQUESTS // 4)
    write_proxy_report(Path(args.report), figures)
    print(f"report: {args.report}")
    return 0


def _only(args: argparse.Namespace) -> set[str] | None:
    return set(args.only.split(",")) if args.only else None


if __name__ == "__main__":
    sys.exit(main())
