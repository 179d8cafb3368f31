"""The pieces of the chaos benchmark (``bench.bench_chaos``): hostile clients, gauges, processes.

Clients come in three kinds. ``StreamClient`` sends one completion over aiohttp and classifies how it
ended: a complete answer, an OpenAI-shaped error, a stream that ended with an error event and
``[DONE]``, left by the client on purpose, or *lost* (a reset, an incomplete stream, a body that is no
OpenAI error): the one outcome a gateway must never produce. The raw-socket attackers (slowloris,
slow bodies, slow readers) speak HTTP/1.1 by hand, since a well-behaved client library cannot be
made to misbehave. ``Processes`` starts ``kvgate sim``, ``kvgate serve`` and a private
``redis-server`` on free loopback ports, each with its output in a log file, and stops them all.
A gateway config is validated before use; keys today's gateway does not know (settings other work
is adding) are dropped, named, and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config.loader import ConfigError, parse_config
from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.ports import free_ports

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KVGATE = os.path.join(os.path.dirname(sys.executable), "kvgate")
WORK_GAUGES = (
    "kvgate_queued_requests",
    "kvgate_queued_prompt_tokens",
    "kvgate_pending_prompt_tokens",
    "kvgate_resident_sequences",
    "kvgate_remaining_decode_tokens",
)
KV_ESTIMATE = "kvgate_pool_kv_occupancy_ratio"
DONE = b"data: [DONE]\n\n"

COMPLETE = "complete"
ERROR_ANSWER = "openai_error"
STREAM_ERROR = "stream_error_event"
LEFT = "left_by_client"
LOST = "lost"


async def wait_ready(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes]) -> None:
    """``wait_until_ok``, but a process that exited during start-up fails at once."""
    waiting = asyncio.ensure_future(wait_until_ok(session, url))
    while not waiting.done():
        if proc.poll() is not None:
            waiting.cancel()
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        await asyncio.wait({waiting}, timeout=0.2)
    waiting.result()


def completion_body(max_tokens: int, prompt_words: int = 40, stream: bool = True, **extra: Any) -> bytes:
    prompt = " ".join(f"w{i}" for i in range(prompt_words))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    return orjson.dumps({**body, **extra})


def is_openai_error(body: bytes) -> bool:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)


@dataclass(slots=True)
class Outcome:
    kind: str = LOST
    status: int | None = None
    detail: str = ""
    headers_at_s: float | None = None
    first_chunk_at_s: float | None = None


@dataclass(slots=True)
class StreamClient:
    """One request; ``leave`` set means "hang up now" (from wherever the request is)."""

    url: str
    body: bytes
    leave: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome = field(default_factory=Outcome)

    async def run(self, session: aiohttp.ClientSession) -> Outcome:
        task = asyncio.ensure_future(self._exchange(session))
        leave = asyncio.ensure_future(self.leave.wait())
        await asyncio.wait({task, leave}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.outcome.kind = LEFT
        leave.cancel()
        return self.outcome

    async def _exchange(self, session: aiohttp.ClientSession) -> None:
        outcome = self.outcome
        start = time.monotonic()
        try:
            headers = {"content-type": "application/json"}
            async with session.post(self.url, data=self.body, headers=headers) as response:
                outcome.status = response.status
                outcome.headers_at_s = time.monotonic() - start
                if response.status != 200:
                    body = await response.read()
                    ok = is_openai_error(body)
                    outcome.kind = ERROR_ANSWER if ok else LOST
                    outcome.detail = body[:200].decode(errors="replace")
                    return
                if not response.content_type.startswith("text/event-stream"):
                    answer = await response.read()
                    outcome.first_chunk_at_s = time.monotonic() - start
                    whole = b'"choices"' in answer and answer.rstrip().endswith(b"}")
                    outcome.kind = COMPLETE if whole else LOST
                    outcome.detail = "" if whole else f"incomplete JSON answer: {answer[-120:]!r}"
                    return
                tail = b""
                async for chunk in response.content.iter_any():
                    if outcome.first_chunk_at_s is None:
                        outcome.first_chunk_at_s = time.monotonic() - start
                    tail = (tail + chunk)[-4096:]
                self._classify_stream(tail)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            outcome.kind = LOST
            outcome.detail = f"{type(exc).__name__}: {exc}"[:200]

    def _classify_stream(self, tail: bytes) -> None:
        outcome = self.outcome
        if not tail.endswith(DONE):
            outcome.kind, outcome.detail = LOST, f"stream ended without [DONE]: {tail[-120:]!r}"
            return
        last = tail[: -len(DONE)].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        if last.startswith(b"data: ") and is_openai_error(last[6:]):
            outcome.kind, outcome.detail = STREAM_ERROR, last[6:200].decode(errors="replace")
            return
        outcome.kind = COMPLETE


# -- gauges ----------------------------------------------------------------------------------------


async def read_metrics(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """The page parsed (a page that does not parse raises): every sample as ``name{labels}`` ->
    value, plus each work gauge summed over its labels and the pools' estimated KV occupancy."""
    async with session.get(base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as response:
        text = await response.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
            if family.name in WORK_GAUGES:
                values[family.name] = values.get(family.name, 0.0) + sample.value
            if family.name == KV_ESTIMATE and sample.labels.get("source") == "estimate":
                values[KV_ESTIMATE] = values.get(KV_ESTIMATE, 0.0) + sample.value
    return values


def work_of(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics.get(name, float("nan")) for name in (*WORK_GAUGES, KV_ESTIMATE)}


async def wait_drained(
    session: aiohttp.ClientSession, base_url: str, bound_s: float
) -> tuple[float | None, dict[str, float]]:
    """Seconds until every work gauge reads 0 (None: not within ``bound_s``), and the last reading."""
    start = time.monotonic()
    while True:
        work = work_of(await read_metrics(session, base_url))
        if all(v == 0 for v in work.values()):
            return time.monotonic() - start, work
        if time.monotonic() - start > bound_s:
            return None, work
        await asyncio.sleep(0.1)


# -- raw-socket attackers --------------------------------------------------------------------------


@dataclass(slots=True)
class RawResult:
    closed_at_s: float | None = None
    """When the server answered or closed the connection, from the attack's start."""
    first_bytes: bytes = b""
    how: str = "open"
    """``open`` (still at the end), ``answered``, ``closed`` (EOF), ``reset`` or ``refused``."""


async def trickle(
    port: int, head: bytes, drip: bytes, every_s: float, hold_s: float, started_s: float
) -> RawResult:
    """Send ``head``, then ``drip`` every ``every_s`` for ``hold_s``: a slowloris (partial headers) or
    a slow body, depending on ``head``. Watches for the server answering or closing."""
    result = RawResult()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        result.how = "refused"
        result.closed_at_s = time.monotonic() - started_s
        return result
    try:
        writer.write(head)
        end = started_s + hold_s
        while time.monotonic() < end:
            try:
                data = await asyncio.wait_for(reader.read(256), timeout=every_s)
            except TimeoutError:
                writer.write(drip)
                continue
            result.closed_at_s = time.monotonic() - started_s
            result.first_bytes = data[:64]
            result.how = "answered" if data else "closed"
            return result
    except OSError:
        result.closed_at_s = time.monotonic() - started_s
        result.how = "reset"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return result


def slow_reader_socket(port: int, body: bytes) -> socket.socket:
    """A connection that sends a streaming request and then never reads: a tiny receive buffer, so
    the gateway's writes back up at once instead of filling megabytes of loopback buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    sock.sendall(head + body)
    sock.setblocking(False)
    return sock


# -- processes -------------------------------------------------------------------------------------


def validate_config(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` as today's gateway accepts it, and the keys it had to drop (unknown today)."""
    dropped: list[str] = []
    while True:
        try:
            parse_config(data, {})
            return data, dropped
        except ConfigError as exc:
            unknown = [p.key for p in exc.problems if p.message == "unknown key"]
            if not unknown or len(unknown) != len(exc.problems):
                raise
            for key in unknown:
                section, _, name = key.rpartition(".")
                target: Any = data
                for part in section.split(".") if section else []:
                    target = target[int(part)] if isinstance(target, list) else target[part]
                del target[name]
                dropped.append(key)


def _nofile(limit: int | None) -> Callable[[], None] | None:
    if limit is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


class Processes:
    """Every process a scenario started, with their logs in ``log_dir``; ``stop_all`` ends them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[subprocess.Popen[bytes]] = []
        self.unknown_keys: list[str] = []

    def _spawn(
        self, argv: list[str], log_name: str, preexec: Callable[[], None] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / log_name, "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec)
        log.close()
        self._procs.append(proc)
        return proc

    async def sim(self, session: aiohttp.ClientSession, name: str, replicas: int, *extra: str) -> list[str]:
        """The replicas' URLs; the simulator's control API listens on the port after the last one."""
        port = free_ports(replicas + 1)
        argv = [KVGATE, "sim", "--replicas", str(replicas), "--port", str(port), "--cold-start-s", "0"]
        argv += ["--control-port", str(port + replicas)]
        proc = self._spawn([*argv, *extra], f"{name}-sim.log")
        urls = [f"http://127.0.0.1:{port + i}" for i in range(replicas)]
        for url in urls:
            await wait_ready(session, url + "/health", proc)
        return urls

    async def gateway(
        self, session: aiohttp.ClientSession, name: str, data: dict[str, Any], nofile: int | None = None
    ) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_ports()
        data = {**data, "server": {**data.get("server", {}), "host": "127.0.0.1", "port": port}}
        data, dropped = validate_config(data)
        self.unknown_keys += [k for k in dropped if k not in self.unknown_keys]
        path = self.log_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        argv = [KVGATE, "serve", "--config", str(path), "--log-level", "info"]
        proc = self._spawn(argv, f"{name}.log", _nofile(nofile))
        url = f"http://127.0.0.1:{port}"
        await wait_ready(session, url + "/readyz", proc)
        return url, proc

    def redis(self, name: str, port: int) -> subprocess.Popen[bytes]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found")
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        return self._spawn(argv, f"{name}-redis.log")

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def stop_all(self) -> None:
        for proc in reversed(self._procs):
            self.stop(proc)
        self._procs = []


def tracebacks(log: Path) -> list[str]:
    """The last line of each traceback in a log (the exception), in order."""
    lines = log.read_text(errors="replace").splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1
            found.append(lines[j][:160] if j < len(lines) else "?")
    return found


def footprint(proc: subprocess.Popen[bytes]) -> tuple[float, int]:
    """The process's resident memory (MiB) and open descriptors."""
    p = psutil.Process(proc.pid)
    return p.memory_info().rss / 2**20, p.num_fds()
