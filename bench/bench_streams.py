"""Open streams benchmark: what each concurrently open token stream costs one gateway process.

Processes: paced SSE backends (``bench.paced_backend``, one process for four replicas, its CPU
not counted), one gateway (the one ``kvgate serve`` runs: uvicorn on uvloop with the gateway's
edge protocol, admission and routing on, capacities set so every stream is admitted) and driver
processes (``bench.stream_driver``, raw sockets) that open N streams at a fixed rate and hold
them, each receiving one token every ITL. Once all N are open and settled, a steady window is
measured:

- gateway RSS (psutil) at the window's end minus its idle RSS, over N: memory per open stream;
- gateway CPU seconds (user + system, ``/proc`` via psutil) over the window, over the tokens the
  drivers received in it: CPU per token relayed;
- event-loop lag inside the gateway: a task in the gateway process sleeps 50 ms at a time and
  records by how much it wakes late (the gateway exports no such metric); p99 over the window,
  and idle before the streams;
- ITL as the clients see it, p50 / p99, against the backend's pacing and against the same N
  streams sent straight to the backends in the same run (the driver's and backend's own lag);
- errors (must be 0) and, after every stream has ended, the gateway's work gauges from
  ``/metrics`` (resident sequences, pending and queued tokens: must be back to 0).

A point is ``N@ITL_MS``; each runs direct first, then through a fresh gateway. A gateway holds two
descriptors per stream (client and replica connection): points above what the descriptor limit
allows (``kvgate.gateway.edge.edge_limits.connection_cap``) are refused before anything starts.

    python -m bench.bench_streams --backend-cost 1000@50
    python -m bench.bench_streams [--points 1000@1000,2000@1000,5000@1000,9900@1000,400@30]
        [--open-per-s 500] [--window-s 20] [--drivers 2] [--report docs/streams.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.processes import processes
from kvgate.sim.ports import free_ports

MODEL = "bench-model"
REPLICAS = 4
SETTLE_S = 5.0
"""Seconds after the last stream opens before the window: its first tokens and the ramp's
garbage settle."""
TAIL_S = 2.0
"""Seconds every stream outlives the window by."""
LAG_PERIOD_S = 0.05
IDLE_S = 3.0
"""Seconds the gateway is watched idle (after a warm-up) before the streams."""
WORK_GAUGES = (
    "kvgate_resident_sequences",
    "kvgate_pending_prompt_tokens",
    "kvgate_queued_requests",
    "kvgate_queued_prompt_tokens",
    "kvgate_remaining_decode_tokens",
)
UPSTREAM_CONNECTIONS = 10000


@dataclass(frozen=True, slots=True)
class Point:
    streams: int
    itl_ms: float

    @classmethod
    def parse(cls, text: str) -> Point:
        streams, _, itl_ms = text.partition("@")
        return cls(int(streams), float(itl_ms))

    def __str__(self) -> str:
        return f"{self.streams}@{self.itl_ms:g}"


@dataclass(frozen=True, slots=True)
class Quantiles:
    p50: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Quantiles:
        if not values:
            return cls(math.nan, math.nan)
        ordered = sorted(values)
        return cls(ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])


@dataclass(frozen=True, slots=True)
class Side:
    """One point's measurements on one side (straight to the backends, or through the gateway)."""

    streams_done: int
    errors: int
    first_error: str
    window_tokens: int
    window_s: float
    itl_s: Quantiles
    tokens: int = 0
    """Tokens received over the whole run, not only the window."""


@dataclass(frozen=True, slots=True)
class GatewayFigures:
    idle_rss_bytes: int
    window_start_rss_bytes: int
    open_rss_bytes: int
    after_rss_bytes: int
    cpu_s: float
    idle_cpu_per_s: float
    """CPU seconds per second with no stream open (health probes, scrapes, the lag sampler)."""
    lag_idle_s: Quantiles
    lag_s: Quantiles
    lag_max_s: float
    opening_lag_max_s: float
    """The largest lag while the streams were opening."""
    full_collections: int
    """Full (generation 2) garbage collections from the first stream to the window's end."""
    full_collection_max_s: float
    work_after: dict[str, float]

    def per_stream_bytes(self, streams: int) -> float:
        return (self.open_rss_bytes - self.idle_rss_bytes) / streams


