"""Benchmark: what counting huge prompts costs, on the event loop and in CPU seconds.

Stall: a ticker coroutine sleeps 1 ms at a time and records how late each wake-up is (the event-loop
lag any other request would see). Meanwhile a 1 MB prompt is counted four ways: not at all
(baseline), directly on the loop, in the default thread pool (``asyncio.to_thread``), and in a
dedicated single-thread executor (``run_in_executor``). tiktoken's encoder runs in Rust and releases
the GIL, so off-loop counting leaves the loop free; the bytes estimate is shown for contrast.

Abuse: the real gateway in front of the simulator, in this process, gets hostile prompts of
``--abuse-mb`` MB (10^6 bytes, under the default 8 MiB body limit): 4 at once over the model's
context (which end in a 400 whatever their exact count), then 6 at once from clients that give up
after 0.5 s (the model's window made large enough to fit them, so only their leaving can save the
work). Each runs with a prompt of words (cuttable into exact runs) and one of a single letter (one
BPE piece, as a hostile client would send). It prints the process's CPU seconds from the first
request until the work has settled: the tokenisation the gateway did for nothing. It uses only the
gateway's public seams, so the same file measures an older checkout
(``cd old && PYTHONPATH=$PWD:/path/to/this/checkout python -m bench tokenize --scenario abuse``).

Run: ``python -m bench tokenize [--scenario all|stall|abuse] [--size-mb 1] [--repeat 3]
[--loop asyncio|uvloop] [--abuse-mb 8]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx

from bench.harness.cli import benchmark_parser, recorded
from bench.harness.gateway_config import Model, Pool, gateway_config
from kvgate.admission.tokenizer import BytesEstimateTokenizer, TiktokenTokenizer, Tokenizer
from kvgate.config.loader import parse_config
from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet

_TEXT = (
    "the cache is the constraint and it is not a constant admission control beats autoscaling "
    "prefill decode tokens replica queue latency memory bandwidth 2048 3.14 ünïcödé 東京 — {json: [1, 2]}"
)
_WORDS = tuple(_TEXT.split(" "))


def make_prompt(size_bytes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size_bytes:
        word = rng.choice(_WORDS)
        parts.append(word)
        total += len(word.encode()) + 1
    return " ".join(parts)


async def _ticker(stop: asyncio.Event, lags_s: list[float], period_s: float = 0.001) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(period_s)
        lags_s.append(time.perf_counter() - start - period_s)


async def _measure(work: Callable[[], Awaitable[int]]) -> tuple[int, float, list[float]]:
    stop = asyncio.Event()
    lags_s: list[float] = []
    ticker = asyncio.create_task(_ticker(stop, lags_s))
    await asyncio.sleep(0.05)
    lags_s.clear()
    start = time.perf_counter()
    tokens = await work()
    elapsed_s = time.perf_counter() - start
    await asyncio.sleep(0.01)
    stop.set()
    await ticker
    return tokens, elapsed_s, lags_s


async def _scenarios(
    tokenizer: Tokenizer, prompt: str, repeat: int
) -> list[tuple[str, int, float, list[float]]]:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
    loop = asyncio.get_running_loop()

    async def baseline() -> int:
        await asyncio.sleep(0.2)
        return 0

    async def on_loop() -> int:
        return tokenizer.count(prompt)

    async def to_thread() -> int:
        return await asyncio.to_thread(tokenizer.count, prompt)

    async def in_executor() -> int:
        return await loop.run_in_executor(executor, tokenizer.count, prompt)

    rows: list[tuple[str, int, float, list[float]]] = []
    try:
        for name, work in (
            ("baseline (no counting)", baseline),
            ("on the event loop", on_loop),
            ("asyncio.to_thread", to_thread),
            ("run_in_executor", in_executor),
        ):
            for _ in range(repeat):
                tokens, elapsed_s, lags_s = await _measure(work)
                rows.append((name, tokens, elapsed_s, lags_s))
    finally:
        executor.shutdown()
    return rows


def _report(label: str, rows: list[tuple[str, int, float, list[float]]]) -> None:
    print(f"\n{label}")
    columns = ("tokens", "count ms", "ticks", "lag p50 ms", "lag p99 ms", "lag max ms")
    widths = (9, 9, 6, 11, 11, 11)
    print(f"{'mode':<24} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for name, tokens, elapsed_s, lags_s in rows:
        ordered = sorted(lags_s) or [0.0]
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(
            f"{name:<24} {tokens:>9} {elapsed_s * 1e3:>9.1f} {len(lags_s):>6} "
            f"{statistics.median(ordered) * 1e3:>11.3f} {p99 * 1e3:>11.3f} {ordered[-1] * 1e3:>11.3f}"
        )


_WINDOW_TOKENS = 131072
_FITS_ANY_TOKENS = 1 << 26
_GIVE_UP_S = 0.5
_SETTLED_CPU_S = 0.05
"""Work has settled when the process burns less than this much CPU in half a second."""


async def _settled_cpu_s(start_cpu_s: float) -> float:
    """Process CPU seconds (every thread) since ``start_cpu_s``, once the rate has dropped to idle."""
    previous = time.process_time()
    while True:
        await asyncio.sleep(0.5)
        now = time.process_time()
        if now - previous < _SETTLED_CPU_S:
            return now - start_cpu_s
        previous = now


async def _abuse(prompt: str, clients: int, window_tokens: int, timeout_s: float) -> tuple[str, float, float]:
    """Send ``clients`` copies of ``prompt`` at once; the outcomes, wall and CPU seconds spent."""
    async with SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet:
        config = parse_config(gateway_config(Pool(fleet.urls), model=Model(max_model_len=window_tokens)), {})
        async with (
            running_gateway(config) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=timeout_s) as http,
        ):
            body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 4}

            async def one() -> str:
                try:
                    return str((await http.post("/v1/completions", json=body)).status_code)
                except httpx.TimeoutException:
                    return "gave up"

            start_wall_s, start_cpu_s = time.perf_counter(), time.process_time()
            outcomes = await asyncio.gather(*(one() for _ in range(clients)))
            cpu_s = await _settled_cpu_s(start_cpu_s)
            wall_s = time.perf_counter() - start_wall_s
    summary = ", ".join(f"{outcomes.count(o)} x {o}" for o in sorted(set(outcomes)))
    return summary, wall_s, cpu_s


async def _abuse_scenarios(size_bytes: int) -> list[tuple[str, str, str, float, float]]:
    words = make_prompt(size_bytes).encode("ascii", "ignore")[:size_bytes].decode()
    letters = "x" * size_bytes
    rows = []
    for scenario, clients, window_tokens, timeout_s in (
        ("4 over the context", 4, _WINDOW_TOKENS, 600.0),
        (f"6 give up after {_GIVE_UP_S:g} s", 6, _FITS_ANY_TOKENS, _GIVE_UP_S),
    ):
        for kind, prompt in (("words", words), ("one letter", letters)):
            summary, wall_s, cpu_s = await _abuse(prompt, clients, window_tokens, timeout_s)
            rows.append((scenario, kind, summary, wall_s, cpu_s))
    return rows


def _report_abuse(size_bytes: int, rows: list[tuple[str, str, str, float, float]]) -> None:
    print(f"\nabuse: prompts of {size_bytes / 1e6:g} MB through the gateway (CPU of every thread)")
    print(f"{'scenario':<24} {'prompt':<11} {'outcomes':<22} {'wall s':>7} {'CPU s':>7}")
    for scenario, kind, summary, wall_s, cpu_s in rows:
        print(f"{scenario:<24} {kind:<11} {summary:<22} {wall_s:>7.1f} {cpu_s:>7.1f}")


def _run(loop: str, work: Coroutine[Any, Any, Any]) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(work)
    return asyncio.run(work)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("tokenize", __doc__)
    parser.add_argument("--scenario", choices=("all", "stall", "abuse"), default="all")
    parser.add_argument("--size-mb", type=float, default=1.0, help="stall: prompt size (MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="stall: runs per mode")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--abuse-mb", type=float, default=8.0, help="abuse: prompt size (MB, 10^6 bytes)")
    args = parser.parse_args(argv)
    with recorded(args.out):
        if args.scenario in ("all", "stall"):
            prompt = make_prompt(int(args.size_mb * 1024 * 1024))
            print(
                f"prompt: {len(prompt.encode()) / 1024 / 1024:.2f} MiB, {len(prompt)} characters; "
                f"loop: {args.loop}"
            )
            tokenizers: list[Tokenizer] = [TiktokenTokenizer.from_name(), BytesEstimateTokenizer(4.0)]
            for tokenizer in tokenizers:
                tokenizer.count("warm up")
                _report(
                    f"tokenizer: {tokenizer.name}",
                    _run(args.loop, _scenarios(tokenizer, prompt, args.repeat)),
                )
        if args.scenario in ("all", "abuse"):
            size_bytes = int(args.abuse_mb * 1e6)
            _report_abuse(size_bytes, _run(args.loop, _abuse_scenarios(size_bytes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
