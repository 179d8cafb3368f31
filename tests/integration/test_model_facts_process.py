"""``kvgate serve`` reads what its replicas serve and says where the config disagrees, in one log
format: a real gateway process in front of simulated vLLM replicas on loopback, its stderr read
line by line as JSON."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson

from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL
from tests.integration.processes import KVGATE, serving_process, stop

SIM_MAX_MODEL_LEN = 4096
SIM_KV_TOKENS = 20000


def events(path: Path) -> list[dict[str, Any]]:
    """Every line the process wrote on stderr, each one JSON object (or the test fails)."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def messages(path: Path) -> str:
    return "\n".join(str(e["event"]) for e in events(path))


async def test_serve_refuses_an_unserved_model_names_both_windows_and_logs_its_fleet(tmp_path: Path) -> None:
    overrides = {"warmup_s": 0, "max_model_len": SIM_MAX_MODEL_LEN, "kv_capacity_tokens": SIM_KV_TOKENS}
    async with SimFleet(replicas=2, time_scale=0.0, overrides=overrides) as fleet:
        port = free_ports()
        config = {
            "server": {"host": "127.0.0.1", "port": port, "drain_delay_s": 0},
            "health": {"interval_s": 0.2, "timeout_s": 1.0},
            "models": [
                {"name": MODEL, "max_model_len": 8192, "kv_bytes_per_token": 131072},
                {"name": "not-deployed", "max_model_len": 8192, "kv_bytes_per_token": 131072},
            ],
            "pools": [{"name": "chat", "replicas": fleet.urls}],
        }
        log = tmp_path / "stderr.jsonl"
        with log.open("wb") as stderr:
            async with serving_process(tmp_path, config, stderr=stderr) as (url, process):
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    served = await http.post(
                        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}
                    )
                    refused = await http.post(
                        "/v1/completions", json={"model": "not-deployed", "prompt": "hi", "max_tokens": 4}
                    )
                assert served.status_code == 200, served.text
                assert refused.status_code == 503, refused.text
                assert await stop(process) == 0
    text = messages(log)
    for replica in fleet.urls:
        assert f"replica {replica} (" in text
        assert f"does not serve ['not-deployed'], configured for its pool; it serves ['{MODEL}']" in text
        assert f"serves {MODEL} with max_model_len {SIM_MAX_MODEL_LEN} tokens but models.{MODEL}" in text
    assert "max_model_len is 8192: a request between the two is a 400" in text
    start = next(e for e in events(log) if str(e["event"]).startswith("pool chat"))
    assert start["level"] == "info" and start["logger"] == "kvgate.scrape"
    assert f"2 replica(s), 2 answering, {2 * SIM_KV_TOKENS} KV tokens discovered" in start["event"]
    assert f"{SIM_KV_TOKENS} KV tokens (reported)" in start["event"]
    assert any(e["logger"].startswith("uvicorn") for e in events(log)), "uvicorn's lines are JSON too"


async def test_serve_warns_when_no_replica_answers_at_start(tmp_path: Path) -> None:
    dead = free_ports()
    config = {
        "server": {"host": "127.0.0.1", "port": free_ports()},
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "models": [{"name": MODEL, "max_model_len": 8192, "kv_bytes_per_token": 131072}],
        "pools": [{"name": "chat", "replicas": [f"http://127.0.0.1:{dead}"]}],
    }
    config_file = tmp_path / "kvgate.yaml"
    config_file.write_bytes(orjson.dumps(config))
    log = tmp_path / "stderr.jsonl"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            KVGATE, "serve", "--config", str(config_file), stderr=stderr
        )
        try:
            for _ in range(300):
                if log.stat().st_size and "no replica answered" in log.read_text():
                    break
                await asyncio.sleep(0.05)
        finally:
            process.kill()
            await process.wait()
    warning = next(e for e in events(log) if "no replica answered" in str(e["event"]))
    assert warning["level"] == "warning"
    assert f"http://127.0.0.1:{dead} (chat-" in messages(log) and "not answering" in messages(log)
