"""What every measurement of the proxy benchmark runs against: four zero-delay backends in a process
of their own (``bench.proxy.backends``), and the gateway configured in front of them.

The gateway has admission and routing on, one model and one pool whose capacity no scenario fills,
health probes a minute apart (nothing fails here) and no drain delay, so it stops at once.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from bench.harness.gateway_config import Model, Pool, gateway_config
from bench.harness.processes import Children
from bench.harness.ready import wait_line
from kvgate.sim.ports import free_ports

MODEL = "bench-model"
BACKENDS = 4
CHUNKS = 50
PACE_HEADER = "x-bench-pace-ms"
PACE_PROMPT_PREFIX = "bench-pace-ms:"
"""The pace can also ride in the last message, which every router forwards: sglang-router drops
unknown headers and rewrites the body from its own request type (``user`` is lost, ``max_tokens``
becomes ``max_completion_tokens``)."""
NON_STREAM_REQUEST = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": CHUNKS}
NON_STREAM_BODY = orjson.dumps(NON_STREAM_REQUEST)
JSON_HEADERS = {"content-type": "application/json"}
CHAT_PATH = "/v1/chat/completions"


def config(backend_ports: Sequence[int], port: int) -> dict[str, Any]:
    replicas = [f"http://127.0.0.1:{p}" for p in backend_ports]
    return gateway_config(
        Pool(replicas, name="bench", kv_capacity_tokens=100000),
        port=port,
        model=Model(MODEL, max_model_len=8192),
        health={"interval_s": 60},
    )


def start_backends(children: Children) -> list[int]:
    """The backends' ports, once they listen."""
    first_port = free_ports(BACKENDS)
    ports = list(range(first_port, first_port + BACKENDS))
    command = [sys.executable, "-m", "bench.proxy.backends", ",".join(map(str, ports))]
    wait_line(children.start(command, output=subprocess.PIPE, stderr=None), b"ready")
    return ports
