"""The small fleet the overload benchmarks (``admission``, ``coordination``) drive past what it can
serve, defined once so both offer the same load to the same replicas: its shape, the requests
sent to it, what it serves per second at full batch, and the preemptions its replicas report."""

from __future__ import annotations

import random
from collections.abc import Sequence

import aiohttp

from bench.harness.fleet import SimSpec
from bench.harness.gateway_config import Pool
from bench.harness.metrics import scrape_all

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KV_CAPACITY_TOKENS = 20000
MAX_NUM_SEQS = 64
MAX_TOKENS = 200
"""Every request's output: streamed, ``ignore_eos``, so each holds its KV for as long as the others."""
PROMPT_WORDS = 300
PREEMPTIONS = "vllm:num_preemptions_total"


def resident(replicas: int, kv_tokens: int = PROMPT_WORDS + MAX_TOKENS) -> int:
    """The sequences of ``kv_tokens`` that fit the fleet at once."""
    return min(MAX_NUM_SEQS, KV_CAPACITY_TOKENS // kv_tokens) * replicas


def capacity_per_s(replicas: int, itl_s: float) -> float:
    """Requests per second the fleet finishes: ``resident`` sequences, each done after
    ``MAX_TOKENS`` decode steps of ``itl_s``."""
    return resident(replicas) / (MAX_TOKENS * itl_s)


def prompt(rng: random.Random) -> str:
    """A prompt of about ``PROMPT_WORDS`` tokens that shares no prefix with another."""
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(PROMPT_WORDS // 3))


def body(text: str) -> dict[str, object]:
    return {"model": MODEL, "prompt": text, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}


def sim_spec(replicas: int, time_scale: float) -> SimSpec:
    return SimSpec(
        replicas, kv_capacity_tokens=KV_CAPACITY_TOKENS, max_num_seqs=MAX_NUM_SEQS, time_scale=time_scale
    )


def pool(replica_urls: Sequence[str]) -> Pool:
    """The fleet as the gateway's config declares it."""
    return Pool(replica_urls, kv_capacity_tokens=KV_CAPACITY_TOKENS, max_sequences=MAX_NUM_SEQS)


async def preemptions(session: aiohttp.ClientSession, urls: Sequence[str]) -> float:
    """The replicas' preemptions so far, summed."""
    return (await scrape_all(session, urls, (PREEMPTIONS,))).sum(PREEMPTIONS)
