"""Chaos benchmark: hostile clients and broken dependencies against real processes; invariants checked.

Each scenario starts its own ``kvgate sim`` replicas (real time) and ``kvgate serve`` gateway(s) on
loopback, each logging to a file under ``--out``, does its damage, then checks:

- **drained**: every work gauge on ``/metrics`` (queued requests and prompt tokens, pending prompt
  tokens, resident sequences, remaining decode tokens, the estimated KV occupancy) reads 0 again;
- **no tracebacks** in the gateway's log;
- **nothing lost**: every client got a complete answer, an OpenAI-shaped error, or a stream that
  ended with an error event and ``[DONE]`` (clients that hung up on purpose are counted apart);
- **still serving**: a few ordinary requests afterwards complete;

plus its own checks (below), and records figures: requests and outcomes, statuses, time to drain,
the gateway's RSS and open descriptors before and after (psutil), and the work gauges over time.

Scenarios: ``storm_streaming`` (N clients hang up at once mid-stream), ``storm_queued`` (two waves of
N clients hang up while queued in front of a small fleet), ``slow_readers`` (streams whose clients
stop reading: their reservations must be released while the sockets stay open), ``slowloris``
(partial headers and slow bodies, more connections than the gateway has descriptors: each must be
closed by a timeout and ordinary requests answered meanwhile), ``replica_kill`` (a replica killed
mid-stream through the simulator's control API), ``redis_restart`` (two gateways sharing a private
``redis-server`` that is stopped and started again: both keep serving, the failure is visible).

Settings that other work is adding (``server.header_timeout_s`` and friends,
``coordination.fail_mode``) are written into the generated config; a key today's gateway does not
know is dropped, named in the output, and the check that needs it fails with that reason.
Bounded in count and time, loopback only, stops by itself. Not a test.

    python -m bench.bench_chaos [--quick] [--out DIR] [--only storm_queued,slowloris] [--clients 500]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.bench_report import machine, run_date, table, write_report
from bench.chaos_kit import (
    COMPLETE,
    ERROR_ANSWER,
    KV_ESTIMATE,
    LEFT,
    LOST,
    MODEL,
    STREAM_ERROR,
    Outcome,
    Processes,
    RawResult,
    StreamClient,
    completion_body,
    footprint,
    read_metrics,
    slow_reader_socket,
    tracebacks,
    trickle,
    wait_drained,
    work_of,
)
from kvgate.sim.ports import free_ports

TIMEOUTS = {
    "header_timeout_s": 5.0,
    "body_timeout_s": 5.0,
    "send_timeout_s": 5.0,
    "max_header_bytes": 65536,
    "max_headers": 100,
}
"""Edge limits written into every generated config (server section); dropped when unknown today."""
SLACK_S = 5.0
"""Allowance on top of a configured timeout before a check calls it broken (the machine is shared)."""


@dataclass(slots=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class Scenario:
    name: str
    title: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[float, str]] = field(default_factory=list)
    timeline: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    started_s: float = field(default_factory=time.monotonic)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))
        print(f"  [{'PASS' if ok else 'FAIL'}] {self.name}: {name} — {detail}", flush=True)

    def event(self, what: str) -> None:
        at_s = round(time.monotonic() - self.started_s, 2)
        self.events.append((at_s, what))
        print(f"  [{self.name} +{at_s:6.1f}s] {what}", flush=True)


@dataclass(slots=True)
class Run:
    args: argparse.Namespace
    out: Path
    session: aiohttp.ClientSession
    unknown_keys: list[str] = field(default_factory=list)


def gateway_data(
    urls: list[str], kv_capacity_tokens: int = 450000, max_sequences: int | None = None, **sections: Any
) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": "default", "replicas": urls, "kv_capacity_tokens": kv_capacity_tokens}
    if max_sequences is not None:
        pool["max_sequences"] = max_sequences
    server = {"timeouts": {"first_byte_s": 60.0, "idle_s": 30.0}, **TIMEOUTS, **sections.pop("server", {})}
    return {
        "server": server,
        "health": {"interval_s": 0.5, "timeout_s": 1.0},
        "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
        "pools": [pool],
        **sections,
    }


async def sample_gauges(run: Run, scenario: Scenario, url: str) -> None:
    """Record the work gauges every 0.25 s; print them every 2 s (live progress)."""
    last_print = 0.0
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            work = work_of(await read_metrics(run.session, url))
            now = time.monotonic() - scenario.started_s
            scenario.timeline.append((round(now, 2), work))
            if now - last_print >= 2.0:
                last_print = now
                shown = ", ".join(f"{k.removeprefix('kvgate_')}={v:g}" for k, v in work.items())
                print(f"    [{scenario.name} +{now:6.1f}s] {shown}", flush=True)
        await asyncio.sleep(0.25)


async def bounded(run: Run, client: StreamClient, timeout_s: float = 10.0) -> Outcome:
    """The client's outcome; one with no answer within ``timeout_s`` hangs up and counts as lost."""
    timer = asyncio.get_running_loop().call_later(timeout_s, client.leave.set)
    outcome = await client.run(run.session)
    timer.cancel()
    if outcome.kind == LEFT:
        outcome.kind, outcome.detail = LOST, f"no answer within {timeout_s:g} s"
    return outcome


