"""A seeded trace replayed through the decision path on a manual clock gives the recorded outcomes,
``/metrics`` and ``/signals``.

The trace exercises every branch a request can take between parse and release: admitted at once,
queued then dispatched, queued past its deadline, refused for KV, for a full queue, for a tenant's
budget, for the model's TTFT objective, for the client's deadline, for no replica (the whole fleet
stops answering for a while), invalid, unauthorised, a replica failing before the first byte
(retried), a client leaving while queued, a replica ejected and back, a refused client retrying with
``x-stainless-retry-count``. ``REFUSALS`` names the refusal reasons the recording must hold, so a
trace or behaviour change that drops a whole branch fails here rather than re-recording quietly.
The recording (``golden/decision_replay.json``) is the behaviour contract of the decision path: a
restructuring that changes any outcome, label or sample shows up here. Regenerate it only for a
deliberate behaviour change, named in the commit (``KVGATE_REPLAY_RECORD=1``: the run writes the
file and fails, saying so; the next run without it compares).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from kvgate.admission.decision import Refusal
from kvgate.config.loader import parse_config
from kvgate.gateway.edge.errors import refusal_error
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.dispatcher import Route
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.fleet_work import FleetWork
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import Outcome

GOLDEN = Path(__file__).parent / "golden" / "decision_replay.json"
REPLICAS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


class ManualClock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Planned:
    index: int
    at_s: float
    body: dict[str, Any]
    key: str
    headers: dict[str, str]
    ttft_s: float
    itl_s: float
    output_tokens: int
    stream: bool
    fails_first: bool
    leaves_after_s: float | None


@dataclass
class Replay:
    clock: ManualClock
    state: GatewayState
    path: DecisionPath
    metrics: GatewayMetrics
    outcomes: list[list[Any]] = field(default_factory=list)
    events: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    sequence: int = 0

    def at(self, time_s: float, action: Callable[[], None]) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (time_s, self.sequence, action))


def config() -> Any:
    return parse_config(
        {
            "models": [
                {
                    "name": "m",
                    "max_model_len": 4096,
                    "kv_bytes_per_token": 1,
                    "tokenizer": {"kind": "bytes", "bytes_per_token": 4.0},
                }
            ],
            "pools": [{"name": "p", "replicas": REPLICAS, "kv_capacity_tokens": 6000}],
            "admission": {
                "auth_enabled": True,
                "tenants": [
                    {"name": "chat", "api_keys": ["sk-chat"], "weight": 2},
                    {"name": "batch", "api_keys": ["sk-batch"], "tokens_per_min": 20000},
                ],
                "max_active_sequences_per_replica": 6,
                "queue_max_requests": 4,
                "max_queue_wait_s": 4.0,
                "models": {"m": {"ttft_slo_s": 4.5}},
            },
            "routing": {"seed": 3},
        },
        {},
    )


def trace(seed: int = 12, count: int = 260) -> list[Planned]:
    rng = random.Random(seed)
    planned = []
    at_s = 0.0
    for index in range(count):
        at_s += rng.expovariate(9.0 if 80 <= index < 180 else 3.0)
        words = rng.choice([20, 60, 200, 900, 2500])
        prefix = WORDS[index % 4]
        prompt = " ".join([prefix] * 30 + [rng.choice(WORDS) for _ in range(words)])
        chat = rng.random() < 0.7
        max_tokens: Any = rng.choice([16, 64, 256, 700])
        if rng.random() < 0.03:
            max_tokens = rng.choice([-1, "many", 10**9])
        body: dict[str, Any] = {"model": "m", "max_tokens": max_tokens}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
            if rng.random() < 0.2:
                body["n"] = 2
        stream = rng.random() < 0.6
        if stream:
            body["stream"] = True
        headers = {}
        if rng.random() < 0.1:
            headers["x-request-timeout-ms"] = str(rng.choice([800, 3000, 20000]))
        key = rng.choice(
            ["sk-chat", "sk-chat", "sk-batch", "sk-wrong"] if rng.random() < 0.05 else ["sk-chat", "sk-batch"]
        )
        planned.append(
            Planned(
                index=index,
                at_s=round(at_s, 3),
                body=body,
                key=key,
                headers=headers,
                ttft_s=round(0.05 + rng.random() * 0.6, 3),
                itl_s=round(0.01 + rng.random() * 0.03, 4),
                output_tokens=rng.randint(
                    1, max_tokens if isinstance(max_tokens, int) and 0 < max_tokens < 10**6 else 8
                ),
                stream=stream,
                fails_first=rng.random() < 0.05,
                leaves_after_s=round(rng.uniform(0.02, 0.5), 3) if rng.random() < 0.3 else None,
            )
        )
    return planned


def new_replay() -> Replay:
    cfg = config()
    clock = ManualClock(1000.0)
    state = GatewayState.from_config(cfg)
    metrics = GatewayMetrics(clock=clock, window_s=60.0)
    path = DecisionPath.build(state, cfg, metrics, clock)
    routing = cfg.routing
    metrics.bind(
        FleetWork(state, path.dispatcher, path.fleet, routing.scrape_stale_s, routing.warmup_s, clock)
    )
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    return Replay(clock, state, path, metrics)


def proxy_request(plan: Planned, attempt: int) -> ProxyRequest:
    raw = orjson.dumps(plan.body)
    headers = [(b"authorization", f"Bearer {plan.key}".encode())]
    headers += [(k.encode(), v.encode()) for k, v in plan.headers.items()]
    headers.append((b"x-stainless-retry-count", str(attempt).encode()))  # as the openai SDKs send it
    endpoint = "/v1/chat/completions" if "messages" in plan.body else "/v1/completions"
    return ProxyRequest(
        f"req-{plan.index}-{attempt}",
        f"req-{plan.index}-{attempt}",
        endpoint,
        "m",
        plan.stream,
        dict(plan.body),
        raw,
        headers,
        list(headers),
    )


def serve(replay: Replay, plan: Planned, request: ProxyRequest, route: Route) -> None:
    """Play a routed request's life on the clock: first token, produced tokens, finish, release."""
    path = replay.path
    start_s = replay.clock.now_s
    request.replica = route.replica
    if plan.fails_first and len(request.tried) == 1:

        def fail() -> None:
            replica = route.replica
            path.fleet.observe(replica, 503, None)
            retried = path.dispatcher.retry(request)
            replay.outcomes.append(
                [plan.index, "retry", replay.clock.now_s, retried and retried.replica.replica_id]
            )
            if retried is None:
                request.finished = True
                path.accounting.closed(request, route.replica)
                path.dispatcher.release(request)
            else:
                serve(replay, plan, request, retried)

        replay.at(start_s + 0.02, fail)
        return
    ttft_s = start_s + plan.ttft_s
    end_s = ttft_s + plan.itl_s * plan.output_tokens

    def first() -> None:
        path.accounting.first_token(request, route.replica, replay.clock.now_s)
        if request.stream:
            path.accounting.produced(request, max(1, plan.output_tokens // 2))

    def finish() -> None:
        assert request.admission is not None
        request.prompt_tokens = request.admission.cost.prompt_tokens + plan.index % 7 - 3
        request.completion_tokens = plan.output_tokens
        path.fleet.observe(route.replica, 200)
        gaps = [plan.itl_s] * (plan.output_tokens - 1) if request.stream else []
        path.accounting.finished(
            request, route.replica, plan.itl_s if request.stream else None, replay.clock.now_s, gaps
        )
        request.finished = True
        path.accounting.closed(request, route.replica)
        path.dispatcher.release(request)
        replay.outcomes.append([plan.index, "done", replay.clock.now_s])

    replay.at(ttft_s, first)
    replay.at(end_s, finish)


def describe(outcome: Route | Refusal) -> list[Any]:
    if isinstance(outcome, Route):
        return ["route", outcome.replica.replica_id]
    error = refusal_error(outcome)
    return ["refuse", error.status, error.reason, [(k.decode(), v.decode()) for k, v in error.headers()]]


async def run_replay(plans: list[Planned]) -> dict[str, Any]:
    replay = new_replay()
    path = replay.path
    loop_tasks: list[asyncio.Task[None]] = []

    def arrive(plan: Planned, attempt: int) -> Callable[[], None]:
        def go() -> None:
            request = proxy_request(plan, attempt)
            arrived_s = replay.clock.now_s

            async def decide() -> None:
                request.arrived_s = replay.clock.now_s
                refusal = await path.pricer.price(request)
                outcome = refusal if refusal is not None else await path.dispatcher.admit(request)
                replay.outcomes.append(
                    [plan.index, attempt, replay.clock.now_s - arrived_s, *describe(outcome)]
                )
                if isinstance(outcome, Route):
                    serve(replay, plan, request, outcome)
                elif attempt == 0 and outcome.status == 429 and outcome.retry_after is not None:
                    retry_after_s = outcome.retry_after.milliseconds / 1000
                    replay.at(replay.clock.now_s + min(retry_after_s, 20.0), arrive(plan, 1))

            task = asyncio.ensure_future(decide())
            loop_tasks.append(task)
            if plan.leaves_after_s is not None:

                def leave() -> None:
                    if not task.done():
                        task.cancel()
                        replay.outcomes.append([plan.index, "left", replay.clock.now_s])

                replay.at(arrived_s + plan.leaves_after_s, leave)

        return go

    for plan in plans:
        replay.at(1000.0 + plan.at_s, arrive(plan, 0))
    end_s = 1000.0 + plans[-1].at_s + 60.0
    tick_s = 1000.0
    while tick_s < end_s:
        tick_s += 0.25
        replay.at(tick_s, path.dispatcher.tick)
    replay.at(1000.0 + plans[40].at_s, lambda: path.fleet.observe(replay.state.replicas[REPLICAS[2]], None))
    replay.at(1000.0 + plans[41].at_s, lambda: path.fleet.observe(replay.state.replicas[REPLICAS[2]], None))
    replay.at(1000.0 + plans[42].at_s, lambda: path.fleet.observe(replay.state.replicas[REPLICAS[2]], None))
    for replica_url in REPLICAS:  # the whole fleet stops answering for a while: no replica serves
        for index in (200, 201):
            replay.at(
                1000.0 + plans[index].at_s,
                lambda url=replica_url: path.fleet.observe(replay.state.replicas[url], None),
            )
    probe_s = 1000.0 + plans[42].at_s
    while probe_s < end_s:  # the replica's active probes succeed once it is back: they bring it back
        probe_s += 1.0
        for replica_url in REPLICAS[2:] if probe_s < 1000.0 + plans[205].at_s else REPLICAS:
            back = replay.state.replicas[replica_url]
            replay.at(probe_s, lambda back=back: path.fleet.observe_outcome(back, Outcome.SUCCESS))
    samples: dict[str, Any] = {}
    while replay.events:
        time_s, _, action = heapq.heappop(replay.events)
        replay.clock.now_s = time_s
        action()
        for _ in range(4):
            await asyncio.sleep(0)
        if abs(time_s - 1000.0 - plans[150].at_s) < 1e-9 and "mid_burst" not in samples:
            samples["mid_burst"] = exposition(replay.metrics)
            samples["mid_burst_signals"] = replay.metrics.signals_doc()
    for task in loop_tasks:
        task.cancel()
    await asyncio.gather(*loop_tasks, return_exceptions=True)
    return {
        "outcomes": replay.outcomes,
        "metrics": exposition(replay.metrics),
        "signals": replay.metrics.signals_doc(),
        **samples,
        "ledger_empty": replay.state.ledger.totals() == type(replay.state.ledger.totals())(),
    }


def exposition(metrics: GatewayMetrics) -> list[str]:
    """kvgate's own series, in order; the process, platform and GC collectors and the wall-clock
    ``_created`` stamps vary by run."""
    return [
        line
        for line in metrics.render().decode().splitlines()
        if "kvgate_" in line and "kvgate_build_info" not in line and "_created" not in line.split(" ")[0]
    ]


def normalised(doc: Any) -> Any:
    return json.loads(json.dumps(doc))


REFUSALS = {
    "queue_full",
    "tenant_budget",
    "no_replica",
    "ttft_slo",
    "deadline",
    "kv_capacity",
    "invalid_request",
    "unauthorized",
}
"""Every refusal the trace must provoke: comparing outcome kinds alone let whole branches drop out."""


def test_the_decision_path_replays_the_recorded_trace_exactly() -> None:
    result = normalised(asyncio.run(run_replay(trace())))
    assert result["ledger_empty"], "every reservation released at the end of the trace"
    decisions = [o for o in result["outcomes"] if isinstance(o[1], int)]
    kinds = {o[3] for o in decisions} | {o[1] for o in result["outcomes"] if not isinstance(o[1], int)}
    assert {"route", "refuse", "retry", "left", "done"} <= kinds, kinds
    assert any(o[3] == "route" and o[2] > 0 for o in decisions), "some request was queued, then routed"
    assert any(o[3] == "route" and o[2] == 0 for o in decisions), "some request was admitted at once"
    reasons = {o[5] for o in decisions if o[3] == "refuse"}
    assert reasons >= REFUSALS, f"the trace no longer provokes {sorted(REFUSALS - reasons)}"
    if os.environ.get("KVGATE_REPLAY_RECORD"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        pytest.fail(f"recorded {GOLDEN.name}; run again without KVGATE_REPLAY_RECORD to compare against it")
    expected = json.loads(GOLDEN.read_text())
    for key in ("outcomes", "metrics", "signals", "mid_burst", "mid_burst_signals"):
        assert result[key] == expected[key], f"{key} differs from the recorded replay"
