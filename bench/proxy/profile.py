"""Where the gateway's time goes, from py-spy's raw collapsed stacks (``--py-spy FILE``)."""

from __future__ import annotations

import re
from collections import Counter


def summarize_profile(path: str, top: int = 25) -> list[tuple[str, float]]:
    """The functions that most samples pass through, with their share of the samples.

    Reads py-spy's raw collapsed stacks (``frame;frame;... count``). Only samples taken while
    uvicorn serves count (not start-up, not imports), and the frames nearly every sample passes
    through (the runner, the event loop's entry) are left out: they say nothing about where a
    request's time goes. py-spy samples wall time of a running thread, so a process descheduled
    inside a system call (a socket write on a busy machine) charges that call more than its CPU."""
    through: Counter[str] = Counter()
    total = 0
    with open(path) as stacks:
        for line in stacks:
            stack, _, count = line.rstrip().rpartition(" ")
            if "uvicorn/" not in stack or "_find_and_load" in stack:
                continue
            samples = int(count)
            total += samples
            for function in {re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")}:
                through[function] += samples
    if not total:
        return []
    ranked = [(function, n / total) for function, n in through.most_common() if n / total < 0.95]
    return ranked[:top]
