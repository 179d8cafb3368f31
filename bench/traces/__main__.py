"""``python -m bench traces``: one shape of ``bench.traces.shapes`` written as Mooncake JSONL, with its
reuse ceiling for a fleet's cache, for ``kvgate loadtest --trace`` or a benchmark's ``--replay``.

    python -m bench traces --shape chat-fleet [--rate 6] [--duration-s 300] [--seed 0]
        [--cache-tokens 1800000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

import orjson

from bench.harness.cli import benchmark_parser, recorded
from bench.traces.shapes import SHAPES
from kvgate.loadtest.reuse import reuse_ceiling


def parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("traces", __doc__, seed=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--rate", type=float, default=6.0, help="requests/s (default 6)")
    parser.add_argument("--duration-s", type=float, default=300.0, help="seconds of arrivals (default 300)")
    parser.add_argument(
        "--cache-tokens", type=int, default=1_800_000, help="the fleet's KV cache (default 1800000: 4 H100s)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with recorded(args.out):
        requests = SHAPES[args.shape](args.rate, args.duration_s, args.seed)
        path = args.out / f"{args.shape}.jsonl"
        rows = (
            {
                "timestamp": round(r.timestamp_ms),
                "input_length": r.input_length,
                "output_length": r.output_length,
                "hash_ids": list(r.hash_ids),
            }
            for r in requests
        )
        path.write_bytes(b"\n".join(orjson.dumps(row) for row in rows) + b"\n")
        prompt = sum(r.input_length for r in requests) / len(requests)
        print(f"{path}: {len(requests)} requests, mean prompt {prompt:,.0f} tokens")
        ceiling = reuse_ceiling(requests, args.cache_tokens).hit_ratio
        print(f"reuse ceiling {ceiling:.3f} with one cache of {args.cache_tokens:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
