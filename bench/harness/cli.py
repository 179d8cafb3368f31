"""The command line every benchmark shares: where a run writes (``--out``), and its seed.

A run writes into ``--out DIR`` (default ``bench-out/<name>/``, which git ignores): its printed
output as ``output.txt`` beside the tables, plots and JSON it makes. Nothing is written under
``docs/`` unless the user names a path there (``--out docs/...``, or a benchmark's ``--report FILE``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

OUT_ROOT = Path("bench-out")
OUTPUT_FILE = "output.txt"


def benchmark_parser(name: str, doc: str | None, *, seed: int | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m bench NAME``, its help the module's docstring; ``--seed`` when the
    benchmark draws anything at random (``seed`` its default)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench {name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        default=OUT_ROOT / name,
        help=f"directory for what the run writes (default {OUT_ROOT / name}; its output in {OUTPUT_FILE})",
    )
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed, help=f"fixes what is drawn (default {seed})")
    return parser


@contextlib.contextmanager
def recorded(out: Path) -> Iterator[Path]:
    """``out``, created; what is printed meanwhile also goes to ``out/output.txt``."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / OUTPUT_FILE).open("w") as copy, contextlib.redirect_stdout(_Tee(sys.stdout, copy)):
        yield out


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        super().__init__()
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()
