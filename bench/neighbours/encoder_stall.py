"""A child of ``python -m bench neighbours --loop-lag``: the event-loop stall of one checkout's prompt
encoder counting huge prompts, printed as one JSON list of seconds.

Run as a file from the checkout measured (``cwd`` and ``PYTHONPATH`` that checkout), so ``kvgate`` is
that checkout's; it imports nothing of ``bench``, which an older checkout may not have.

    python encoder_stall.py MODEL WINDOW_TOKENS PROMPTS PROMPT_FILE
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson


async def stalls(model_name: str, window_tokens: int, prompt: str, prompts: int) -> list[float]:
    """In this process, on uvloop: the longest a 1 ms ticker oversleeps while the gateway's own prompt
    encoder counts each of ``prompts`` huge prompts (its body parsed on the loop first, as the proxy
    does, and its block hashes taken as pricing then does): how long a small request beside it can
    be held up. Uses only seams an older checkout has too (``PromptEncoder.encode`` returned the ids
    there, hashed by pricing on the loop), so each checkout's child runs its own code."""
    from kvgate.config.models import Model
    from kvgate.gateway.request_path.prompt import PromptEncoder
    from kvgate.routing.prefix_hash import block_hashes

    model = Model.model_validate(
        {"name": model_name, "max_model_len": window_tokens, "kv_bytes_per_token": 131072}
    )
    encoder = PromptEncoder([model], 16)
    raw = orjson.dumps({"model": model_name, "messages": [{"role": "user", "content": prompt}]})
    lags_s: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lags_s.append(time.perf_counter() - start - 0.001)

    stalls_s = []
    async with aiohttp.ClientSession() as session:
        await encoder.encode(model_name, {"model": model_name, "prompt": "warm up"}, 7, session, "")
        ticker = asyncio.create_task(tick())
        for _ in range(prompts):
            await asyncio.sleep(0.05)
            lags_s.clear()
            body = orjson.loads(raw)
            counted: Any = await encoder.encode(model_name, body, len(raw), session, "")
            blocks = tuple(block_hashes(counted)) if isinstance(counted, list) else counted.block_hashes
            del counted, blocks, body
            await asyncio.sleep(0.005)
            stalls_s.append(max(lags_s, default=0.0))
        stop.set()
        await ticker
    return stalls_s


def main(argv: list[str]) -> int:
    import uvloop

    model_name, window_tokens, prompts, prompt_file = argv
    prompt = Path(prompt_file).read_text()
    print(orjson.dumps(uvloop.run(stalls(model_name, int(window_tokens), prompt, int(prompts)))).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
