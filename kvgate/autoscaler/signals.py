"""One pool's signals at one instant: the autoscaling policy's only input, and how it is read from
the gateways' ``/signals`` documents.

A ``PoolSignals`` is a value stamped with the time its reader took it; the policy keeps a history of
them per pool and never asks where they came from (the gateway's ``/signals``, a simulation, a
test). Latencies are None when the window held no sample, which the policy reads as "no evidence of
slowness" rather than as zero work. Token counts are additive across heterogeneous requests, which
is why the policy sizes on them instead of on request counts.

Several gateways (sharing Redis, each serving its share of the clients) each see only their own
queue and traffic, so a reader of several merges their documents per pool (``merge_signals``) before
``pool_signals`` turns the result into the policy's input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.vocabulary.replica import Role


@dataclass(frozen=True, slots=True)
class PoolSignals:
    time_s: float
    pool: str
    role: Role
    replicas_current: int
    """Replicas that exist, cold-starting ones included."""
    replicas_ready: int
    kv_occupancy_ratio: float
    """Fraction of the pool's KV cache in use, 0..1 (capacity-weighted over replicas)."""
    ttft_p95_s: float | None
    itl_p95_s: float | None
    queue_wait_p95_s: float | None
    prompt_tokens_queued: int
    """Prompt tokens waiting for their first forward pass: queued in kvgate plus admitted and pending."""
    resident_sequences: int
    prompt_tokens_per_s: float
    output_tokens_per_s: float


SUMMED = (
    "queued_requests",
    "queued_prompt_tokens",
    "pending_prompt_tokens",
    "resident_sequences",
    "remaining_decode_tokens",
    "prompt_tokens_per_s",
    "output_tokens_per_s",
    "requests_per_s",
)
"""Each gateway holds its own clients' requests: the pool's total is the sum."""
HIGHEST = (
    "replicas_current",
    "replicas_ready",
    "replicas_warming",
    "kv_occupancy_estimate_ratio",
    "kv_occupancy_scraped_ratio",
    "ttft_p95_s",
    "itl_p95_s",
    "queue_wait_p95_s",
    "e2e_p95_s",
)
"""Every gateway sees the same replicas and scrapes the same occupancy; quantiles do not add, and
the largest p95 is an upper bound of the fleet's p95 (conservative: it may scale out a little
early, never late)."""


def merge_signals(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ``/signals`` document for the fleet from each gateway's: per pool, work and rates add,
    replica counts, occupancy and latency quantiles take the largest (see ``SUMMED``, ``HIGHEST``)."""
    if len(docs) == 1:
        return dict(docs[0])
    pools: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for name, p in doc.get("pools", {}).items():
            merged = pools.get(name)
            if merged is None:
                pools[name] = dict(p)
                continue
            for key in SUMMED:
                merged[key] = merged.get(key, 0) + p.get(key, 0)
            for key in HIGHEST:
                present = [v for v in (merged.get(key), p.get(key)) if v is not None]
                merged[key] = max(present) if present else None
            decisions = dict(merged.get("decisions", {}))
            for decision, n in p.get("decisions", {}).items():
                decisions[decision] = decisions.get(decision, 0) + n
            merged["decisions"] = decisions
    first = docs[0] if docs else {}
    return {**first, "gateways": len(docs), "pools": pools}


def pool_signals(doc: Mapping[str, Any], time_s: float) -> list[PoolSignals]:
    """The policy's input from a ``/signals`` document, stamped with the reader's clock ``time_s``.

    The scraped KV occupancy is preferred when present (it is vLLM's own account, prefix-cache
    sharing included); the estimate is the fallback. A missing latency (no samples in the window)
    stays None: the policy reads it as "no evidence of slowness"."""
    samples = []
    for pool, p in sorted(doc.get("pools", {}).items()):
        scraped = p.get("kv_occupancy_scraped_ratio")
        samples.append(
            PoolSignals(
                time_s=time_s,
                pool=pool,
                role=Role(p.get("role", "mixed")),
                replicas_current=int(p["replicas_current"]),
                replicas_ready=int(p["replicas_ready"]),
                kv_occupancy_ratio=float(
                    scraped if scraped is not None else p["kv_occupancy_estimate_ratio"]
                ),
                ttft_p95_s=p.get("ttft_p95_s"),
                itl_p95_s=p.get("itl_p95_s"),
                queue_wait_p95_s=p.get("queue_wait_p95_s"),
                prompt_tokens_queued=int(p.get("queued_prompt_tokens", 0))
                + int(p.get("pending_prompt_tokens", 0)),
                resident_sequences=int(p.get("resident_sequences", 0)),
                prompt_tokens_per_s=float(p.get("prompt_tokens_per_s", 0.0)),
                output_tokens_per_s=float(p.get("output_tokens_per_s", 0.0)),
            )
        )
    return samples
