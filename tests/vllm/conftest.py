"""The vllm tier's fixtures: the tiny model, real vLLM replicas, and ``kvgate serve`` in front of them.

``make test-vllm`` installs vLLM into its own environment and names its interpreter in
``KVGATE_VLLM_PYTHON``. A replica takes half a minute or more to start and about 3 GB of memory, so
one is shared by the whole session, and a test that must break a replica (kill it, drain it)
starts a second of its own, never more than two at once.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvgate.sim.ports import free_ports
from tests.vllm.servers import MAX_MODEL_LEN, SERVED_MODEL, VllmServer, start_vllm
from tests.vllm.tiny_model import HEAD_DIM, HEADS, LAYERS

TINY_MODEL_SCRIPT = Path(__file__).parent / "tiny_model.py"
MAX_NUM_SEQS = 128
"""vLLM's --max-num-seqs on a CPU (it is not on /metrics; the gateway's pool is told)."""
MAX_NUM_BATCHED_TOKENS = 2048
"""vLLM's --max-num-batched-tokens on a CPU: one prefill step's budget."""


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = os.environ.get("KVGATE_VLLM_PYTHON")
    if not python:
        pytest.fail("KVGATE_VLLM_PYTHON is not set: run this tier with `make test-vllm`")
    return Path(python)


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    command = [str(vllm_python), str(TINY_MODEL_SCRIPT), str(model_dir)]
    subprocess.run(command, check=True, capture_output=True)
    return model_dir


@pytest.fixture(scope="session")
def vllm_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def replica(vllm_python: Path, tiny_model: Path, vllm_logs: Path) -> Iterator[VllmServer]:
    """The session's shared replica: vLLM's CPU defaults, prefix caching on."""
    server = start_vllm(vllm_python, tiny_model, vllm_logs)
    try:
        yield server
    finally:
        server.stop()


SpareReplica = Callable[..., AbstractContextManager[VllmServer]]


@pytest.fixture
def spare_replica(vllm_python: Path, tiny_model: Path, vllm_logs: Path) -> SpareReplica:
    """Start a second replica with extra flags, for a test that breaks it; stopped on exit."""

    @contextmanager
    def start(*flags: str) -> Iterator[VllmServer]:
        server = start_vllm(vllm_python, tiny_model, vllm_logs, *flags)
        try:
            yield server
        finally:
            server.stop()

    return start


def gateway_config(urls: list[str], **sections: Any) -> dict[str, Any]:
    """``kvgate serve``'s config for the tiny model on ``urls``: its KV size from its architecture,
    prompts counted by the replica's own ``/tokenize``, capacity discovered from each replica's
    ``vllm:cache_config_info``; ``sections`` are merged over these."""
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": free_ports(), "drain_delay_s": 0},
        "health": {"interval_s": 0.2, "timeout_s": 2.0},
        "models": [
            {
                "name": SERVED_MODEL,
                "max_model_len": MAX_MODEL_LEN,
                "tokenizer": {"kind": "replica"},
                "architecture": {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD_DIM, "dtype_bytes": 2},
            }
        ],
        "pools": [{"name": "default", "replicas": urls, "max_sequences": MAX_NUM_SEQS}],
        "routing": {"warmup_s": 0},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


async def metric_total(url: str, name: str) -> float:
    """The sum of every sample of ``name`` on ``url``'s ``/metrics`` (0 when absent)."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def cache_config(url: str) -> dict[str, str]:
    """The labels of the replica's ``vllm:cache_config_info``: its KV cache as it reports it."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
        page = await response.text()
    info = next(line for line in page.splitlines() if line.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', info))
