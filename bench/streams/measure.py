"""One point of the open streams benchmark: its streams straight to the backends, then through a
fresh gateway, and what the gateway spent holding them (see the package's docstring)."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml

from bench.harness.fleet import SimSpec, start_sim
from bench.harness.gateway_config import Model, Pool, gateway_config
from bench.harness.metrics import parse
from bench.harness.processes import Children, children
from bench.streams.figures import GatewayFigures, Point, PointResult, Quantiles, Side
from bench.streams.lines import Lines, start_python
from kvgate.sim.ports import free_ports

MODEL = "bench-model"
REPLICAS = 4
WORK_GAUGES = (
    "kvgate_resident_sequences",
    "kvgate_pending_prompt_tokens",
    "kvgate_queued_requests",
    "kvgate_queued_prompt_tokens",
    "kvgate_remaining_decode_tokens",
)
UPSTREAM_CONNECTIONS = 10000


@dataclass(frozen=True, slots=True)
class Timing:
    """The pauses around a point's window: smaller only to try the benchmark out quickly."""

    open_per_s: float = 500.0
    window_s: float = 20.0
    settle_s: float = 5.0
    """Seconds after the last stream opens before the window: its first tokens and the ramp's
    garbage settle."""
    tail_s: float = 2.0
    """Seconds every stream outlives the window by."""
    idle_s: float = 3.0
    """Seconds the gateway is watched idle (after a warm-up) before the streams."""


def config(backend_ports: list[int], port: int, streams: int) -> dict[str, Any]:
    """Four replicas that admit every stream of the largest point: sequences and KV tokens well
    above it, as many upstream and client connections as the descriptor limit allows."""
    per_replica = streams // REPLICAS + 1000
    return gateway_config(
        Pool(
            [f"http://127.0.0.1:{p}" for p in backend_ports],
            name="bench",
            kv_capacity_tokens=100_000_000,
            max_sequences=per_replica,
        ),
        port=port,
        model=Model(MODEL, max_model_len=8192),
        server={
            "drain_timeout_s": 5,
            "upstream_connections": UPSTREAM_CONNECTIONS,
            "max_connections": UPSTREAM_CONNECTIONS,
        },
        admission={"max_active_sequences_per_replica": per_replica, "queue_max_requests": 100_000},
    )


def work_gauges(metrics_text: str) -> dict[str, float]:
    """Each work gauge summed over its series; a gauge with no series is an error (a renamed
    gauge would otherwise read as zero)."""
    page = parse(metrics_text, WORK_GAUGES)
    totals = {name: page.sum(name, missing=math.nan) for name in WORK_GAUGES}
    missing = [name for name, value in totals.items() if math.isnan(value)]
    if missing:
        raise RuntimeError(f"/metrics has no {', '.join(sorted(missing))}")
    return totals


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


@dataclass(frozen=True, slots=True)
class _Schedule:
    start_s: float
    window_start_s: float
    window_end_s: float
    tokens: int

    @classmethod
    def plan(cls, point: Point, timing: Timing) -> _Schedule:
        start_s = time.monotonic() + 1.0
        open_s = point.streams / timing.open_per_s
        window_start_s = start_s + open_s + timing.settle_s
        lasts_s = open_s + timing.settle_s + timing.window_s + timing.tail_s
        return cls(
            start_s,
            window_start_s,
            window_start_s + timing.window_s,
            math.ceil(lasts_s / (point.itl_ms / 1000)),
        )


