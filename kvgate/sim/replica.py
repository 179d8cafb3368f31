"""One simulated vLLM replica: the OpenAI HTTP surface in front of one ``Engine``.

The routes and how a request becomes engine sequences are ``kvgate.sim.front_end``'s (``FrontEnd``,
which this class extends); here are the lifecycle and the step loop.

The replica owns a listening socket, the engine, and the loop that steps it. The loop asks the
engine for a step, sleeps the step's simulated duration times ``time_scale`` and then writes every
produced token straight to its client's transport, one write per connection per step. Simulated
time follows real time (divided by ``time_scale``) whenever the engine is idle. A loop that wakes
a little late catches up by sleeping less on the next steps; only a slip too large to catch up is
re-anchored and counted as lag, so ``lag_s / busy_s`` is the fraction by which the replica ran
slower than its schedule. With ``time_scale == 0`` nothing sleeps: simulated time advances by step
durations only, one step per loop turn.

Lifecycle: ``starting`` (port closed: connections refused) → ``ready`` ⇄ ``paused`` (accepts, never
answers) → ``draining`` (port closed, in-flight finish) → ``drained`` → ``removed``; or ``killed``
from anywhere (open connections reset mid-stream, port closed); ``failed`` if the port could not be
bound when loading ended.

Role: a ``mixed`` replica serves requests whole; a ``prefill`` or ``decode`` one serves its half of
vLLM's disaggregated serving (``kv_transfer``).

KV events: given a ``KvEventsConfig`` the replica publishes its cache's events over ZMQ as vLLM does
(``kv_publisher``), each step's batch once the step's tokens are out, from the moment it listens;
``GET /kv_event_sources`` says where, and ``POST /reset_prefix_cache`` (vLLM's dev-mode route) resets
the GPU prefix cache, announced with the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time

from kvgate.admission.tokenizer import ChatTemplate, TiktokenTokenizer, Tokenizer
from kvgate.sim.engine import Engine, StepResult
from kvgate.sim.exchange import Exchange
from kvgate.sim.front_end import FrontEnd
from kvgate.sim.http import Connection, Request
from kvgate.sim.kv_publisher import KvEventPublisher, KvEventsConfig
from kvgate.sim.kv_transfer import KvTransfers
from kvgate.sim.profile import Profile
from kvgate.sim.prompts import PromptEncoder
from kvgate.sim.protocol import (
    system_fingerprint,
)
from kvgate.sim.vllm_block_hash import BlockDigests
from kvgate.vocabulary.replica import Role

# A step loop that wakes late keeps its schedule (sleeping less next time) unless it fell this far
# behind in real seconds; beyond that it re-anchors on the clock and counts the gap as lag.
_CATCH_UP_REAL_S = 0.05


class SimReplica(FrontEnd):
    def __init__(
        self,
        index: int,
        profile: Profile,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        time_scale: float = 1.0,
        seed: int = 0,
        record_streams: bool = False,
        tokenizer: Tokenizer | None = None,
        chat_template: ChatTemplate | None = None,
        role: Role | str = Role.MIXED,
        kv_events: KvEventsConfig | None = None,
        digests: BlockDigests | None = None,
        prompt_tokens_details: bool = False,
    ) -> None:
        """``kv_events``: publish KV cache events there; ``digests``: the fleet's shared vLLM hashes;
        ``prompt_tokens_details``: report prompt tokens served from cache in ``usage``, as vLLM does
        with ``--enable-prompt-tokens-details``."""
        if time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self.role = parse_role(role)
        self.index = index
        self.profile = profile
        self.model = model
        self.host = host
        self.port = port
        self.time_scale = time_scale
        self.prompt_tokens_details = prompt_tokens_details
        self.state = "starting"
        self.publisher = KvEventPublisher(kv_events, host) if kv_events is not None else None
        if kv_events is not None and digests is None:
            digests = BlockDigests(os.environ.get("PYTHONHASHSEED"))
        self.engine = Engine(profile, seed=seed, digests=digests if kv_events is not None else None)
        self.max_model_len = min(profile.max_model_len, profile.kv_capacity_tokens)
        self.lag_s = 0.0
        self.fingerprint = system_fingerprint(seed, index)
        self._prompts = PromptEncoder(
            tokenizer or TiktokenTokenizer.from_name(),
            chat_template or ChatTemplate(),
            profile.block_size_tokens,
        )
        self._records: dict[str, bytearray] | None = {} if record_streams else None
        self._ids = itertools.count()
        self._id_prefix = f"sim{seed:x}r{index}-"
        self._conns: set[Connection] = set()
        self._transfers = KvTransfers(profile, time_scale, engine_id=self._id_prefix.rstrip("-"))
        """Prefill role: KV kept for a decode instance to pull."""
        self._pulls: set[asyncio.Task[None]] = set()
        self._exchanges: set[Exchange] = set()
        self._stalled: list[tuple[Connection, Request]] = []
        self._server: asyncio.Server | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._ready = asyncio.Event()
        self.error: OSError | None = None
        self._t0 = asyncio.get_running_loop().time()
        self._sim_end_s = 0.0
        self.created = int(time.time())

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where to subscribe to this replica's KV events (its port is known once it listens)."""
        return self.publisher.endpoint if self.publisher is not None else None

    def sim_now(self) -> float:
        """Simulated seconds since this replica was created."""
        if self.time_scale == 0:
            return self._sim_end_s
        return (asyncio.get_running_loop().time() - self._t0) / self.time_scale

    def recorded(self, request_id: str) -> bytes:
        """Body bytes sent for ``request_id`` (its ``X-Request-Id`` or response id); b"" if unknown."""
        if self._records is None:
            raise RuntimeError("replica was started without record_streams=True")
        return bytes(self._records.get(request_id, b""))

    # lifecycle
    async def start(self, cold_start_s: float = 0.0) -> None:
        """Load (port closed for ``cold_start_s * time_scale``), then listen and serve."""
        if cold_start_s > 0 and self.time_scale > 0:
            await asyncio.sleep(cold_start_s * self.time_scale)
        if self.state != "starting":
            return
        self._prompts.tokenizer.encode("load the vocabulary now, not on the first request")
        loop = asyncio.get_running_loop()
        try:
            if self.publisher is not None:
                self.publisher.start()
            self._server = await loop.create_server(
                lambda: Connection(self._handle, self._conns), self.host, self.port, reuse_address=True
            )
        except OSError as exc:
            if self.publisher is not None:
                self.publisher.close()
            self.state = "failed"
            self.error = exc
            self._ready.set()
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        self.engine.ready_s = self.sim_now()
        self._loop_task = asyncio.create_task(self._run(), name=f"sim-replica-{self.index}")
        self.state = "ready"
        self._ready.set()

    async def wait_ready(self) -> None:
        """Wait until the replica serves; raises the ``OSError`` if its port could not be bound."""
        await self._ready.wait()
        if self.error is not None:
            raise self.error

    def pause(self) -> None:
        if self.state == "ready":
            self.state = "paused"

    def resume(self) -> None:
        if self.state != "paused":
            return
        self.state = "ready"
        stalled, self._stalled = self._stalled, []
        for conn, request in stalled:
            if conn.transport is not None:
                self._handle(conn, request)
        self._wake.set()

    async def drain(self) -> None:
        """Stop accepting connections and wait for every in-flight request to finish."""
        if self.state in ("paused", "ready"):
            self.resume()
            self.state = "draining"
            self._close_listener()
        if self.state == "draining":
            await self._idle.wait()
            self.state = "drained"

    def kill(self) -> None:
        """Die abruptly: reset every open connection mid-stream and refuse the port."""
        if self.state in ("killed", "removed"):
            return
        self._close_listener()
        self._teardown()
        self.state = "killed"

    async def stop(self) -> None:
        self._close_listener()
        self._teardown()
        if self.state != "killed":
            self.state = "removed"
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _teardown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self.publisher is not None:
            self.publisher.close()
        for conn in list(self._conns):
            conn.abort()
        self.engine.abort_all()
        for task in self._pulls:
            task.cancel()
        self._transfers.clear()
        self._exchanges.clear()
        self._stalled.clear()
        self._idle.set()

    # engine loop
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        scale = self.time_scale
        catch_up_s = _CATCH_UP_REAL_S / scale if scale > 0 else 0.0
        continuing = False
        while True:
            if not engine.has_work or self.state == "paused":
                continuing = False
                self._wake.clear()
                await self._wake.wait()
                continue
            start_s = self._sim_end_s
            behind_s = self.sim_now() - start_s
            if not continuing or behind_s > catch_up_s:
                # Idle, or too far behind to catch up by sleeping less: re-anchor on the clock.
                start_s += max(0.0, behind_s)
                if continuing:
                    self.lag_s += behind_s
            result = engine.step(start_s)
            self._sim_end_s = result.end_s
            if result.num_scheduled_tokens == 0:
                self._publish(result)
                continuing = False
                await self._idle_until(engine.next_load_done_s)
                continue
            if scale > 0:
                delay = self._t0 + result.end_s * scale - loop.time()
                await asyncio.sleep(max(0.0, delay))
            else:
                await asyncio.sleep(0)
            if self.state == "paused":
                await self._wait_resumed()
            self._deliver(result)
            self._publish(result)
            continuing = True

    async def _idle_until(self, sim_s: float | None) -> None:
        """Nothing to run: wait for a request, or until ``sim_s`` (a host-tier load ends) if sooner."""
        self._wake.clear()
        if sim_s is None:
            await self._wake.wait()
        elif self.time_scale == 0:
            self._sim_end_s = max(self._sim_end_s, sim_s)
            await asyncio.sleep(0)
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout((sim_s - self.sim_now()) * self.time_scale):
                    await self._wake.wait()

    def _publish(self, result: StepResult) -> None:
        if result.kv_events and self.publisher is not None:
            self.publisher.publish(result.kv_events, time.time())

    async def _wait_resumed(self) -> None:
        while self.state == "paused":
            self._wake.clear()
            await self._wake.wait()

    def _deliver(self, result: StepResult) -> None:
        touched: list[Exchange] = []
        for seq in result.produced:
            exchange, index = seq.handle
            if exchange.single_stream and seq.finish_reason is None and seq.num_output_tokens > 1:
                exchange.send_token(seq)
            elif exchange.on_token(seq, index):
                touched.append(exchange)
        for exchange in touched:
            exchange.flush()

    def finish(self, exchange: Exchange) -> None:
        self._exchanges.discard(exchange)
        if not self._exchanges:
            self._idle.set()


def parse_role(role: Role | str) -> Role:
    """``mixed``, ``prefill`` or ``decode``; anything else is a ``ValueError`` naming the choices."""
    try:
        return Role(role)
    except ValueError:
        choices = ", ".join(r.value for r in Role)
        raise ValueError(f"role must be one of {choices}, got {role!r}") from None
