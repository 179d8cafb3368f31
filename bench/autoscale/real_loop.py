"""``--mode real``: one closed-loop run with real processes and sockets, recorded."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.autoscale.real_plan import (
    ADMIN_TOKEN,
    REAL_MODEL,
    REAL_PROFILE,
    SCALE_RATIO,
    RealBrain,
    RealPlan,
    baseline_real_capacity_rps,
    gateway,
    kvgate_brain,
    real_workloads,
    request_rate_brain,
)
from bench.autoscale.scenario import MIN_REPLICAS, UTILIZATION_TARGET
from bench.harness.fleet import SimSpec, start_sim
from bench.harness.gateway import start_gateway
from bench.harness.metrics import scrape
from bench.harness.processes import children
from kvgate.autoscaler.actuators import SimActuator
from kvgate.autoscaler.loop import fetch_signals
from kvgate.loadtest.client import RequestRecord
from kvgate.loadtest.runner import RunOptions, Target
from kvgate.loadtest.runner import run as runner_run
from kvgate.loadtest.workload import build_trace
from kvgate.sim.ports import free_ports

LAG = "kvgate_sim_lag_ratio"
SPARE_PORTS = 9
"""Ports kept free after the simulator's first replicas, for every one the actuator adds."""


@dataclass(slots=True)
class RealRun:
    name: str
    plan: RealPlan
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """(seconds from the start of the load, the default pool of /signals)."""
    desired: list[tuple[float, int, str]] = field(default_factory=list)
    """(seconds, replicas the acting scaler asked for, its reason)."""
    records: list[tuple[float, RequestRecord]] = field(default_factory=list)
    """(seconds the request was sent, its record)."""
    offered: list[tuple[float, int]] = field(default_factory=list)
    """(send offset, prompt tokens) of every request of the traces."""
    sim_lag_ratio: float | None = None


async def run_real(name: str, brain_name: str, plan: RealPlan, out: Path) -> RealRun:
    """One closed-loop run: fleet, gateway, actuator loop and load, all real processes and sockets;
    the gateway's config and both processes' logs go into ``out``."""
    run = RealRun(name, plan)
    with children() as started:
        spec = SimSpec(MIN_REPLICAS, REAL_PROFILE, REAL_MODEL, seed=plan.seed, spare_ports=SPARE_PORTS)
        sim = start_sim(started, spec, output=out / f"{name}-sim.log")
        config = gateway(plan, list(sim.urls), free_ports())
        served = start_gateway(
            started, config, out / f"{name}-gateway.yaml", output=out / f"{name}-gateway.log"
        )
        control_url, gateway_url = sim.control_url, served.url
        traces = [build_trace(w, plan.seed, salt=i) for i, w in enumerate(real_workloads(plan))]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await sim.ready(session)
            await served.ready(session)
            actuator = SimActuator(
                session,
                {"default": control_url},
                cold_start_s=plan.cold_start_s,
                gateway_url=gateway_url,
                admin_token=ADMIN_TOKEN,
            )
            run.offered = sorted((r.at_s or 0.0, r.prompt_tokens) for trace in traces for r in trace.requests)
            brain = (
                kvgate_brain("default")
                if brain_name == "kvgate"
                else request_rate_brain(
                    "default",
                    baseline_real_capacity_rps() * UTILIZATION_TARGET,
                    [t for t, _ in run.offered],
                )
            )
            origin_s = time.monotonic()
            tasks = [
                asyncio.create_task(_record_signals(session, gateway_url, origin_s, run)),
                asyncio.create_task(_actuate(session, gateway_url, actuator, brain, origin_s, run)),
            ]
            target = Target(name, gateway_url, REAL_MODEL)
            options = RunOptions(signals_interval_s=3600.0)
            results = await asyncio.gather(*(runner_run(target, trace, options) for trace in traces))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                offset_s = result.started_epoch_s - (time.time() - (time.monotonic() - origin_s))
                run.records += [(offset_s + r.sent_at_s, r) for r in result.records]
            run.records.sort(key=lambda item: item[0])
            run.sim_lag_ratio = await _sim_lag_ratio(session, control_url)
    return run


async def _record_signals(
    session: aiohttp.ClientSession, gateway_url: str, origin_s: float, run: RealRun
) -> None:
    while True:
        try:
            doc = await fetch_signals(session, gateway_url)
            run.samples.append((time.monotonic() - origin_s, doc["pools"]["default"]))
        except (aiohttp.ClientError, TimeoutError, KeyError) as exc:
            print(f"signals: {exc!r}", file=sys.stderr)
        await asyncio.sleep(1.0)


async def _actuate(
    session: aiohttp.ClientSession,
    gateway_url: str,
    actuator: SimActuator,
    brain: RealBrain,
    origin_s: float,
    run: RealRun,
) -> None:
    """The loop of ``kvgate autoscale --actuator sim``: read, decide, resize fleet and gateway."""
    interval_s = 15.0 / SCALE_RATIO
    while True:
        try:
            rec = brain(await fetch_signals(session, gateway_url), time.monotonic() - origin_s)
            if rec is not None:
                await actuator.apply(rec)
                run.desired.append((time.monotonic() - origin_s, rec.desired_replicas, rec.reason))
        except (aiohttp.ClientError, TimeoutError, KeyError) as exc:
            print(f"actuator: {exc!r}", file=sys.stderr)
        await asyncio.sleep(interval_s)


async def _sim_lag_ratio(session: aiohttp.ClientSession, control_url: str) -> float | None:
    """The worst replica's ``kvgate_sim_lag_ratio``: above 0.05 the simulator fell behind."""
    async with session.get(f"{control_url}/replicas") as response:
        replicas = (await response.json())["replicas"]
    ratios = [
        value
        for replica in replicas
        if replica["state"] == "ready"
        for value in (await scrape(session, replica["url"], (LAG,))).values(LAG)
    ]
    return max(ratios, default=None)