def _drive(
    started: Children,
    point: Point,
    ports: list[int],
    schedule: _Schedule,
    timing: Timing,
    drivers: int,
    label: str,
    gateway: psutil.Process | None = None,
    lag: Lines | None = None,
) -> tuple[Side, dict[str, float]]:
    """Run the drivers to the end; the side's figures and, with a gateway, its CPU seconds and RSS
    over the window."""
    driver_lines = []
    outputs: list[Path] = []
    for i in range(drivers):
        plan = {
            "host": "127.0.0.1",
            "ports": ports,
            "path": "/v1/chat/completions",
            "streams": point.streams // drivers + (1 if i < point.streams % drivers else 0),
            "open_per_s": timing.open_per_s / drivers,
            "start_s": schedule.start_s + i / timing.open_per_s,
            "window_start_s": schedule.window_start_s,
            "window_end_s": schedule.window_end_s,
            "tokens": schedule.tokens,
            "itl_ms": point.itl_ms,
        }
        out = Path(tempfile.gettempdir()) / f"bench-streams-driver-{os.getpid()}-{i}.json"
        out.unlink(missing_ok=True)
        outputs.append(out)
        driver_lines.append(
            start_python(started, ["-m", "bench.streams.driver", orjson.dumps(plan).decode(), str(out)])
        )
    figures: dict[str, float] = {}
    cpu_before = None
    last_tokens, last_s = 0, time.monotonic()
    while any(child.process.poll() is None for child in driver_lines):
        time.sleep(1.0)
        now_s = time.monotonic()
        opened, done, tokens, errors = (sum(c.progress[i] for c in driver_lines) for i in range(4))
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
            if now_s < schedule.window_start_s - timing.settle_s
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
        child.finished.is_set() and out.exists() for child, out in zip(driver_lines, outputs, strict=True)
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
    timing: Timing,
    drivers: int,
    out: Path,
    code_dir: Path | None = None,
) -> PointResult:
    with children() as started:
        direct, _ = _drive(
            started, point, backend_ports, _Schedule.plan(point, timing), timing, drivers, "direct"
        )
        port = free_ports(1)
        config_path = (out / f"gateway-{point}.yaml").resolve()
        config_path.write_text(yaml.safe_dump(config(backend_ports, port, point.streams)))
        lines = start_python(
            started,
            ["-m", "bench.streams.gateway_child", str(config_path)],
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
        time.sleep(timing.idle_s)
        idle_cpu_after = gateway.cpu_times()
        idle_cpu_per_s = (idle_cpu_after.user + idle_cpu_after.system - idle_cpu.user - idle_cpu.system) / (
            time.monotonic() - idle_from_s
        )
        idle_rss = gateway.memory_info().rss
        lag_idle = [value for at_s, value in lines.lag if at_s >= idle_from_s]
        schedule = _Schedule.plan(point, timing)
        via, figures = _drive(started, point, [port], schedule, timing, drivers, "gateway", gateway, lines)
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
def backends() -> Iterator[list[int]]:
    """The paced backends' ports, while they serve."""
    with children() as started:
        yield _start_backends(started)[1]


def _start_backends(started: Children) -> tuple[subprocess.Popen[bytes], list[int]]:
    first = free_ports(REPLICAS)
    ports = list(range(first, first + REPLICAS))
    backend = start_python(started, ["-m", "bench.streams.backend", ",".join(map(str, ports))])
    if not backend.ready.wait(30):
        raise RuntimeError("the backends did not start")
    return backend.process, ports


def backend_cost(point: Point, timing: Timing, drivers: int) -> None:
    """Print the CPU each kind of backend spends per token while holding ``point``'s streams (sent
    straight to it): the simulator (one replica, every stream in its batch, its own step time as
    the ITL) and the paced backends (the point's ITL). Why the benchmark uses the latter."""
    for label in ("simulator (1 replica)", f"paced backend ({REPLICAS} replicas, 1 process)"):
        with children() as started:
            if label.startswith("simulator"):
                sim = start_sim(started, SimSpec(1, model=MODEL, max_num_seqs=point.streams))
                backend, targets = sim.process, [int(sim.urls[0].rsplit(":", 1)[1])]
            else:
                backend, targets = _start_backends(started)
            _wait_ready(f"http://127.0.0.1:{targets[0]}/health")
            process = psutil.Process(backend.pid)
            before = process.cpu_times()
            schedule = _Schedule.plan(point, timing)
            side, _ = _drive(started, point, targets, schedule, timing, drivers, "backend")
            after = process.cpu_times()
            cpu_s = after.user + after.system - before.user - before.system
            print(
                f"{label}: {cpu_s / max(side.tokens, 1) * 1e6:.1f} us CPU per token"
                f" over {side.tokens:,} tokens,"
                f" client ITL p50/p99 {side.itl_s.p50 * 1000:.1f}/{side.itl_s.p99 * 1000:.1f} ms,"
                f" errors {side.errors}",
                flush=True,
            )
