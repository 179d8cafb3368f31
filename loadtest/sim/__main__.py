"""``python -m loadtest.sim``: the ``kvgate sim`` command on its own (same flags, same error lines)."""

from __future__ import annotations

import sys

from gateway.command import CommandParser, execute
from loadtest.sim.cli import add_arguments, run


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="kvgate sim", description="Serve simulated vLLM replicas.")
    add_arguments(parser)
    parser.set_defaults(run=run, prog=parser.prog)
    return execute(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
