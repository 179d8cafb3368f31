"""``python -m loadtest.sim``: the ``kvgate sim`` command on its own."""

from __future__ import annotations

import argparse
import sys

from loadtest.sim.cli import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.sim", description="Serve simulated vLLM replicas."
    )
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
