"""What the open streams benchmark's children say: progress, lag samples, collections, readiness.

Each child's output is read on a thread of its own so its pipe never fills while the benchmark
sleeps between readings; the lines are kept as figures (``progress OPENED DONE TOKENS ERRORS``,
``lag T LAG ...``, ``gc T SECONDS``) and events (``ready``, ``result``).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.processes import Children, Output


@dataclass(slots=True)
class Lines:
    process: subprocess.Popen[bytes]
    progress: tuple[int, int, int, int] = (0, 0, 0, 0)
    finished: threading.Event = field(default_factory=threading.Event)
    lag: list[tuple[float, float]] = field(default_factory=list)
    full_collections: list[tuple[float, float]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Lines:
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(ValueError, OSError), self.process.stdout:
            for raw in self.process.stdout:
                self._take(raw)

    def _take(self, raw: bytes) -> None:
        kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
        if kind == "progress":
            opened, done, tokens, errors = (int(x) for x in rest.split())
            self.progress = (opened, done, tokens, errors)
        elif kind == "lag":
            values = [float(x) for x in rest.split()]
            self.lag.extend(zip(values[::2], values[1::2], strict=True))
        elif kind == "gc":
            at_s, pause_s = (float(x) for x in rest.split())
            self.full_collections.append((at_s, pause_s))
        elif kind == "result":
            self.finished.set()
        elif kind == "ready":
            self.ready.set()


def start_python(
    started: Children,
    args: Sequence[str],
    stderr: Output = None,
    code_dir: Path | None = None,
) -> Lines:
    """``python ARGS`` read line by line; with ``code_dir`` run in that checkout (``-m`` puts the
    working directory first on the path), so its modules are imported."""
    process = started.start([sys.executable, *args], output=subprocess.PIPE, stderr=stderr, cwd=code_dir)
    return Lines(process).start()
