"""Child processes a benchmark starts (fleets, gateways, routers, drivers), stopped however the run ends.

Each child starts in a process group of its own, so stopping it reaches whatever it started in turn
(py-spy's target, a router's workers): the group gets SIGTERM, and after a grace period every process
left in the child's tree, or in its group, gets SIGKILL. ``children()`` stops them all on the way
out, all at once, whether the benchmark returned, raised, was interrupted or was sent SIGTERM
(turned into ``SystemExit`` meanwhile so the ``finally`` runs). A child's output goes to a log
file, a pipe or nowhere.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

import psutil

GRACE_S = 10.0
"""How long a child has to exit after SIGTERM before it is killed."""

Output = Path | int | IO[bytes] | None
"""Where a child's stdout (and stderr, with it) goes: a log file, ``subprocess.PIPE``,
``subprocess.DEVNULL`` or an open file; None keeps this process's own."""


class Children:
    """The processes one run started; ``stop_all`` ends each of them and what it started."""

    def __init__(self) -> None:
        self._started: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        argv: Sequence[str],
        *,
        output: Output = subprocess.DEVNULL,
        stderr: Output = subprocess.STDOUT,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        nofile: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """``argv`` in a new process group; ``output`` a path is a log file (truncated), ``stderr``
        STDOUT joins it (None for ``output``: both stay this process's); ``nofile`` sets the child's
        descriptor limit."""
        stdout, log = _open(output)
        if stderr == subprocess.STDOUT:
            stderr = None if output is None else stderr
        errors, errors_log = _open(stderr) if stderr != subprocess.STDOUT else (subprocess.STDOUT, None)
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=stdout,
                stderr=errors,
                cwd=cwd,
                env=None if env is None else dict(env),
                start_new_session=True,
                preexec_fn=_descriptor_limit(nofile),
            )
        finally:
            for opened in (log, errors_log):
                if opened is not None:
                    opened.close()
        self._started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
        """SIGTERM to ``proc``'s group; SIGKILL to its tree and group after ``grace_s``."""
        self._stop([proc], grace_s)

    def stop_all(self, grace_s: float = GRACE_S) -> None:
        """Every child at once (a gateway's drain delay is waited out once, not once per gateway)."""
        self._stop(list(self._started), grace_s)

    def _stop(self, procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
        trees = [_tree(proc.pid) if proc.poll() is None else [] for proc in procs]
        for proc in procs:
            if proc in self._started:
                self._started.remove(proc)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline_s = time.monotonic() + grace_s
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline_s - time.monotonic()))
        for proc, tree in zip(procs, trees, strict=True):
            for left in tree:
                with contextlib.suppress(psutil.Error):
                    left.kill()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@contextlib.contextmanager
def children() -> Iterator[Children]:
    """A ``Children`` whose processes are all stopped when the block ends, however it ends."""
    started = Children()
    with _sigterm_as_exit():
        try:
            yield started
        finally:
            started.stop_all()


def _open(output: Output) -> tuple[int | IO[bytes] | None, IO[bytes] | None]:
    if isinstance(output, Path):
        output.parent.mkdir(parents=True, exist_ok=True)
        log = output.open("wb")
        return log, log
    return output, None


def _descriptor_limit(nofile: int | None) -> Callable[[], None] | None:
    if nofile is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return apply


def _tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it now; psutil refuses to signal one whose pid was reused."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``SystemExit`` (the default would end this process with
    its children still running); only from the main thread, and only over the default handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return

    def leave(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
