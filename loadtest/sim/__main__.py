"""``python -m loadtest.sim``: the ``kvgate sim`` command on its own (same flags, same error lines)."""

from __future__ import annotations

import argparse
import sys

from gateway.command import CommandError, CommandParser, report
from loadtest.sim.cli import add_arguments, run


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="kvgate sim", description="Serve simulated vLLM replicas.")
    add_arguments(parser)
    args: argparse.Namespace = parser.parse_args(argv)
    try:
        return run(args)
    except CommandError as exc:
        report(parser.prog, str(exc))
        return exc.status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
