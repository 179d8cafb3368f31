"""What every chaos scenario shares: its record (checks, figures, events, the gauges over time), the
gateway it attacks, and the checks it ends with (drained, no tracebacks, still serving, footprint)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.chaos.clients import COMPLETE, LEFT, LOST, MODEL, Outcome, StreamClient, completion_body
from bench.chaos.gauges import read_work, wait_drained
from bench.chaos.stage import Stage, footprint, tracebacks
from bench.harness.gateway_config import Model, Pool, gateway_config

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


@dataclass(frozen=True, slots=True)
class Setting:
    """What a scenario's body attacks: the fleet (its control API too) and one gateway in front."""

    stage: Stage
    urls: list[str]
    control_url: str
    url: str
    proc: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def gateway_data(
    urls: list[str], kv_capacity_tokens: int = 450000, max_sequences: int | None = None, **sections: Any
) -> dict[str, Any]:
    server = {"timeouts": {"first_byte_s": 60.0, "idle_s": 30.0}, **TIMEOUTS, **sections.pop("server", {})}
    return gateway_config(
        Pool(urls, kv_capacity_tokens=kv_capacity_tokens, max_sequences=max_sequences),
        model=Model(MODEL),
        server=server,
        health={"interval_s": 0.5, "timeout_s": 1.0},
        **sections,
    )


async def sample_gauges(run: Run, scenario: Scenario, url: str) -> None:
    """Record the work gauges every 0.25 s; print them every 2 s (live progress)."""
    last_print = 0.0
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            work = await read_work(run.session, url)
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


async def finish(run: Run, scenario: Scenario, setting: Setting, log: str) -> None:
    """The checks every scenario ends with: drained, no tracebacks, still serving, footprint."""
    url, proc = setting.url, setting.proc
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
    found = tracebacks(setting.stage.log_dir / log)
    scenario.figures["tracebacks"] = len(found)
    scenario.check("no tracebacks", not found, f"{len(found)} in {log}: {Counter(found).most_common(3)}")


Body = Callable[[Run, Scenario, Setting], Awaitable[None]]


async def with_gateway(
    run: Run,
    scenario: Scenario,
    replicas: int,
    data: Callable[[list[str]], dict[str, Any]],
    body: Body,
    nofile: int | None = None,
) -> None:
    """Start a fleet and one gateway, record the footprint, run ``body``, finish with the shared checks."""
    stage = Stage(run.out / "logs")
    sampler: asyncio.Task[None] | None = None
    try:
        urls, control_url = await stage.sim(run.session, scenario.name, replicas)
        url, proc = await stage.gateway(run.session, scenario.name, data(urls), nofile)
        run.unknown_keys += [k for k in stage.unknown_keys if k not in run.unknown_keys]
        rss_mib, fds = footprint(proc)
        scenario.figures["rss_before_mib"] = round(rss_mib, 1)
        scenario.figures["fds_before"] = fds
        sampler = asyncio.create_task(sample_gauges(run, scenario, url))
        setting = Setting(stage, urls, control_url, url, proc)
        await body(run, scenario, setting)
        await finish(run, scenario, setting, f"{scenario.name}.log")
    finally:
        if sampler is not None:
            sampler.cancel()
        stage.stop_all()
