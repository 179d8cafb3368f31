"""The ITL objective at the edge, against a simulated replica whose decode step grows with its batch:
with ``itl_slo_s`` the gateway learns the replica's latency line from the streams it relays and
holds the replica's sequences at the limit that line gives, where the static guard alone lets the
same clients run every sequence at once; the accounting is back to zero afterwards.

What is asserted is the behaviour, not the latency a loaded machine happens to produce: the line
learned rises with load and puts ``CLIENTS`` sequences past the objective, the limit it gives
stays below ``CLIENTS``, the replica never runs more than the limit, and the limit is exported.
The client-side ITL is printed for the reader; ``bench/goodput`` times it."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvgate.admission.itl_guard import MIN_OBSERVATIONS, ItlFit
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config

ITL_SLO_S = 0.025
CLIENTS = 32
LEARN_S = 2.0
MEASURE_S = 2.0
STEEP_DECODE = {"warmup_s": 0, "mfu_ratio": 0.011}
"""About 1.5 ms of compute per sequence in each step over a 6.5 ms floor: 32 sequences decode at
about 48 ms a token, the objective allows about 16."""


@dataclass
class Run:
    stream_itls_s: list[float] = field(default_factory=list)
    """Per stream started while measuring: its mean gap between token events, as the client saw it."""
    resident: list[int] = field(default_factory=list)
    limits: list[int] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)
    """The ``kvgate_itl_guard_sequences`` lines of ``/metrics`` at the end."""
    learned: list[str] = field(default_factory=list)
    """The line the guard's own limit at the end makes (none without an objective)."""
    fit: ItlFit | None = None
    """The guard's learned line for the replica at the end (none without an objective)."""


async def stream(http: httpx.AsyncClient, max_tokens: int) -> float | None:
    body = {
        "model": MODEL,
        "prompt": "tell a story",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    loop = asyncio.get_running_loop()
    first_s = last_s = 0.0
    events = 0
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {") or ('"usage"' in line and '"choices":[]' in line):
                continue
            now_s = loop.time()
            if not events:
                first_s = now_s
            events += 1
            last_s = now_s
    return (last_s - first_s) / (events - 1) if events > 1 else None


async def drive(gw: RunningGateway, run: Run) -> None:
    """``CLIENTS`` closed-loop clients of varied lengths for ``LEARN_S`` then ``MEASURE_S``; while
    measuring, the replica's resident sequences and learned limit are sampled."""
    loop = asyncio.get_running_loop()
    start_s = loop.time()
    measure_from_s = start_s + LEARN_S
    end_s = measure_from_s + MEASURE_S
    rng = random.Random(0)
    guard = gw.gateway.path.dispatcher.controller.itl_guard
    ledger = gw.state.ledger
    [replica_id] = gw.state.replicas

    async def client(http: httpx.AsyncClient, seed: int) -> None:
        lengths = random.Random(seed)
        while loop.time() < end_s:
            started_s = loop.time()
            itl_s = await stream(http, lengths.randint(16, 48))
            if started_s >= measure_from_s and itl_s is not None:
                run.stream_itls_s.append(itl_s)

    async def sample() -> None:
        while loop.time() < end_s:
            await asyncio.sleep(0.01)
            if loop.time() >= measure_from_s:
                run.resident.append(ledger.load(replica_id).resident_sequences)
                if guard is not None:
                    run.limits.append(guard.limits.get(replica_id, 0))

    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
        await asyncio.gather(sample(), *(client(http, rng.randrange(2**32)) for _ in range(CLIENTS)))


async def measured(**admission: Any) -> Run:
    run = Run()
    async with SimFleet(replicas=1, time_scale=1.0, seed=0, overrides=STEEP_DECODE) as fleet:
        config = gateway_config(fleet.urls, admission=admission)
        async with running_gateway(config) as gw:
            await drive(gw, run)
            await assert_idle(gw)
            async with httpx.AsyncClient(base_url=gw.url) as http:
                text = (await http.get("/metrics")).text
            run.exported = [line for line in text.splitlines() if line.startswith("kvgate_itl_guard_")]
            guard = gw.gateway.path.dispatcher.controller.itl_guard
            [replica] = gw.state.replicas.values()
            if guard is not None:
                limit = float(guard.limits[replica.replica_id])
                labels = f'pool="default",replica="{replica.name}"'
                run.learned = [f"kvgate_itl_guard_sequences{{{labels}}} {limit}"]
                run.fit = guard.fits[replica.replica_id]
    return run


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * len(values))]


async def test_the_itl_objective_holds_a_replica_at_its_learned_limit() -> None:
    unguarded = await measured()
    guarded = await measured(models={MODEL: {"itl_slo_s": ITL_SLO_S}})
    unguarded_itl_s, guarded_itl_s = mean(unguarded.stream_itls_s), mean(guarded.stream_itls_s)
    print(
        f"mean stream ITL: {unguarded_itl_s * 1e3:.1f} ms without the objective, "
        f"{guarded_itl_s * 1e3:.1f} ms with it (objective {ITL_SLO_S * 1e3:.0f} ms); p90 "
        f"{p90(unguarded.stream_itls_s) * 1e3:.1f} / {p90(guarded.stream_itls_s) * 1e3:.1f} ms over "
        f"{len(unguarded.stream_itls_s)} / {len(guarded.stream_itls_s)} streams; resident "
        f"sequences at most {max(unguarded.resident)} / {max(guarded.resident)}, learned limit "
        f"{min(guarded.limits)}..{max(guarded.limits)} (ceiling until {MIN_OBSERVATIONS} streams)"
    )
    assert max(unguarded.resident) == CLIENTS, "the static guard alone lets every client in"
    fit = guarded.fit
    assert fit is not None and fit.observations >= MIN_OBSERVATIONS
    assert fit.slope_s > 0, "the replica's step time grows with its batch, and the line learned so"
    assert fit.predicted_itl_s(CLIENTS) > ITL_SLO_S, "all the clients at once would miss the objective"
    learned = [
        (r, limit) for r, limit in zip(guarded.resident, guarded.limits, strict=True) if limit < CLIENTS
    ]
    assert learned, "the guard learned a limit below the clients while measuring"
    assert 1 < guarded.limits[-1] < CLIENTS
    # Once learned, admissions stop at the limit; sequences admitted before it fell finish within a
    # stream's length, so over the later half the replica runs no more than the limit allows.
    settled = learned[len(learned) // 2 :]
    assert max(r for r, _ in settled) <= max(limit for _, limit in learned), "held at its limit"
    assert unguarded.exported == []
    assert guarded.exported == guarded.learned
