"""Plays a trace against one target and records every request, the generator's lag and its CPU.

Open loop: each request is sent at its scheduled offset whatever the target does, and the lag
between schedule and send is recorded per request, so a generator that fell behind is visible
rather than silently turning an open loop into a closed one. Closed loop: ``concurrency`` workers
each send the next request as soon as their previous one finished, until the duration has passed or
the trace is used up. While the run lasts, the target's ``/signals`` (kvgate's per-pool JSON) is
polled once a second when it answers, and a one-line progress report is refreshed on stderr. The
process CPU time spent during the run is measured, so the report can say what one request cost the
generator and whether the generator itself was the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import aiohttp
import orjson

from kvgate.loadtest.client import Client, RequestRecord, RetryPolicy
from kvgate.loadtest.workload import Trace, TraceRequest

Send = Callable[[TraceRequest, bytes], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    model: str | None = None

    @property
    def base_url(self) -> str:
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True, slots=True)
class RunOptions:
    retry: RetryPolicy | None = None
    progress: TextIO | None = None
    signals_interval_s: float = 1.0
    connector_limit: int = 10_000
    retry_seed: int = 0


@dataclass(frozen=True, slots=True)
class SignalSample:
    at_s: float
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RunResult:
    target: Target
    model: str
    records: tuple[RequestRecord, ...]
    wall_s: float
    cpu_s: float
    signals: tuple[SignalSample, ...]
    started_epoch_s: float
    closed_loop: bool
    trace_exhausted: bool = False


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the target serves, from ``GET /v1/models``."""
    async with session.get(base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as response:
        response.raise_for_status()
        payload = orjson.loads(await response.read())
    models = payload.get("data") if isinstance(payload, dict) else None
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


def new_session(connector_limit: int = 10_000) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connector_limit, limit_per_host=connector_limit, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def run(target: Target, trace: Trace, options: RunOptions | None = None) -> RunResult:
    """Send ``trace`` to ``target`` and return every request's record."""
    options = options or RunOptions()
    async with new_session(options.connector_limit) as session:
        model = target.model or await discover_model(session, target.base_url)
        return await run_with_session(session, target, model, trace, options)


async def run_with_session(
    session: aiohttp.ClientSession, target: Target, model: str, trace: Trace, options: RunOptions
) -> RunResult:
    workload = trace.workload
    bodies = [request.body(model) for request in trace.requests]
    started_epoch_s = time.time()
    origin_s = time.perf_counter()
    client = Client(
        session,
        target.base_url,
        retry=options.retry,
        rng=random.Random(f"{trace.seed}:retry:{options.retry_seed}"),
        origin_s=origin_s,
    )
    records: list[RequestRecord] = []
    live = _Live(total_s=trace.duration_s, origin_s=origin_s)
    signals: list[SignalSample] = []
    background = [asyncio.create_task(_poll_signals(session, target.base_url, origin_s, options, signals))]
    if options.progress is not None:
        background.append(asyncio.create_task(_show_progress(live, options.progress)))
    cpu_start_s = time.process_time()

    async def one(request: TraceRequest, body: bytes) -> None:
        live.sent += 1
        record = await client.send(
            request.path,
            body,
            index=request.index,
            class_name=request.class_name,
            scheduled_at_s=request.at_s,
            timeout_s=workload.request_timeout_s,
        )
        records.append(record)
        live.observe(record)

    exhausted = False
    try:
        if workload.closed_loop:
            exhausted = await _closed_loop(trace, bodies, one, workload.concurrency or 1, origin_s)
        else:
            await _open_loop(trace, bodies, one, origin_s)
    finally:
        cpu_s = time.process_time() - cpu_start_s
        wall_s = time.perf_counter() - origin_s
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if options.progress is not None:
            options.progress.write("\n")
            options.progress.flush()
    records.sort(key=lambda r: r.index)
    return RunResult(
        target=target,
        model=model,
        records=tuple(records),
        wall_s=wall_s,
        cpu_s=cpu_s,
        signals=tuple(signals),
        started_epoch_s=started_epoch_s,
        closed_loop=workload.closed_loop,
        trace_exhausted=exhausted,
    )


async def _open_loop(trace: Trace, bodies: list[bytes], one: Send, origin_s: float) -> None:
    tasks: set[asyncio.Task[None]] = set()
    for request, body in zip(trace.requests, bodies, strict=True):
        delay_s = origin_s + (request.at_s or 0.0) - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        task = asyncio.create_task(one(request, body))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def _closed_loop(
    trace: Trace, bodies: list[bytes], one: Any, concurrency: int, origin_s: float
) -> bool:
    pending = iter(zip(trace.requests, bodies, strict=True))
    end_s = origin_s + trace.duration_s
    exhausted = False

    async def worker() -> None:
        nonlocal exhausted
        while time.perf_counter() < end_s:
            item = next(pending, None)
            if item is None:
                exhausted = True
                return
            await one(*item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return exhausted


class _Live:
    """Counters for the progress line; TTFT p95 over the most recent completions."""

    def __init__(self, total_s: float, origin_s: float) -> None:
        self.total_s = total_s
        self.origin_s = origin_s
        self.sent = 0
        self.done = 0
        self.errors = 0
        self.rejects = 0
        self.recent_ttft_s: deque[float] = deque(maxlen=500)
        self.sent_marks: deque[tuple[float, int]] = deque(maxlen=8)

    def observe(self, record: RequestRecord) -> None:
        self.done += 1
        if record.rejected:
            self.rejects += 1
        elif not record.ok:
            self.errors += 1
        if record.ttft_s is not None:
            self.recent_ttft_s.append(record.ttft_s)

    def line(self) -> str:
        now_s = time.perf_counter()
        self.sent_marks.append((now_s, self.sent))
        then_s, then_sent = self.sent_marks[0]
        rate_rps = (self.sent - then_sent) / (now_s - then_s) if now_s > then_s else 0.0
        ttft = sorted(self.recent_ttft_s)
        p95 = f"{ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))]:.3f}s" if ttft else "-"
        elapsed_s = now_s - self.origin_s
        filled = min(20, int(20 * elapsed_s / self.total_s)) if self.total_s > 0 else 20
        bar = "#" * filled + "." * (20 - filled)
        return (
            f"[{bar}] {elapsed_s:6.1f}/{self.total_s:.0f}s sent {self.sent} done {self.done} "
            f"rate {rate_rps:5.1f}/s err {self.errors} rej {self.rejects} ttft p95 {p95}"
        )


async def _show_progress(live: _Live, stream: TextIO) -> None:
    while True:
        stream.write("\r" + live.line() + "\033[K")
        stream.flush()
        await asyncio.sleep(0.5)


async def _poll_signals(
    session: aiohttp.ClientSession,
    base_url: str,
    origin_s: float,
    options: RunOptions,
    out: list[SignalSample],
) -> None:
    """Polls ``/signals`` while it answers JSON; three failures in a row mean it is not kvgate."""
    failures = 0
    timeout = aiohttp.ClientTimeout(total=max(options.signals_interval_s, 0.5))
    while failures < 3:
        try:
            async with session.get(base_url + "/signals", timeout=timeout) as response:
                payload = orjson.loads(await response.read()) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            payload = None
        if isinstance(payload, dict):
            failures = 0
            out.append(SignalSample(time.perf_counter() - origin_s, payload))
        else:
            failures += 1
        await asyncio.sleep(options.signals_interval_s)