async def probe(run: Run, url: str, count: int = 5) -> list[Outcome]:
    """Ordinary short requests, one after the other, until one fails: is the gateway still serving?"""
    outcomes: list[Outcome] = []
    while len(outcomes) < count and all(o.kind == COMPLETE for o in outcomes):
        outcomes.append(await bounded(run, StreamClient(url + "/v1/completions", completion_body(8))))
    return outcomes


def summarise(scenario: Scenario, outcomes: list[Outcome], prefix: str = "") -> None:
    kinds = Counter(o.kind for o in outcomes)
    statuses = Counter(str(o.status) for o in outcomes)
    scenario.figures[prefix + "requests"] = len(outcomes)
    scenario.figures[prefix + "outcomes"] = dict(kinds)
    scenario.figures[prefix + "statuses"] = dict(statuses)
    lost = [o for o in outcomes if o.kind == LOST]
    details = Counter(o.detail[:90] for o in lost).most_common(3)
    scenario.check(
        f"{prefix}nothing lost",
        not lost,
        f"{len(lost)} of {len(outcomes)} lost" + (f": {details}" if lost else f"; outcomes {dict(kinds)}"),
    )


async def finish(
    run: Run, scenario: Scenario, procs: Processes, url: str, proc: subprocess.Popen[bytes], log: str
) -> None:
    """The checks every scenario ends with: drained, no tracebacks, still serving, footprint."""
    drain_s, work = await wait_drained(run.session, url, run.args.drain_bound_s)
    scenario.figures["drain_s"] = None if drain_s is None else round(drain_s, 2)
    scenario.check(
        "work gauges back to 0",
        drain_s is not None,
        f"drained in {drain_s:.2f} s" if drain_s is not None else f"after {run.args.drain_bound_s} s: {work}",
    )
    served = await probe(run, url)
    scenario.check(
        "still serving",
        all(o.kind == COMPLETE for o in served),
        f"{sum(o.kind == COMPLETE for o in served)}/{len(served)} ordinary requests complete "
        "(probing stops at the first failure); "
        f"{Counter(o.detail[:90] for o in served if o.kind != COMPLETE).most_common(2)}",
    )
    rss_mib, fds = footprint(proc)
    scenario.figures["rss_after_mib"] = round(rss_mib, 1)
    scenario.figures["fds_after"] = fds
    found = tracebacks(procs.log_dir / log)
    scenario.figures["tracebacks"] = len(found)
    scenario.check("no tracebacks", not found, f"{len(found)} in {log}: {Counter(found).most_common(3)}")


