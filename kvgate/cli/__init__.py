"""The ``kvgate`` command line: every subcommand, gathered. Each is a ``register(subparsers)``
function that adds its parser and sets ``run`` (``args -> exit code``) and ``prog`` (its name in
error lines); adding one is one line in ``COMMANDS``. Bad input is one line,
``kvgate <command>: error: ...``, and a non-zero exit (see ``kvgate.cli.command``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from kvgate.cli.autoscale import register as register_autoscale
from kvgate.cli.command import CommandParser, execute
from kvgate.cli.loadtest import register as register_loadtest
from kvgate.cli.serve import register_config, register_serve
from kvgate.cli.sim import register as register_sim
from kvgate.cli.up import register_up

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

COMMANDS: list[Register] = [
    register_serve,
    register_up,
    register_config,
    register_sim,
    register_loadtest,
    register_autoscale,
]


def package_version() -> str:
    try:
        return version("kvgate")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = CommandParser(
        prog="kvgate", description="OpenAI-compatible gateway for vLLM fleets"
    )
    parser.add_argument("--version", action="version", version=f"kvgate {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return execute(build_parser().parse_args(argv))
