"""``kvgate sim calibrate`` as an operator runs it, here against a simulated replica (the vllm tier
runs it against a real one): it measures through the replica's own latency histograms, prints
measured against fitted, and writes a profile file that ``kvgate sim --profile`` loads, carrying the
replica's KV cache and window as it reports them. And the front end's latency a fitted profile
carries is spent before a request is scheduled, and counted in its time to first token."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

from kvgate.sim.fleet import SimFleet
from kvgate.sim.profile_file import load_profile

SIM_PROFILE = {"kv_capacity_tokens": 64_000, "max_model_len": 8192, "warmup_s": 0, "seq_overhead_s": 0.0005}


async def test_calibrate_writes_a_profile_the_simulator_loads(tmp_path: Path) -> None:
    out = tmp_path / "fitted.yaml"
    async with SimFleet(replicas=1, model="tiny", time_scale=0.0, overrides=SIM_PROFILE) as fleet:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "kvgate", "sim", "calibrate", "--target", fleet.urls[0] + "/v1", "--out", str(out)),
            *("--repeats", "1", "--prompt-tokens", "16,256,1024", "--batches", "1,4"),
            *("--check-batches", "2", "--max-num-seqs", "32"),
            stdout=asyncio.subprocess.PIPE,
        )
        printed, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, printed
    lines = printed.decode().splitlines()
    assert lines[0].split() == ["point", "measured", "fitted", "error"]
    assert any(line.startswith("ITL check batch 2") for line in lines)
    assert lines[-1] == f"wrote {out}"
    profile = load_profile(str(out))
    assert profile.name == "fitted"
    assert (profile.kv_capacity_tokens, profile.block_size_tokens, profile.max_model_len) == (
        64_000,
        16,
        8192,
    )
    assert (profile.max_num_seqs, profile.weights_bytes, profile.warmup_s) == (32, 0.0, 0.0)
    assert min(profile.t_fixed_s, profile.seq_overhead_s, profile.frontend_latency_s) >= 0
    assert "Use: kvgate sim --profile THIS_FILE --model tiny" in out.read_text()


async def test_calibrate_says_when_the_target_is_not_a_replica(tmp_path: Path) -> None:
    async with SimFleet(replicas=1, time_scale=0.0) as fleet:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "kvgate", "sim", "calibrate", "--target", fleet.urls[0], "--model", "other"),
            stderr=asyncio.subprocess.PIPE,
        )
        _, error = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert b"kvgate sim calibrate: error: cannot calibrate against" in error and b"'other'" in error


async def test_the_front_end_latency_comes_before_the_first_token() -> None:
    latency_s = 0.05
    overrides = {"warmup_s": 0, "frontend_latency_s": latency_s}
    async with (
        SimFleet(replicas=1, time_scale=1.0, overrides=overrides) as fleet,
        aiohttp.ClientSession() as http,
    ):
        body = {"prompt": "hello", "max_tokens": 2}
        async with http.post(fleet.urls[0] + "/v1/completions", json=body) as response:
            assert response.status == 200
        ttft = fleet.replicas[0].engine.stats.ttft_s
    assert ttft.count == 1 and ttft.sum >= latency_s, "measured from arrival, before the front end"
