"""The one process reaper: whatever a benchmark started is gone when its block ends, however it ends,
the children its children started included (in the same process group or out of it)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.harness.processes import Children, children
from bench.harness.ready import wait_line

DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
PARENT = f"""
import signal, subprocess, sys, time
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", {DEAF!r}], start_new_session=sys.argv[2] == "own-group")
print(grandchild.pid, flush=True)
time.sleep(60)
"""


def start(started: Children, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    parent = started.start([sys.executable, "-c", PARENT, *args], output=subprocess.PIPE, stderr=None)
    return parent, int(wait_line(parent))


def gone(pid: int) -> bool:
    """Dead within a few seconds (a SIGKILL lands at once, but is not seen at once): exited, or a
    zombie its new parent has not reaped."""
    deadline_s = time.monotonic() + 5.0
    while time.monotonic() < deadline_s:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


def test_a_block_that_raises_still_stops_each_child_and_what_it_started() -> None:
    with pytest.raises(RuntimeError, match="the benchmark failed"), children() as started:
        parent, grandchild = start(started, "obey", "same-group")
        raise RuntimeError("the benchmark failed")
    assert parent.returncode is not None
    assert gone(grandchild)


@pytest.mark.parametrize("group", ["same-group", "own-group"])
def test_a_child_deaf_to_sigterm_is_killed_after_the_grace_period_with_its_tree(group: str) -> None:
    started = Children()
    parent, grandchild = start(started, "ignore-term", group)
    started.stop(parent, grace_s=0.2)
    assert parent.returncode == -9
    assert gone(grandchild)
    started.stop_all()


def test_a_child_stopped_by_hand_is_not_stopped_again() -> None:
    with children() as started:
        parent, grandchild = start(started, "obey", "same-group")
        started.stop(parent)
        assert parent.returncode is not None and gone(grandchild)
    assert parent.returncode is not None
