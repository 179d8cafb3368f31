"""``python -m bench``: the list of benchmarks; ``python -m bench NAME [ARGS]`` runs one."""

from __future__ import annotations

import sys

from bench.catalog import CATALOG, find


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    chosen = find(args[0]) if args else None
    if chosen is None:
        width = max(len(benchmark.name) for benchmark in CATALOG)
        print("usage: python -m bench NAME [ARGS]   (python -m bench NAME --help for its options)\n")
        for benchmark in CATALOG:
            print(f"  {benchmark.name:<{width}}  {benchmark.measures}")
        if args and args[0] not in ("-h", "--help"):
            print(f"\nunknown benchmark {args[0]!r}", file=sys.stderr)
            return 2
        return 0
    return chosen.main()(args[1:])


if __name__ == "__main__":
    sys.exit(main())