async def with_gateway(
    run: Run,
    scenario: Scenario,
    replicas: int,
    data: Callable[[list[str]], dict[str, Any]],
    body: Callable[[Run, Scenario, Processes, list[str], str, subprocess.Popen[bytes]], Awaitable[None]],
    nofile: int | None = None,
) -> None:
    """Start a fleet and one gateway, record the footprint, run ``body``, finish with the shared checks."""
    log_dir = run.out / "logs"
    procs = Processes(log_dir)
    sampler: asyncio.Task[None] | None = None
    try:
        urls = await procs.sim(run.session, scenario.name, replicas)
        url, proc = await procs.gateway(run.session, scenario.name, data(urls), nofile)
        run.unknown_keys += [k for k in procs.unknown_keys if k not in run.unknown_keys]
        rss_mib, fds = footprint(proc)
        scenario.figures["rss_before_mib"] = round(rss_mib, 1)
        scenario.figures["fds_before"] = fds
        sampler = asyncio.create_task(sample_gauges(run, scenario, url))
        await body(run, scenario, procs, urls, url, proc)
        await finish(run, scenario, procs, url, proc, f"{scenario.name}.log")
    finally:
        if sampler is not None:
            sampler.cancel()
        procs.stop_all()


# -- scenarios -------------------------------------------------------------------------------------


async def storm_streaming(run: Run) -> Scenario:
    n = run.args.clients
    scenario = Scenario("storm_streaming", f"{n} clients hang up at once mid-stream")

    async def body(
        run: Run, s: Scenario, procs: Processes, urls: list[str], url: str, proc: subprocess.Popen[bytes]
    ) -> None:
        clients = [StreamClient(url + "/v1/completions", completion_body(1500)) for _ in range(n)]
        tasks = [asyncio.create_task(c.run(run.session)) for c in clients]
        s.event(f"{n} streams started")
        deadline = time.monotonic() + 20
        while (
            time.monotonic() < deadline and sum(c.outcome.first_chunk_at_s is not None for c in clients) < n
        ):
            await asyncio.sleep(0.2)
        streaming = sum(c.outcome.first_chunk_at_s is not None for c in clients)
        s.figures["streaming_at_storm"] = streaming
        for c in clients:
            c.leave.set()
        s.event(f"storm: every client hangs up ({streaming} were streaming)")
        summarise(s, list(await asyncio.gather(*tasks)))
        running = await replicas_running(run, urls)
        s.check(
            "replicas stop generating for clients that left",
            running == 0,
            f"{running:g} sequences still running on the replicas {run.args.drain_bound_s} s after",
        )

    await with_gateway(run, scenario, 2, gateway_data, body)
    return scenario


async def replicas_running(run: Run, urls: list[str]) -> float:
    """Sequences the replicas still run or hold waiting, once they have had time to settle."""
    end = time.monotonic() + run.args.drain_bound_s
    while True:
        total = 0.0
        for url in urls:
            metrics = await read_metrics(run.session, url)
            total += sum(
                v
                for k, v in metrics.items()
                if k.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
            )
        if total == 0 or time.monotonic() > end:
            return total
        await asyncio.sleep(0.2)


