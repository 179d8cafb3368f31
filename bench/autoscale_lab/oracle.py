"""What one replica can do, what a trace demands of the fleet, and the oracle's schedule.

``calibrate`` measures one engine of the profile directly: its prefill rate (prompt tokens per second
with full chunks) and its decode step at a full batch. ``demand`` turns a trace into replicas needed
per window with those figures and knowledge of the whole trace: each request costs its prefill time
plus its share of a decode slot for its output, and holds its KV for its lifetime; a window needs the
larger of its engine time and its KV, divided by a utilisation ``headroom_ratio``. The oracle is that
schedule followed with a cold start's lead (``scalers.follow``), and ``oracle`` searches the
headroom on the lab itself by bisection, for the leanest schedule that meets the SLO: the smallest
schedule of this shape that meets it (to the search's resolution), knowing the future.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.autoscale_lab.scenarios import Arrival
from kvgate.sim.engine import Engine
from kvgate.sim.profile import Profile

WINDOW_S = 30.0
HEADROOM_RANGE = (0.4, 1.0)
"""Utilisations the oracle's search bisects between."""
SEARCH_STEPS = 3


@dataclass(frozen=True, slots=True)
class Capacity:
    prefill_tokens_per_s: float
    """Prompt tokens per second one replica prefills with full chunks."""
    decode_step_s: float
    """One decode step of a full batch (the inter-token gap at saturation)."""
    sequences: int
    kv_tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        return self.sequences / self.decode_step_s

    def replica_seconds(self, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
        """(engine time as a share of one replica x seconds, KV token-seconds over capacity)."""
        prefill_s = prompt_tokens / self.prefill_tokens_per_s
        decode_s = output_tokens * self.decode_step_s
        engine = prefill_s + decode_s / self.sequences
        kv = (prompt_tokens + output_tokens / 2) * (prefill_s + decode_s) / self.kv_tokens
        return engine, kv


def calibrate(profile: Profile) -> Capacity:
    """One engine, no warm-up: eight 8k-token prompts for the prefill rate, then a full batch of
    1k-token prompts decoding 256 tokens each for the step time."""
    engine = Engine(profile, ready_s=-1e9)
    for i in range(8):
        engine.add_request(f"p{i}", range(i * 10**6, i * 10**6 + 8192), 1, 0.0, ignore_eos=True)
    now_s = 0.0
    while engine.has_work:
        now_s = engine.step(now_s).end_s
    prefill = 8 * 8192 / now_s
    engine = Engine(profile, ready_s=-1e9)
    for i in range(profile.max_num_seqs):
        engine.add_request(f"d{i}", range(i * 10**6, i * 10**6 + 1024), 256, 0.0, ignore_eos=True)
    start_s, steps, now_s = None, 0, 0.0
    while engine.has_work:
        result = engine.step(now_s)
        if result.num_prefill_seqs == 0:
            start_s = now_s if start_s is None else start_s
            steps += 1
        now_s = result.end_s
    step_s = (now_s - (start_s or 0.0)) / max(1, steps)
    return Capacity(prefill, step_s, profile.max_num_seqs, profile.kv_capacity_tokens)


def load(arrivals: Sequence[Arrival], capacity: Capacity, duration_s: float) -> list[float]:
    """Replicas' worth of work per ``WINDOW_S`` window, at full utilisation (the larger of engine
    time and KV), each request counted in the window it arrives in."""
    windows = math.ceil(duration_s / WINDOW_S)
    engine = [0.0] * windows
    kv = [0.0] * windows
    for a in arrivals:
        w = min(windows - 1, int(a.arrival_s // WINDOW_S))
        e, k = capacity.replica_seconds(a.prompt_tokens, a.output_tokens)
        engine[w] += e
        kv[w] += k
    return [max(e, k) / WINDOW_S for e, k in zip(engine, kv, strict=True)]


def schedule(work: Sequence[float], headroom_ratio: float, min_replicas: int, max_replicas: int) -> list[int]:
    return [max(min_replicas, min(max_replicas, math.ceil(w / headroom_ratio - 1e-9))) for w in work]


@dataclass(frozen=True, slots=True)
class OracleChoice:
    headroom_ratio: float
    schedule: tuple[int, ...]
    tried: tuple[tuple[float, float], ...]
    """(headroom, SLO attainment) of each schedule tried."""


def search(
    attainment: Callable[[Sequence[int]], float],
    work: Sequence[float],
    target_ratio: float,
    min_replicas: int,
    max_replicas: int,
) -> OracleChoice:
    """The leanest headroom whose schedule reaches ``target_ratio`` in the lab (``attainment`` runs
    it): bisection over ``HEADROOM_RANGE`` in ``SEARCH_STEPS`` runs, then the lowest headroom if none
    of them passed; the best schedule tried when none does."""
    tried: list[tuple[float, float, list[int]]] = []

    def attempt(headroom: float) -> bool:
        plan = schedule(work, headroom, min_replicas, max_replicas)
        good = attainment(plan)
        tried.append((headroom, good, plan))
        return good >= target_ratio

    low, high = HEADROOM_RANGE
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        if attempt(middle):
            low = middle
        else:
            high = middle
    passed = [t for t in tried if t[1] >= target_ratio]
    if not passed and attempt(HEADROOM_RANGE[0]):
        passed = [tried[-1]]
    headroom, _, plan = max(passed, key=lambda t: t[0]) if passed else max(tried, key=lambda t: t[1])
    return OracleChoice(headroom, tuple(plan), tuple((h, g) for h, g, _ in tried))
