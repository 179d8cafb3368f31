"""Benchmark: counting a huge prompt on the event loop stalls every other request; off the loop it does not.

A ticker coroutine sleeps 1 ms at a time and records how late each wake-up is (the event-loop lag
any other request would see). Meanwhile a 1 MB prompt is counted four ways: not at all (baseline),
directly on the loop, in the default thread pool (``asyncio.to_thread``), and in a dedicated
single-thread executor (``run_in_executor``). tiktoken's encoder runs in Rust and releases the GIL,
so off-loop counting leaves the loop free; the bytes estimate is shown for contrast.

Run: ``python -m loadtest.bench_tokenize [--size-mb 1] [--repeat 3] [--loop asyncio|uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import random
import statistics
import time
from collections.abc import Awaitable, Callable

from admission.tokenizer import BytesEstimateTokenizer, TiktokenTokenizer, Tokenizer

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mb", type=float, default=1.0, help="prompt size (MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    args = parser.parse_args()
    prompt = make_prompt(int(args.size_mb * 1024 * 1024))
    print(
        f"prompt: {len(prompt.encode()) / 1024 / 1024:.2f} MiB, {len(prompt)} characters; loop: {args.loop}"
    )
    tokenizers: list[Tokenizer] = [TiktokenTokenizer.from_name(), BytesEstimateTokenizer(4.0)]
    for tokenizer in tokenizers:
        tokenizer.count("warm up")
        if args.loop == "uvloop":
            import uvloop

            rows = uvloop.run(_scenarios(tokenizer, prompt, args.repeat))
        else:
            rows = asyncio.run(_scenarios(tokenizer, prompt, args.repeat))
        _report(f"tokenizer: {tokenizer.name}", rows)


if __name__ == "__main__":
    main()
