"""The chaos scenarios of clients that leave: storms of hang-ups mid-stream and while queued, and a
replica killed under streams. Each must leave nothing lost and the gateway's work back at zero."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.chaos.checks import Run, Scenario, Setting, gateway_data, summarise, with_gateway
from bench.chaos.clients import STREAM_ERROR, Outcome, StreamClient, completion_body
from bench.harness.metrics import scrape, scrape_all

SEQUENCES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
QUEUED = "kvgate_queued_requests"


async def storm_streaming(run: Run) -> Scenario:
    n = run.args.clients
    scenario = Scenario("storm_streaming", f"{n} clients hang up at once mid-stream")

    async def body(run: Run, s: Scenario, setting: Setting) -> None:
        url = setting.url
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
        running = await replicas_running(run, setting.urls)
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
        page = await scrape_all(run.session, urls, SEQUENCES)
        total = sum(page.sum(name) for name in SEQUENCES)
        if total == 0 or time.monotonic() > end:
            return total
        await asyncio.sleep(0.2)


async def storm_queued(run: Run) -> Scenario:
    n = run.args.clients
    scenario = Scenario("storm_queued", f"two waves of {n} clients hang up while queued (small fleet)")

    def data(urls: list[str]) -> dict[str, Any]:
        return gateway_data(urls, kv_capacity_tokens=1500, admission={"max_queue_wait_s": 600.0})

    async def body(run: Run, s: Scenario, setting: Setting) -> None:
        url = setting.url
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
                queued = (await scrape(run.session, url, (QUEUED,))).sum(QUEUED)
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


async def replica_kill(run: Run) -> Scenario:
    k = run.args.kill_streams
    scenario = Scenario("replica_kill", f"a replica killed under {k} streams")

    async def body(run: Run, s: Scenario, setting: Setting) -> None:
        url = setting.url
        clients = [StreamClient(url + "/v1/completions", completion_body(800)) for _ in range(k)]
        tasks = [asyncio.create_task(c.run(run.session)) for c in clients]
        deadline = time.monotonic() + 20
        while (
            time.monotonic() < deadline and sum(c.outcome.first_chunk_at_s is not None for c in clients) < k
        ):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        async with run.session.post(setting.control_url + "/replicas/0/kill") as response:
            s.event(f"replica 0 killed (control API answered {response.status})")
        await asyncio.wait(tasks, timeout=120)
        for c in clients:
            c.leave.set()
        outcomes = list(await asyncio.gather(*tasks))
        summarise(s, outcomes)
        s.figures["stream_errors"] = sum(o.kind == STREAM_ERROR for o in outcomes)

    await with_gateway(run, scenario, 2, gateway_data, body)
    return scenario
