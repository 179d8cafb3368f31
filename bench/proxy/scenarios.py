"""The end-to-end scenarios: gateway CPU per request and the latency it adds, against direct calls.

Three processes: the zero-delay backends (their CPU not counted), the gateway (``kvgate serve``, its
CPU read from ``/proc`` via psutil) and this driver. Each scenario runs direct and through the
gateway in the same run, warming each side first: non-streaming requests, 50-chunk streams
back-to-back, 50-chunk streams paced ~5 ms apart, non-streaming requests at a fixed 1000 per second
(open loop: added latency at a load the machine carries) and one at a time (serial).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

from bench.harness.gateway import start_gateway
from bench.harness.processes import children
from bench.proxy.load import Result, drive, drive_at_rate, drive_spread
from bench.proxy.profile import summarize_profile
from bench.proxy.report import ScenarioFigures
from bench.proxy.stage import (
    CHAT_PATH,
    CHUNKS,
    JSON_HEADERS,
    MODEL,
    NON_STREAM_BODY,
    PACE_HEADER,
    config,
    start_backends,
)
from kvgate.sim.ports import free_ports

SCENARIOS: list[tuple[str, bool, float]] = [
    ("non-stream", False, 0.0),
    ("stream", True, 0.0),
    ("stream paced", True, 5.0),
]
"""(name, stream, pace between chunks in ms); streams carry ``CHUNKS`` chunks."""
OPEN_LOOP_RATE = 1000.0
"""Requests per second of the open-loop scenario: about a third of what the gateway carries at
concurrency 64 on this machine, so the latency added is the gateway's, not CPU queueing's."""

Row = tuple[str, int, float, Result, Result]
"""(label, requests, gateway CPU ms per request, direct, through the gateway)."""


async def run(
    concurrency: int,
    requests: int,
    streams: int,
    out: Path,
    only: set[str] | None = None,
    profile_out: str | None = None,
) -> tuple[list[ScenarioFigures], list[tuple[str, float]]]:
    """Each scenario's figures (printed as a table), and where the gateway's samples went when
    ``profile_out`` names py-spy's output."""
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    profiler = [py_spy, "record", "-o", profile_out, "-f", "raw", "-r", "1000", "--"] if profile_out else []
    with children() as started:
        backend_ports = start_backends(started)
        gateway = start_gateway(
            started, config(backend_ports, free_ports()), out / "gateway.yaml", wrapper=profiler
        )
        async with aiohttp.ClientSession() as session:
            await gateway.ready(session)
        gateway_cpu = psutil.Process(gateway.process.pid)
        if profile_out:
            gateway_cpu = gateway_cpu.children()[0]
        rows: list[Row] = []
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
                direct_urls = [f"http://127.0.0.1:{p}{CHAT_PATH}" for p in backend_ports]
                via_url = gateway.url + CHAT_PATH
                await drive(session, direct_urls[0], body, headers, concurrency, concurrency)
                direct = await drive_spread(session, direct_urls, body, headers, total, concurrency)
                await drive(session, via_url, body, headers, concurrency, concurrency)
                before = gateway_cpu.cpu_times()
                proxied = await drive(session, via_url, body, headers, total, concurrency)
                cpu_ms = _cpu_ms_since(gateway_cpu, before)
                label = f"{name} {CHUNKS} chunks{f' / {pace_ms:g} ms' if pace_ms else ''}" if stream else name
                rows.append((label, total, cpu_ms / total, direct, proxied))
            if not only or "open loop" in only:
                rows.append(
                    await _open_loop_latency(session, backend_ports, gateway.url, gateway_cpu, requests // 2)
                )
            if not only or "serial" in only:
                rows.append(
                    await _serial_latency(session, backend_ports[0], gateway.url, gateway_cpu, requests // 8)
                )
        print_table(rows, concurrency)
        profile: list[tuple[str, float]] = []
        if profile_out:
            gateway_cpu.terminate()
            gateway.process.wait(timeout=60)
            print(f"\nwhere the gateway's samples go (py-spy, inclusive; stacks in {profile_out}):")
            profile = summarize_profile(profile_out)
            for function, share in profile:
                print(f"{share:6.1%}  {function}")
        return [_figures(*row) for row in rows], profile


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
) -> Row:
    """One request at a time: the gateway's added latency without CPU queueing in the way."""
    url = f"http://127.0.0.1:{backend_port}{CHAT_PATH}"
    direct = await drive(session, url, NON_STREAM_BODY, JSON_HEADERS, total, 1)
    before = gateway_cpu.cpu_times()
    proxied = await drive(session, gateway_url + CHAT_PATH, NON_STREAM_BODY, JSON_HEADERS, total, 1)
    return ("non-stream serial (c=1)", total, _cpu_ms_since(gateway_cpu, before) / total, direct, proxied)


async def _open_loop_latency(
    session: aiohttp.ClientSession,
    backend_ports: list[int],
    gateway_url: str,
    gateway_cpu: psutil.Process,
    total: int,
) -> Row:
    direct_urls = [f"http://127.0.0.1:{port}{CHAT_PATH}" for port in backend_ports]
    direct = await drive_at_rate(session, direct_urls, NON_STREAM_BODY, JSON_HEADERS, total, OPEN_LOOP_RATE)
    before = gateway_cpu.cpu_times()
    via_urls = [gateway_url + CHAT_PATH]
    proxied = await drive_at_rate(session, via_urls, NON_STREAM_BODY, JSON_HEADERS, total, OPEN_LOOP_RATE)
    label = f"non-stream {OPEN_LOOP_RATE:g}/s open loop"
    return (label, total, _cpu_ms_since(gateway_cpu, before) / total, direct, proxied)


def _cpu_ms_since(process: psutil.Process, before: Any) -> float:
    """User + system milliseconds ``process`` spent since ``before`` (its earlier ``cpu_times()``)."""
    after = process.cpu_times()
    return float((after.user - before.user) + (after.system - before.system)) * 1000


def print_table(rows: list[Row], concurrency: int) -> None:
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