async def storm_queued(run: Run) -> Scenario:
    n = run.args.clients
    scenario = Scenario("storm_queued", f"two waves of {n} clients hang up while queued (small fleet)")

    def data(urls: list[str]) -> dict[str, Any]:
        return gateway_data(urls, kv_capacity_tokens=1500, admission={"max_queue_wait_s": 600.0})

    async def body(
        run: Run, s: Scenario, procs: Processes, urls: list[str], url: str, proc: subprocess.Popen[bytes]
    ) -> None:
        clients: list[StreamClient] = []
        tasks: list[asyncio.Task[Outcome]] = []
        for wave in (1, 2):
            # Short streams: capacity frees many times a second, so the admission pump is
            # dispatching queued requests while their clients hang up (the race of issue 12, item 2).
            wave_clients = [StreamClient(url + "/v1/completions", completion_body(40)) for _ in range(n)]
            clients += wave_clients
            tasks += [asyncio.create_task(c.run(run.session)) for c in wave_clients]
            s.event(f"wave {wave}: {n} clients sent")
            deadline = time.monotonic() + 20
            queued = 0.0
            while time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                queued = (await read_metrics(run.session, url)).get("kvgate_queued_requests", 0.0)
                if queued >= 0.5 * n:
                    break
            s.figures[f"wave{wave}_queued_at_storm"] = queued
            s.event(
                f"wave {wave}: storm, the waiting clients hang up in 10 bursts over 2 s ({queued:g} queued)"
            )
            for _ in range(10):
                waiting = [c for c in wave_clients if c.outcome.headers_at_s is None and not c.leave.is_set()]
                for c in waiting[: max(1, len(waiting) // 3)]:
                    c.leave.set()
                await asyncio.sleep(0.2)
            for c in wave_clients:
                if c.outcome.headers_at_s is None:
                    c.leave.set()
        s.event("waiting for the admitted streams to finish")
        await asyncio.wait(tasks, timeout=120)
        for c in clients:
            c.leave.set()
        summarise(s, list(await asyncio.gather(*tasks)))
        s.figures["admitted"] = sum(c.outcome.headers_at_s is not None for c in clients)

    await with_gateway(run, scenario, 2, data, body)
    return scenario


async def slow_readers(run: Run) -> Scenario:
    k = run.args.slow_readers
    hold_s = run.args.hold_s
    scenario = Scenario("slow_readers", f"{k} streaming clients stop reading for {hold_s:g} s")

    async def body(
        run: Run, s: Scenario, procs: Processes, urls: list[str], url: str, proc: subprocess.Popen[bytes]
    ) -> None:
        port = int(url.rsplit(":", 1)[1])
        socks = [slow_reader_socket(port, completion_body(6000)) for _ in range(k)]
        s.event(f"{k} streams sent; their clients never read")
        known = "server.send_timeout_s" not in run.unknown_keys
        released_at: float | None = None
        remaining_before = 0.0
        """Decode tokens the streams still had to generate at the last reading before the release:
        above 0, the release came from the send timeout, not from the generations finishing."""
        peak_kv = 0.0
        try:
            end = time.monotonic() + hold_s
            start = time.monotonic()
            while time.monotonic() < end:
                await asyncio.sleep(0.5)
                work = work_of(await read_metrics(run.session, url))
                peak_kv = max(peak_kv, work[KV_ESTIMATE])
                if released_at is not None:
                    continue
                if work["kvgate_resident_sequences"] == 0 and time.monotonic() > start + 1:
                    released_at = time.monotonic() - start
                else:
                    remaining_before = work["kvgate_remaining_decode_tokens"]
            held = work_of(await read_metrics(run.session, url))
            s.figures["peak_kv_estimate_ratio"] = round(peak_kv, 4)
            s.figures["held_after_hold"] = held
            ok = released_at is not None and remaining_before > 0
            reason = "" if known else " (server.send_timeout_s unknown today: no send timeout)"
            s.check(
                "reservations of non-reading clients released while their sockets stay open, before "
                "their generations would have ended",
                ok,
                (
                    f"released after {released_at:.1f} s (the buffers between gateway and client filled, "
                    f"then send_timeout_s {TIMEOUTS['send_timeout_s']:g} s) with {remaining_before:g} "
                    "decode tokens still to generate"
                    if released_at is not None
                    else f"after {hold_s:g} s still held: {held['kvgate_resident_sequences']:g} sequences, "
                    f"KV estimate {held[KV_ESTIMATE]:.1%}{reason}"
                ),
            )
        finally:
            for sock in socks:
                sock.close()
            s.event("slow readers closed their sockets")

    await with_gateway(run, scenario, 2, gateway_data, body)
    return scenario


async def slowloris(run: Run) -> Scenario:
    loris, slow_bodies, nofile = run.args.slowloris, run.args.slow_bodies, run.args.nofile
    hold_s = run.args.hold_s
    scenario = Scenario(
        "slowloris",
        f"{loris} partial-header and {slow_bodies} slow-body connections for {hold_s:g} s "
        f"against a gateway limited to {nofile} descriptors",
    )

    def data(urls: list[str]) -> dict[str, Any]:
        return gateway_data(urls, server={"max_connections": nofile - 128})

    async def body(
        run: Run, s: Scenario, procs: Processes, urls: list[str], url: str, proc: subprocess.Popen[bytes]
    ) -> None:
        port = int(url.rsplit(":", 1)[1])
        started = time.monotonic()
        partial = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: "
        slow = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100000\r\n\r\n{"
        attack = [
            asyncio.create_task(trickle(port, partial, b"a", 2.0, hold_s, started)) for _ in range(loris)
        ]
        attack += [
            asyncio.create_task(trickle(port, slow, b" ", 2.0, hold_s, started)) for _ in range(slow_bodies)
        ]
        s.event(f"{loris + slow_bodies} hostile connections opening")
        probes: list[Outcome] = []
        while time.monotonic() - started < hold_s:
            await asyncio.sleep(1.0)
            client = StreamClient(url + "/v1/completions", completion_body(4, stream=False))
            probes.append(await bounded(run, client))
        s.figures["fds_during_attack"] = footprint(proc)[1]
        results: list[RawResult] = list(await asyncio.gather(*attack))
        s.event("attack over")
        for label, group, key in (
            ("slowloris", results[:loris], "header_timeout_s"),
            ("slow bodies", results[loris:], "body_timeout_s"),
        ):
            limit_s = TIMEOUTS[key] + SLACK_S
            closed = [r for r in group if r.closed_at_s is not None and r.closed_at_s <= limit_s]
            answers = Counter(r.first_bytes[:12].decode(errors="replace") for r in group if r.first_bytes)
            s.figures[f"{label}_closed_in_time"] = len(closed)
            s.figures[f"{label}_ends"] = dict(Counter(r.how for r in group))
            s.figures[f"{label}_answers"] = dict(answers)
            note = "" if f"server.{key}" not in run.unknown_keys else f" (server.{key} unknown today)"
            s.check(
                f"{label} closed within {key} + {SLACK_S:g} s",
                len(closed) == len(group),
                f"{len(closed)}/{len(group)} closed by {limit_s:g} s, "
                f"{len(group) - sum(r.closed_at_s is not None for r in group)} still open at {hold_s:g} s"
                f"{note}",
            )
        answered = [p for p in probes if p.kind == COMPLETE or (p.kind == ERROR_ANSWER and p.status == 503)]
        s.figures["probes_during_attack"] = dict(Counter(f"{p.kind}:{p.status}" for p in probes))
        s.check(
            "ordinary requests served during the attack",
            len(answered) == len(probes),
            f"{len(answered)}/{len(probes)} served (200) or refused by a connection cap (503); others: "
            f"{Counter(p.detail[:90] for p in probes if p not in answered).most_common(2)}",
        )
        await asyncio.sleep(1.0)
        fds = footprint(proc)[1]
        s.check(
            "descriptors back near the start once attackers leave",
            fds <= s.figures["fds_before"] + 20,
            f"{s.figures['fds_before']} before, {s.figures['fds_during_attack']} during, {fds} after",
        )

    await with_gateway(run, scenario, 1, data, body, nofile=nofile)
    return scenario


async def replica_kill(run: Run) -> Scenario:
    k = run.args.kill_streams
    scenario = Scenario("replica_kill", f"a replica killed under {k} streams")

    async def body(
        run: Run, s: Scenario, procs: Processes, urls: list[str], url: str, proc: subprocess.Popen[bytes]
    ) -> None:
        control = f"http://127.0.0.1:{int(urls[-1].rsplit(':', 1)[1]) + 1}"  # see Processes.sim
        clients = [StreamClient(url + "/v1/completions", completion_body(800)) for _ in range(k)]
        tasks = [asyncio.create_task(c.run(run.session)) for c in clients]
        deadline = time.monotonic() + 20
        while (
            time.monotonic() < deadline and sum(c.outcome.first_chunk_at_s is not None for c in clients) < k
        ):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        async with run.session.post(control + "/replicas/0/kill") as response:
            s.event(f"replica 0 killed (control API answered {response.status})")
        await asyncio.wait(tasks, timeout=120)
        for c in clients:
            c.leave.set()
        outcomes = list(await asyncio.gather(*tasks))
        summarise(s, outcomes)
        s.figures["stream_errors"] = sum(o.kind == STREAM_ERROR for o in outcomes)

    await with_gateway(run, scenario, 2, gateway_data, body)
    return scenario


async def redis_restart(run: Run) -> Scenario:
    down_s = run.args.redis_down_s
    scenario = Scenario("redis_restart", f"Redis stopped for {down_s:g} s under two gateways, then restarted")
    procs = Processes(run.out / "logs")
    stop = asyncio.Event()
    outcomes: list[Outcome] = []
    health: Counter[str] = Counter()

    async def load(url: str) -> None:
        while not stop.is_set():
            client = StreamClient(url + "/v1/completions", completion_body(30))
            outcomes.append(await client.run(run.session))

    async def watch(urls: list[str]) -> None:
        while not stop.is_set():
            for url in urls:
                try:
                    async with run.session.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=3)) as r:
                        health[f"{r.status}"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    health["no answer"] += 1
            await asyncio.sleep(0.5)

    async def coordination_up(url: str) -> float | None:
        metrics = await read_metrics(run.session, url)
        values = [v for k, v in metrics.items() if k.startswith("kvgate_coordination_up{")]
        return min(values) if values else None

    try:
        redis_port = free_ports()
        redis = procs.redis("redis_restart", redis_port)
        await asyncio.sleep(0.5)
        urls = await procs.sim(run.session, scenario.name, 2)
        coordination = {
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "interval_s": 0.5,
            "lease_s": 3.0,
            "namespace": f"chaos-{os.getpid()}",
            "fail_mode": "open",
        }
        gateways = [
            await procs.gateway(
                run.session, f"redis_restart-{name}", gateway_data(urls, coordination=coordination)
            )
            for name in ("a", "b")
        ]
        run.unknown_keys += [k for k in procs.unknown_keys if k not in run.unknown_keys]
        gw_urls = [u for u, _ in gateways]
        scenario.figures["rss_before_mib"] = [round(footprint(p)[0], 1) for _, p in gateways]
        scenario.figures["fds_before"] = [footprint(p)[1] for _, p in gateways]
        sampler = asyncio.create_task(sample_gauges(run, scenario, gw_urls[0]))
        workers = [asyncio.create_task(load(u)) for u in gw_urls for _ in range(run.args.redis_workers)]
        watcher = asyncio.create_task(watch(gw_urls))
        scenario.event("two gateways under load, sharing Redis")
        await asyncio.sleep(3.0)
        before_up = [await coordination_up(u) for u in gw_urls]
        logs = [procs.log_dir / f"redis_restart-{name}.log" for name in ("a", "b")]
        offsets = [log.stat().st_size for log in logs]
        Processes.stop(redis)
        scenario.event("Redis stopped")
        await asyncio.sleep(down_s)
        during_up = [await coordination_up(u) for u in gw_urls]
        redis = procs.redis("redis_restart-again", redis_port)
        scenario.event("Redis started again (empty)")
        await asyncio.sleep(down_s)
        after_up = [await coordination_up(u) for u in gw_urls]
        stop.set()
        await asyncio.gather(*workers, watcher)
        sampler.cancel()
        scenario.event("load stopped")
        summarise(scenario, outcomes)
        scenario.figures["healthz"] = dict(health)
        scenario.check(
            "both gateways answer /healthz throughout",
            set(health) == {"200"},
            f"/healthz answers {dict(health)}",
        )
        scenario.figures["coordination_up"] = {"before": before_up, "down": during_up, "after": after_up}
        exported = all(v is not None for v in before_up + during_up + after_up)
        scenario.check(
            "kvgate_coordination_up shows the outage (1, then 0, then 1)",
            exported and before_up == [1.0, 1.0] and during_up == [0.0, 0.0] and after_up == [1.0, 1.0],
            f"before {before_up}, down {during_up}, after {after_up}"
            + ("" if exported else " (metric not exported today)"),
        )
        for (url, proc), name, log, offset in zip(gateways, ("a", "b"), logs, offsets, strict=True):
            text = log.read_bytes()[offset:].decode(errors="replace").lower()
            mentions = sum(1 for line in text.splitlines() if "redis" in line or "coordination" in line)
            scenario.check(
                f"gateway {name} logs the Redis failure",
                mentions > 0,
                f"{mentions} log lines from the outage on",
            )
            drain_s, work = await wait_drained(run.session, url, run.args.drain_bound_s)
            scenario.check(
                f"gateway {name}: work gauges back to 0",
                drain_s is not None,
                f"drained in {drain_s:.2f} s" if drain_s is not None else f"still {work}",
            )
            found = tracebacks(log)
            scenario.check(
                f"gateway {name}: no tracebacks", not found, f"{len(found)}: {Counter(found).most_common(3)}"
            )
            rss_mib, fds = footprint(proc)
            scenario.figures[f"rss_after_mib_{name}"] = round(rss_mib, 1)
            scenario.figures[f"fds_after_{name}"] = fds
    finally:
        stop.set()
        procs.stop_all()
    return scenario


SCENARIOS: dict[str, Callable[[Run], Awaitable[Scenario]]] = {
    "storm_streaming": storm_streaming,
    "storm_queued": storm_queued,
    "slow_readers": slow_readers,
    "slowloris": slowloris,
    "replica_kill": replica_kill,
    "redis_restart": redis_restart,
}


# -- report ----------------------------------------------------------------------------------------


def write_results(run: Run, scenarios: list[Scenario], wall_s: float) -> None:
    failed = sum(not c.ok for s in scenarios for c in s.checks)
    total = sum(len(s.checks) for s in scenarios)
    header = {
        "date": run_date(),
        "mode": "quick" if run.args.quick else "full",
        "machine": machine(),
        "wall_s": round(wall_s, 1),
        "checks_failed": failed,
        "checks_total": total,
        "config_keys_unknown_today": run.unknown_keys,
    }
    doc = {**header, "scenarios": [asdict(s) for s in scenarios]}
    (run.out / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    lines = [
        "# Chaos benchmark results",
        "",
        f"{header['date']} · {header['mode']} run · {header['machine']} · {header['wall_s']} s · "
        f"**{total - failed}/{total} checks pass**",
        "",
        "Config keys unknown to this gateway (dropped; their checks fail): "
        + (", ".join(f"`{k}`" for k in run.unknown_keys) or "none"),
        "",
    ]
    for s in scenarios:
        lines += [f"## {s.name}: {s.title}", ""]
        lines += table(
            ("check", "result", "detail"),
            [(c.name, "PASS" if c.ok else "**FAIL**", c.detail) for c in s.checks],
        )
        lines.append("")
        lines += table(("figure", "value"), [(k, json.dumps(v, default=str)) for k, v in s.figures.items()])
        if s.events:
            lines += ["", "Events: " + "; ".join(f"+{t:g} s {what}" for t, what in s.events)]
        lines.append("")
    if any(s.timeline for s in scenarios):
        plot(run.out / "chaos_gauges.png", scenarios)
        lines += ["![work gauges over time](chaos_gauges.png)", ""]
    write_report(run.out / "results.md", lines)


def plot(path: Path, scenarios: list[Scenario]) -> None:
    """Resident sequences, queued requests and KV estimate (%) over each scenario, events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in scenarios if s.timeline]
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.6 * len(shown)), squeeze=False)
    for ax, s in zip(axes[:, 0], shown, strict=True):
        times = [t for t, _ in s.timeline]
        ax.plot(times, [w["kvgate_resident_sequences"] for _, w in s.timeline], label="resident sequences")
        ax.plot(times, [w["kvgate_queued_requests"] for _, w in s.timeline], label="queued requests")
        ax.plot(times, [100 * w[KV_ESTIMATE] for _, w in s.timeline], label="KV estimate %", linestyle=":")
        for at_s, what in s.events:
            ax.axvline(at_s, color="grey", linewidth=0.8)
            ax.annotate(what[:28], (at_s, ax.get_ylim()[1] * 0.9), fontsize=6, rotation=90, va="top")
        ax.set_title(s.name, fontsize=9)
        ax.set_xlabel("s")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts and holds: about 1-2 minutes")
    parser.add_argument(
        "--out", default="bench-out/chaos", help="results directory (default bench-out/chaos)"
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--clients", type=int, help="clients per storm (default 500; quick 200)")
    parser.add_argument("--slow-readers", type=int, default=20, help="non-reading streams (default 20)")
    parser.add_argument("--slowloris", type=int, help="partial-header connections (default 600; quick 300)")
    parser.add_argument("--slow-bodies", type=int, help="slow-body connections (default 500; quick 250)")
    parser.add_argument(
        "--nofile", type=int, help="the slowloris gateway's descriptor limit (1024; quick 512)"
    )
    parser.add_argument("--hold-s", type=float, help="how long slow clients hold on (default 25; quick 12)")
    parser.add_argument(
        "--kill-streams", type=int, default=40, help="streams when a replica dies (default 40)"
    )
    parser.add_argument("--redis-down-s", type=float, help="seconds Redis is down (default 8; quick 4)")
    parser.add_argument(
        "--redis-workers", type=int, default=6, help="looping clients per gateway (default 6)"
    )
    parser.add_argument(
        "--drain-bound-s", type=float, default=20.0, help="longest wait for gauges to reach 0"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "clients": (500, 200),
        "slowloris": (600, 300),
        "slow_bodies": (500, 250),
        "nofile": (1024, 512),
        "hold_s": (25.0, 12.0),
        "redis_down_s": (8.0, 4.0),
    }
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {unknown}; choose from {list(SCENARIOS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=180, sock_connect=10)
    started = time.monotonic()
    scenarios: list[Scenario] = []
    print(f"chaos benchmark ({'quick' if args.quick else 'full'}): {', '.join(names)}; results in {out}/")
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = Run(args, out, session)
        for name in names:
            print(f"== {name}", flush=True)
            try:
                scenarios.append(await SCENARIOS[name](run))
            except Exception as exc:
                broken = Scenario(name, "the scenario itself failed")
                broken.check("scenario ran", False, f"{type(exc).__name__}: {exc}")
                scenarios.append(broken)
    write_results(run, scenarios, time.monotonic() - started)
    failed = [(s.name, c.name) for s in scenarios for c in s.checks if not c.ok]
    print(f"\n{len(failed)} check(s) failed of {sum(len(s.checks) for s in scenarios)}:")
    for scenario_name, check in failed:
        print(f"  FAIL {scenario_name}: {check}")
    if run.unknown_keys:
        print(f"config keys unknown to this gateway (dropped): {', '.join(run.unknown_keys)}")
    print(f"results: {out / 'results.md'}, {out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main()))