@dataclass(frozen=True, slots=True)
class PointResult:
    point: Point
    direct: Side
    via: Side
    gateway: GatewayFigures

    @property
    def cpu_per_token_s(self) -> float:
        return self.gateway.cpu_s / max(self.via.window_tokens, 1)

    @property
    def retained_per_token_bytes(self) -> float:
        """How much the gateway's RSS grew over the window, per token relayed in it: what an open
        stream keeps for each token it has carried."""
        g = self.gateway
        return (g.open_rss_bytes - g.window_start_rss_bytes) / max(self.via.window_tokens, 1)

    @property
    def net_cpu_per_token_s(self) -> float:
        """Less what the gateway spends idle over as long."""
        idle_s = self.gateway.idle_cpu_per_s * self.via.window_s
        return (self.gateway.cpu_s - idle_s) / max(self.via.window_tokens, 1)


@dataclass(slots=True)
class _Lines:
    """What a child process has said so far, read on a thread so its pipe never fills."""

    process: subprocess.Popen[bytes]
    progress: tuple[int, int, int, int] = (0, 0, 0, 0)
    finished: threading.Event = field(default_factory=threading.Event)
    lag: list[tuple[float, float]] = field(default_factory=list)
    full_collections: list[tuple[float, float]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> _Lines:
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for raw in self.process.stdout:
                self._take(raw)

    def _take(self, raw: bytes) -> None:
        kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
        if kind == "progress":
            opened, done, tokens, errors = (int(x) for x in rest.split())
            self.progress = (opened, done, tokens, errors)
        elif kind == "lag":
            values = [float(x) for x in rest.split()]
            self.lag.extend(zip(values[::2], values[1::2], strict=True))
        elif kind == "gc":
            at_s, pause_s = (float(x) for x in rest.split())
            self.full_collections.append((at_s, pause_s))
        elif kind == "result":
            self.finished.set()
        elif kind == "ready":
            self.ready.set()


def _spawn(
    started: list[subprocess.Popen[bytes]],
    args: list[str],
    stderr: int | None = None,
    code_dir: str | None = None,
) -> _Lines:
    """``python -m ARGS``; with ``code_dir`` run in that checkout (``-m`` puts the working directory
    first on the path), so its modules are imported."""
    process = subprocess.Popen(
        [sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=stderr, cwd=code_dir
    )
    started.append(process)
    return _Lines(process).start()


def gateway_config(backend_ports: list[int], port: int, streams: int) -> dict[str, object]:
    """Four replicas that admit every stream of the largest point: sequences and KV tokens well
    above it, as many upstream and client connections as the descriptor limit allows."""
    per_replica = streams // REPLICAS + 1000
    return {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "drain_delay_s": 0,
            "drain_timeout_s": 5,
            "upstream_connections": UPSTREAM_CONNECTIONS,
            "max_connections": UPSTREAM_CONNECTIONS,
        },
        "models": [{"name": MODEL, "max_model_len": 8192, "kv_bytes_per_token": 131072}],
        "pools": [
            {
                "name": "bench",
                "replicas": [f"http://127.0.0.1:{p}" for p in backend_ports],
                "kv_capacity_tokens": 100_000_000,
                "max_sequences": per_replica,
            }
        ],
        "admission": {"max_active_sequences_per_replica": per_replica, "queue_max_requests": 100_000},
    }


def serve_gateway(config_json: str) -> None:
    """The gateway as ``kvgate serve`` runs it, on uvloop, beside a task that samples the event
    loop's lag and prints it (``lag T LAG T LAG ...`` each second, in seconds), and a note of each
    full garbage collection (``gc T SECONDS``)."""
    import uvloop

    from kvgate.config.loader import parse_config
    from kvgate.gateway.edge.app import Gateway
    from kvgate.gateway.edge.server import DrainingServer, uvicorn_config

    config = parse_config(orjson.loads(config_json), {})
    gateway = Gateway(config)
    collecting_since_s = [0.0]

    def time_full_collections(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            collecting_since_s[0] = time.monotonic()
        else:
            now_s = time.monotonic()
            print(f"gc {now_s:.4f} {now_s - collecting_since_s[0]:.6f}", flush=True)

    gc.callbacks.append(time_full_collections)
    server = DrainingServer(uvicorn_config(gateway, config.server.host, config.server.port), gateway)

    async def sample_lag() -> None:
        samples: list[str] = []
        reported_s = time.monotonic()
        while True:
            before_s = time.monotonic()
            await asyncio.sleep(LAG_PERIOD_S)
            now_s = time.monotonic()
            samples.append(f"{now_s:.4f} {now_s - before_s - LAG_PERIOD_S:.6f}")
            if now_s - reported_s >= 1.0:
                print("lag " + " ".join(samples), flush=True)
                samples.clear()
                reported_s = now_s

    async def main() -> None:
        sampler = asyncio.create_task(sample_lag())
        print("ready", flush=True)
        await server.serve()
        sampler.cancel()

    uvloop.run(main())


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            _get(url)
            return
        except OSError:
            if time.monotonic() > deadline_s:
                raise
            time.sleep(0.1)


def _warm(gateway_url: str) -> None:
    """A few streams through the gateway, so that what runs once per process (imports, first
    connections) is not counted as per-stream memory."""
    body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    )
    for _ in range(2 * REPLICAS):
        request = urllib.request.Request(
            gateway_url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


def work_gauges(metrics_text: str) -> dict[str, float]:
    """Each work gauge summed over its series; a gauge with no series is an error (a renamed
    gauge would otherwise read as zero)."""
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in WORK_GAUGES:
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    missing = set(WORK_GAUGES) - set(totals)
    if missing:
        raise RuntimeError(f"/metrics has no {', '.join(sorted(missing))}")
    return totals


@dataclass(frozen=True, slots=True)
class _Schedule:
    start_s: float
    window_start_s: float
    window_end_s: float
    tokens: int

    @classmethod
    def plan(cls, point: Point, open_per_s: float, window_s: float) -> _Schedule:
        start_s = time.monotonic() + 1.0
        open_s = point.streams / open_per_s
        window_start_s = start_s + open_s + SETTLE_S
        lasts_s = open_s + SETTLE_S + window_s + TAIL_S
        return cls(
            start_s, window_start_s, window_start_s + window_s, math.ceil(lasts_s / (point.itl_ms / 1000))
        )


def _drive(
    started: list[subprocess.Popen[bytes]],
    point: Point,
    ports: list[int],
    schedule: _Schedule,
    open_per_s: float,
    drivers: int,
    label: str,
    gateway: psutil.Process | None = None,
    lag: _Lines | None = None,
) -> tuple[Side, dict[str, float]]:
    """Run the drivers to the end; the side's figures and, with a gateway, its CPU seconds and RSS
    over the window."""
    children = []
    outputs: list[Path] = []
    for i in range(drivers):
        plan = {
            "host": "127.0.0.1",
            "ports": ports,
            "path": "/v1/chat/completions",
            "streams": point.streams // drivers + (1 if i < point.streams % drivers else 0),
            "open_per_s": open_per_s / drivers,
            "start_s": schedule.start_s + i / open_per_s,
            "window_start_s": schedule.window_start_s,
            "window_end_s": schedule.window_end_s,
            "tokens": schedule.tokens,
            "itl_ms": point.itl_ms,
        }
        out = Path(tempfile.gettempdir()) / f"bench-streams-driver-{os.getpid()}-{i}.json"
        out.unlink(missing_ok=True)
        outputs.append(out)
        children.append(_spawn(started, ["bench.stream_driver", orjson.dumps(plan).decode(), str(out)]))
    figures: dict[str, float] = {}
    cpu_before = None
    last_tokens, last_s = 0, time.monotonic()
    while any(child.process.poll() is None for child in children):
        time.sleep(1.0)
        now_s = time.monotonic()
        opened, done, tokens, errors = (sum(c.progress[i] for c in children) for i in range(4))
        if gateway is not None:
            if cpu_before is None and now_s >= schedule.window_start_s:
                cpu_before = gateway.cpu_times()
                figures["window_start_rss_bytes"] = gateway.memory_info().rss
            if "cpu_s" not in figures and now_s >= schedule.window_end_s and cpu_before is not None:
                cpu_after = gateway.cpu_times()
                figures["cpu_s"] = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
                figures["rss_bytes"] = gateway.memory_info().rss
        phase = (
            "opening"
            if now_s < schedule.window_start_s - SETTLE_S
            else "settling"
            if now_s < schedule.window_start_s
            else "window"
            if now_s < schedule.window_end_s
            else "closing"
        )
        line = (
            f"  {label:<7} {point}: {phase:<8} open {opened - done - errors:>6} done {done:>6} err {errors}"
            f"  tokens/s {(tokens - last_tokens) / (now_s - last_s):>7.0f}"
        )
        if gateway is not None and lag is not None:
            recent = [value for at_s, value in lag.lag[-40:] if at_s > now_s - 2.0]
            line += f"  gw RSS {gateway.memory_info().rss / 2**20:6.1f} MiB"
            line += f"  lag p99 {Quantiles.of(recent).p99 * 1000:6.2f} ms"
        print(line, flush=True)
        last_tokens, last_s = tokens, now_s
    if not all(
        child.finished.is_set() and out.exists() for child, out in zip(children, outputs, strict=True)
    ):
        raise RuntimeError(f"a driver of {point} ({label}) exited without a result")
    results: list[dict[str, Any]] = [orjson.loads(out.read_bytes()) for out in outputs]
    for out in outputs:
        out.unlink()
    gaps: list[float] = [gap for result in results for gap in result["gaps_s"]]
    side = Side(
        streams_done=sum(r["done"] for r in results),
        errors=sum(r["errors"] for r in results),
        first_error=next((r["first_error"] for r in results if r["first_error"]), ""),
        window_tokens=sum(r["window_tokens"] for r in results),
        tokens=sum(r["tokens"] for r in results),
        window_s=schedule.window_end_s - schedule.window_start_s,
        itl_s=Quantiles.of(gaps),
    )
    return side, figures


def measure(
    point: Point,
    backend_ports: list[int],
    open_per_s: float,
    window_s: float,
    drivers: int,
    code_dir: str | None = None,
) -> PointResult:
    with processes() as started:
        direct, _ = _drive(
            started,
            point,
            backend_ports,
            _Schedule.plan(point, open_per_s, window_s),
            open_per_s,
            drivers,
            "direct",
        )
        port = free_ports(1)
        config = orjson.dumps(gateway_config(backend_ports, port, point.streams)).decode()
        lines = _spawn(
            started,
            ["bench.bench_streams", "--gateway", config],
            stderr=subprocess.DEVNULL,
            code_dir=code_dir,
        )
        url = f"http://127.0.0.1:{port}"
        if not lines.ready.wait(60):
            raise RuntimeError("the gateway did not start")
        _wait_ready(url + "/readyz")
        _warm(url)
        gateway = psutil.Process(lines.process.pid)
        idle_from_s = time.monotonic()
        idle_cpu = gateway.cpu_times()
        time.sleep(IDLE_S)
        idle_cpu_after = gateway.cpu_times()
        idle_cpu_per_s = (idle_cpu_after.user + idle_cpu_after.system - idle_cpu.user - idle_cpu.system) / (
            time.monotonic() - idle_from_s
        )
        idle_rss = gateway.memory_info().rss
        lag_idle = [value for at_s, value in lines.lag if at_s >= idle_from_s]
        schedule = _Schedule.plan(point, open_per_s, window_s)
        via, figures = _drive(
            started, point, [port], schedule, open_per_s, drivers, "gateway", gateway, lines
        )
        time.sleep(1.0)
        work_after = work_gauges(_get(url + "/metrics").decode())
        after_rss = gateway.memory_info().rss
        window_lag = [v for at_s, v in lines.lag if schedule.window_start_s <= at_s < schedule.window_end_s]
        collections = [c for c in lines.full_collections if schedule.start_s <= c[0] < schedule.window_end_s]
        return PointResult(
            point,
            direct,
            via,
            GatewayFigures(
                idle_rss_bytes=idle_rss,
                window_start_rss_bytes=int(figures.get("window_start_rss_bytes", 0)),
                open_rss_bytes=int(figures.get("rss_bytes", 0)),
                after_rss_bytes=after_rss,
                cpu_s=figures.get("cpu_s", math.nan),
                idle_cpu_per_s=idle_cpu_per_s,
                lag_idle_s=Quantiles.of(lag_idle),
                lag_s=Quantiles.of(window_lag),
                lag_max_s=max(window_lag, default=math.nan),
                opening_lag_max_s=max(
                    (v for at_s, v in lines.lag if schedule.start_s <= at_s < schedule.window_start_s),
                    default=math.nan,
                ),
                full_collections=len(collections),
                full_collection_max_s=max((pause_s for _, pause_s in collections), default=0.0),
                work_after=work_after,
            ),
        )


def largest_point(descriptors: int) -> int:
    """Most streams one gateway holds under ``descriptors`` (its connection cap, as at start)."""
    from kvgate.gateway.edge.edge_limits import connection_cap

    return connection_cap(UPSTREAM_CONNECTIONS, UPSTREAM_CONNECTIONS, descriptors)


@contextlib.contextmanager
def _backends() -> Iterator[list[int]]:
    first = free_ports(REPLICAS)
    ports = list(range(first, first + REPLICAS))
    with processes() as started:
        backend = _spawn(started, ["bench.paced_backend", ",".join(map(str, ports))])
        if not backend.ready.wait(30):
            raise RuntimeError("the backends did not start")
        yield ports


def backend_cost(point: Point, open_per_s: float, window_s: float, drivers: int) -> None:
    """Print the CPU each kind of backend spends per token while holding ``point``'s streams (sent
    straight to it): the simulator (one replica, every stream in its batch, its own step time as
    the ITL) and the paced backends (the point's ITL). Why the benchmark uses the latter."""
    port = free_ports(REPLICAS)
    ports = list(range(port, port + REPLICAS))
    kinds = {
        "simulator (1 replica)": (
            [
                "kvgate",
                "sim",
                "--port",
                str(port),
                "--model",
                MODEL,
                "--max-num-seqs",
                str(point.streams),
                "--cold-start-s",
                "0",
            ],
            [port],
        ),
        f"paced backend ({REPLICAS} replicas, 1 process)": (
            ["bench.paced_backend", ",".join(map(str, ports))],
            ports,
        ),
    }
    for label, (args, targets) in kinds.items():
        with processes() as started:
            backend = _spawn(started, args, stderr=subprocess.DEVNULL)
            _wait_ready(f"http://127.0.0.1:{port}/health")
            process = psutil.Process(backend.process.pid)
            before = process.cpu_times()
            schedule = _Schedule.plan(point, open_per_s, window_s)
            side, _ = _drive(started, point, targets, schedule, open_per_s, drivers, "backend")
            after = process.cpu_times()
            cpu_s = after.user + after.system - before.user - before.system
            print(
                f"{label}: {cpu_s / max(side.tokens, 1) * 1e6:.1f} us CPU per token"
                f" over {side.tokens:,} tokens,"
                f" client ITL p50/p99 {side.itl_s.p50 * 1000:.1f}/{side.itl_s.p99 * 1000:.1f} ms,"
                f" errors {side.errors}",
                flush=True,
            )


def print_row(result: PointResult) -> None:
    g, via, direct = result.gateway, result.via, result.direct
    print(
        f"{result.point!s:>10}  mem/stream {g.per_stream_bytes(result.point.streams) / 1024:6.1f} KiB"
        f"  CPU/token {result.cpu_per_token_s * 1e6:6.1f} us"
        f" (net of idle {result.net_cpu_per_token_s * 1e6:.1f})"
        f"  RSS growth {result.retained_per_token_bytes:.0f} B/token"
        f"  lag p99 {g.lag_s.p99 * 1000:6.2f} ms (idle {g.lag_idle_s.p99 * 1000:.2f})"
        f"  ITL p50/p99 via {via.itl_s.p50 * 1000:.1f}/{via.itl_s.p99 * 1000:.1f}"
        f" direct {direct.itl_s.p50 * 1000:.1f}/{direct.itl_s.p99 * 1000:.1f} ms"
        f" (pace {result.point.itl_ms:g})  errors {via.errors}+{direct.errors}"
        f"  work after {sum(g.work_after.values()):g}"
        f"  opening lag max {g.opening_lag_max_s * 1000:.0f} ms, {g.full_collections} full GCs"
        f" (longest {g.full_collection_max_s * 1000:.0f} ms)",
        flush=True,
    )
    if via.first_error or direct.first_error:
        print(f"    first error: {via.first_error or direct.first_error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", default="1000@1000,2000@1000,5000@1000,9900@1000,400@30")
    parser.add_argument("--open-per-s", type=float, default=500.0, help="streams opened per second")
    parser.add_argument("--window-s", type=float, default=20.0, help="seconds of the steady window")
    parser.add_argument("--drivers", type=int, default=2, help="driver processes")
    parser.add_argument("--report", metavar="FILE", help="write the table as markdown (and a PNG beside it)")
    parser.add_argument(
        "--gateway-code",
        metavar="DIR",
        help="run the gateway from this checkout (with this benchmark's files copied in): a before/after",
    )
    parser.add_argument("--results", metavar="FILE", help="also write every figure as JSON to FILE")
    parser.add_argument("--render", metavar="FILE", help="only write --report from a --results FILE")
    parser.add_argument(
        "--backend-cost",
        metavar="POINT",
        help="only measure the CPU per token of the simulator and of the paced backends holding POINT",
    )
    parser.add_argument("--gateway", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gateway:
        serve_gateway(args.gateway)
        return 0
    if args.backend_cost:
        backend_cost(Point.parse(args.backend_cost), args.open_per_s, args.window_s, args.drivers)
        return 0
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    command = " ".join(["python -m bench.bench_streams", *(sys.argv[1:] if argv is None else argv)])
    if args.render:
        saved = orjson.loads(Path(args.render).read_bytes())
        _report(Path(args.report), [result_of(fields) for fields in saved["results"]], saved["command"], hard)
        return 0
    points = [Point.parse(text) for text in args.points.split(",")]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ceiling = largest_point(hard)
    too_many = [p for p in points if p.streams > ceiling]
    if too_many:
        parser.error(
            f"{', '.join(map(str, too_many))}: a gateway holds two descriptors per stream and at most "
            f"{ceiling} streams under this machine's descriptor limit ({hard})"
        )
    results = []
    with _backends() as ports:
        for point in points:
            results.append(
                measure(point, ports, args.open_per_s, args.window_s, args.drivers, args.gateway_code)
            )
            if args.results:
                Path(args.results).write_bytes(orjson.dumps({"command": command, "results": results}))
            print_row(results[-1])
    print("\nall points:")
    for result in results:
        print_row(result)
    if args.report:
        _report(Path(args.report), results, command, hard)
    return 0


def _report(path: Path, results: list[PointResult], command: str, descriptors: int) -> None:
    from bench.streams_report import write_streams_report

    write_streams_report(path, results, command, descriptors)
    print(f"report: {path}")


def result_of(fields: dict[str, Any]) -> PointResult:
    """A ``PointResult`` back from its JSON (``--results``)."""

    def side(values: dict[str, Any]) -> Side:
        return Side(**(values | {"itl_s": Quantiles(**values["itl_s"])}))

    gateway = fields["gateway"]
    quantiles = {key: Quantiles(**gateway[key]) for key in ("lag_idle_s", "lag_s")}
    return PointResult(
        Point(**fields["point"]),
        side(fields["direct"]),
        side(fields["via"]),
        GatewayFigures(**(gateway | quantiles)),
    )


if __name__ == "__main__":
    sys.exit(main())
