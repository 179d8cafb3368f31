"""``--loop-lag``: the event-loop stall per huge prompt counted by each checkout's own prompt encoder,
in a child process of its own (``bench.neighbours.encoder_stall``), alternated round after round."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import orjson

from bench.neighbours import encoder_stall
from bench.neighbours.phases import FITS_WINDOW_TOKENS, MODEL, WINDOW_TOKENS, quantile
from bench.neighbours.prompts import shaped_prompt

CHILD = encoder_stall.__file__
"""Run as a file, not a module, so that nothing of this checkout's ``bench`` is imported there."""


def loop_lag(
    checkouts: list[Path], rounds: int, prompts: int, out: Path, shapes: tuple[str, ...] = ("words",)
) -> None:
    """Each checkout's encoder in a child process of its own, alternated ``rounds`` times per variant;
    prints the stall per huge prompt (the ticker's longest oversleep while it is handled): median,
    p90 and max per checkout and variant."""
    print(f"event-loop stall per 1 MB prompt counted by the gateway's encoder, {prompts} prompts a child")
    prompt_files = {shape: (out / f"huge-prompt-{shape}.txt").resolve() for shape in shapes}
    for shape, prompt_file in prompt_files.items():
        prompt_file.write_text(shaped_prompt(shape, 1_000_000))
    stalls: dict[tuple[str, str, str], list[float]] = {}
    for i in range(rounds):
        for variant, shape in ((v, s) for v in ("over", "fits") for s in shapes):
            prompt_file = prompt_files[shape]
            for checkout in checkouts:
                window = str(FITS_WINDOW_TOKENS if variant == "fits" else WINDOW_TOKENS)
                command = [sys.executable, CHILD, MODEL, window, str(prompts), str(prompt_file)]
                env = {**os.environ, "PYTHONPATH": str(checkout)}
                printed = subprocess.run(
                    command, cwd=checkout, env=env, capture_output=True, check=True
                ).stdout
                these = orjson.loads(printed.splitlines()[-1])
                stalls.setdefault((variant, shape, checkout.name), []).extend(these)
                print(
                    f"round {i + 1}/{rounds} {variant:<5} {shape:<11} {checkout.name:<8} stall median "
                    f"{statistics.median(these) * 1e3:6.2f} ms max {max(these) * 1e3:6.2f} ms",
                    flush=True,
                )
    print(
        f"\n{'variant':<8} {'shape':<12} {'gateway':<10} {'prompts':>7} {'median ms':>10} {'p90 ms':>7} "
        f"{'max ms':>7}"
    )
    for (variant, shape, name), values in stalls.items():
        print(
            f"{variant:<8} {shape:<12} {name:<10} {len(values):>7} {statistics.median(values) * 1e3:>10.2f} "
            f"{quantile(values, 0.9) * 1e3:>7.2f} {max(values) * 1e3:>7.2f}"
        )
