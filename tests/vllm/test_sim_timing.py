"""A simulator profile fitted to the real tiny replica predicts its latencies under the same load.

``kvgate sim calibrate`` measures the replica (time to first token against prompt length, inter-token
latency against batch size, from its own histograms) and fits the step model; ``kvgate sim
--profile`` then serves the fitted profile, and the same load is played against it. The acceptance
measurement: over the load, the simulator's TTFT and ITL are within 25 % of the real replica's
(medians of each point, then the mean over the points, so no one point outweighs the rest). The two
shared cores make any single block noisy, which is why every point is a median over rounds and the
rounds interleave every point. Check points (a prompt length and batch sizes the fit never saw,
measured in the same rounds) are printed with the rest, as the docs' table shows them."""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.calibration import Calibration, CalibrationPlan, ReplicaProbe, calibrate, fitted_fields
from kvgate.sim.ports import free_ports
from kvgate.sim.profile import DEFAULT_PROFILE, PROFILES
from kvgate.sim.profile_file import load_profile, profile_document
from kvgate.sim.step_fit import ItlPoint, TtftPoint
from tests.vllm.conftest import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, cache_config
from tests.vllm.servers import SERVED_MODEL, VllmServer

pytestmark = pytest.mark.vllm

PLAN = CalibrationPlan(
    prompt_tokens=(16, 512, 1024, 2048),
    batches=(1, 2, 4, 8, 16),
    repeats=5,
    check_prompt_tokens=(768,),
    check_batches=(3, 6),
)
TOLERANCE = 0.25


@asynccontextmanager
async def simulator(profile_file: Path) -> AsyncIterator[str]:
    """``kvgate sim --profile FILE`` in its own process (its step loop must not share the test's)."""
    port = free_ports()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "kvgate", "sim", "--profile", str(profile_file), "--model", SERVED_MODEL),
        *("--port", str(port), "--control-port", str(free_ports()), "--cold-start-s", "0"),
        stdout=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_until_ok(http, url + "/health")
        yield url
    finally:
        process.terminate()
        await process.wait()


async def test_calibrate_fits_a_profile_the_simulator_serves_as_the_replica(
    replica: VllmServer, tmp_path: Path
) -> None:
    out = tmp_path / "tiny-cpu.yaml"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "kvgate", "sim", "calibrate", "--target", replica.url, "--out", str(out), "--repeats", "1"),
        *("--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)),
        stdout=asyncio.subprocess.PIPE,
    )
    printed, _ = await process.communicate()
    assert process.returncode == 0, printed
    profile = load_profile(str(out))
    reported = await cache_config(replica.url)
    assert (profile.kv_capacity_tokens, profile.block_size_tokens) == (
        int(reported["kv_cache_size_tokens"]),
        int(reported["block_size"]),
    )
    async with simulator(out) as url:
        assert (await cache_config(url))["kv_cache_size_tokens"] == reported["kv_cache_size_tokens"]
        async with aiohttp.ClientSession() as http, http.get(url + "/v1/models") as response:
            card = (await response.json())["data"][0]
    assert (card["id"], card["max_model_len"]) == (SERVED_MODEL, profile.max_model_len)


async def test_a_fitted_profile_predicts_the_replicas_ttft_and_itl(
    replica: VllmServer, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        real = await calibrate(await ReplicaProbe.connect(http, replica.url), PLAN)
        fields = fitted_fields(real, PROFILES[DEFAULT_PROFILE], MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS)
        profile_file = tmp_path / "fitted.yaml"
        profile_file.write_text(profile_document(DEFAULT_PROFILE, "tiny-cpu", fields, []))
        async with simulator(profile_file) as url:
            simulated = await calibrate(await ReplicaProbe.connect(http, url), PLAN)
    rows = comparison(real, simulated)
    print("\n".join(["", *rows]))
    ttft_error = load_error(ttft_of(real.ttft), ttft_of(simulated.ttft))
    itl_error = load_error(itl_of(real.itl), itl_of(simulated.itl))
    assert abs(ttft_error) <= TOLERANCE and abs(itl_error) <= TOLERANCE, "\n".join(rows)


def ttft_of(points: Sequence[TtftPoint]) -> dict[int, float]:
    return medians([(p.prompt_tokens, p.ttft_s) for p in points])


def itl_of(points: Sequence[ItlPoint]) -> dict[int, float]:
    return medians([(p.batch, p.itl_s) for p in points])


def medians(pairs: Sequence[tuple[int, float]]) -> dict[int, float]:
    grouped: dict[int, list[float]] = {}
    for key, value in pairs:
        grouped.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in sorted(grouped.items())}


def load_error(real: dict[int, float], simulated: dict[int, float]) -> float:
    """The simulator's mean over the points of the per-point medians, relative to vLLM's."""
    return statistics.fmean(simulated[k] for k in real) / statistics.fmean(real.values()) - 1


def comparison(real: Calibration, simulated: Calibration) -> list[str]:
    """The docs' table: each point's median on vLLM and on the fitted simulator."""
    rows = ["| load | vLLM (ms) | simulator (ms) | error |", "|---|---|---|---|"]
    sections = [
        ("TTFT, prompt {} tokens", ttft_of(real.ttft), ttft_of(simulated.ttft)),
        ("TTFT, prompt {} tokens (check)", ttft_of(real.check_ttft), ttft_of(simulated.check_ttft)),
        ("ITL, batch {}", itl_of(real.itl), itl_of(simulated.itl)),
        ("ITL, batch {} (check)", itl_of(real.check_itl), itl_of(simulated.check_itl)),
    ]
    for label, real_medians, sim_medians in sections:
        for point, real_s in real_medians.items():
            sim_s = sim_medians[point]
            error = sim_s / real_s - 1
            rows.append(f"| {label.format(point)} | {real_s * 1e3:.2f} | {sim_s * 1e3:.2f} | {error:+.0%} |")
    for name, real_medians, sim_medians in (
        ("TTFT", ttft_of(real.ttft), ttft_of(simulated.ttft)),
        ("ITL", itl_of(real.itl), itl_of(simulated.itl)),
    ):
        rows.append(f"| {name}, over the load | | | {load_error(real_medians, sim_medians):+.0%} |")
    return rows
