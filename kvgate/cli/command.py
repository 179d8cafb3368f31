"""What every ``kvgate`` subcommand shares: bad input is one line on stderr and a non-zero exit.

A handler raises ``CommandError`` with the message; ``execute`` prints it as
``kvgate <command>: error: <message>`` and exits with its status (2, as argparse does for bad
arguments, unless the handler says otherwise). ``CommandParser`` makes argparse's own errors the
same single line instead of usage text plus an error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn
from urllib.parse import urlsplit


class CommandError(Exception):
    """Input the command cannot act on; ``str(exc)`` is the whole message, one line."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line; subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def report(prog: str, message: str) -> None:
    """Print one error line for ``prog`` (each line of a multi-line message indented under it)."""
    first, *rest = message.splitlines() or [""]
    print("\n".join([f"{prog}: error: {first}", *rest]), file=sys.stderr, flush=True)


def warning(prog: str, message: str) -> None:
    """Print one warning line for ``prog``: something it acted on but that wants changing."""
    print(f"{prog}: warning: {message}", file=sys.stderr, flush=True)


def execute(args: argparse.Namespace) -> int:
    """Run the parsed command (``args.run``) to its exit status, its ``CommandError`` as one line."""
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except CommandError as exc:
        report(args.prog, str(exc))
        return exc.status
    except KeyboardInterrupt:
        return 130


def http_url(url: str, flag: str) -> str:
    """``url`` when it is an absolute http(s) URL; a ``CommandError`` naming ``flag`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CommandError(f"{flag} takes an http:// or https:// URL, got {url!r}")
    return url
