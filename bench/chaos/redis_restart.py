"""The chaos scenario of a dependency that fails: the Redis two gateways share is stopped under load
and started again, empty. Both gateways must keep serving on local state, show the outage on
``kvgate_coordination_up`` and in their logs, and end with their work back at zero."""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import aiohttp

from bench.chaos.checks import Run, Scenario, gateway_data, sample_gauges, summarise
from bench.chaos.clients import Outcome, StreamClient, completion_body
from bench.chaos.gauges import wait_drained
from bench.chaos.stage import Stage, footprint, tracebacks
from bench.harness.metrics import scrape
from kvgate.sim.ports import free_ports

COORDINATION_UP = "kvgate_coordination_up"


async def redis_restart(run: Run) -> Scenario:
    down_s = run.args.redis_down_s
    scenario = Scenario("redis_restart", f"Redis stopped for {down_s:g} s under two gateways, then restarted")
    stage = Stage(run.out / "logs")
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
        values = (await scrape(run.session, url, (COORDINATION_UP,))).values(COORDINATION_UP)
        return min(values) if values else None

    try:
        redis_port = free_ports()
        redis = stage.redis("redis_restart", redis_port)
        await asyncio.sleep(0.5)
        urls, _ = await stage.sim(run.session, scenario.name, 2)
        coordination = {
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "interval_s": 0.5,
            "lease_s": 3.0,
            "namespace": f"chaos-{os.getpid()}",
            "fail_mode": "open",
        }
        gateways = [
            await stage.gateway(
                run.session, f"redis_restart-{name}", gateway_data(urls, coordination=coordination)
            )
            for name in ("a", "b")
        ]
        run.unknown_keys += [k for k in stage.unknown_keys if k not in run.unknown_keys]
        gw_urls = [u for u, _ in gateways]
        scenario.figures["rss_before_mib"] = [round(footprint(p)[0], 1) for _, p in gateways]
        scenario.figures["fds_before"] = [footprint(p)[1] for _, p in gateways]
        sampler = asyncio.create_task(sample_gauges(run, scenario, gw_urls[0]))
        workers = [asyncio.create_task(load(u)) for u in gw_urls for _ in range(run.args.redis_workers)]
        watcher = asyncio.create_task(watch(gw_urls))
        scenario.event("two gateways under load, sharing Redis")
        await asyncio.sleep(3.0)
        before_up = [await coordination_up(u) for u in gw_urls]
        logs = [stage.log_dir / f"redis_restart-{name}.log" for name in ("a", "b")]
        offsets = [log.stat().st_size for log in logs]
        stage.stop(redis)
        scenario.event("Redis stopped")
        await asyncio.sleep(down_s)
        during_up = [await coordination_up(u) for u in gw_urls]
        stage.redis("redis_restart-again", redis_port)
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
        stage.stop_all()
    return scenario
