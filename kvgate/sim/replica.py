"""One simulated vLLM replica: the OpenAI HTTP surface in front of one ``Engine``.

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
from typing import Any

import orjson

from kvgate.admission.tokenizer import ChatTemplate, TiktokenTokenizer, Tokenizer
from kvgate.sim.engine import Engine, StepResult
from kvgate.sim.exchange import Exchange
from kvgate.sim.http import Connection, Request
from kvgate.sim.kv_publisher import KvEventPublisher, KvEventsConfig, sources_body
from kvgate.sim.kv_transfer import HANDOFF_FIELDS, KvTransfers, pull
from kvgate.sim.metrics import render_metrics
from kvgate.sim.profile import Profile
from kvgate.sim.prompts import PromptEncoder
from kvgate.sim.protocol import (
    DONE_CHUNK,
    VLLM_VERSION,
    ApiError,
    models_body,
    system_fingerprint,
    tokenize_body,
)
from kvgate.sim.validation import (
    GenerationRequest,
    content_type_error,
    fit_to_context,
    parse_generation,
    tokenize_request,
)
from kvgate.sim.vllm_block_hash import BlockDigests
from kvgate.vocabulary.replica import Role

# A step loop that wakes late keeps its schedule (sleeping less next time) unless it fell this far
# behind in real seconds; beyond that it re-anchors on the clock and counts the gap as lag.
_CATCH_UP_REAL_S = 0.05
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_NOT_FOUND = b'{"detail":"Not Found"}'
_METHOD_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
_JSON_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/tokenize"})
"""Routes whose body vLLM reads as JSON, refusing any other content type."""
_ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/tokenize": "POST",
    "/v1/models": "GET",
    "/health": "GET",
    "/version": "GET",
    "/metrics": "GET",
    "/kv/pull": "POST",
    "/kv_event_sources": "GET",
    "/reset_prefix_cache": "POST",
}


class SimReplica:
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

    # HTTP
    def _handle(self, conn: Connection, request: Request) -> None:
        if self.state == "paused":
            self._stalled.append((conn, request))
            return
        try:
            self._route(conn, request)
        except Exception as exc:
            error = ApiError(500, f"Internal server error: {type(exc).__name__}", "InternalServerError")
            conn.respond(500, error.body())

    def _route(self, conn: Connection, request: Request) -> None:
        path = request.path
        method = _ROUTES.get(path)
        if method is None:
            conn.respond(404, _NOT_FOUND)
        elif method != request.method:
            conn.respond(405, _METHOD_NOT_ALLOWED, extra=b"allow: %s\r\n" % method.encode())
        elif path in _JSON_ROUTES and (refused := content_type_error(request.headers.get(b"content-type"))):
            conn.respond(refused.status, refused.body())
        elif path == "/v1/chat/completions":
            self._generate(conn, request, chat=True)
        elif path == "/v1/completions":
            self._generate(conn, request, chat=False)
        elif path == "/metrics":
            conn.respond(200, render_metrics(self.engine, self.model, self.lag_s, self.role), _METRICS_TYPE)
        elif path == "/health":
            conn.respond(200, b"", content_type=b"")
        elif path == "/v1/models":
            conn.respond(200, models_body(self.model, self.max_model_len, self.created, self._id_prefix))
        elif path == "/version":
            conn.respond(200, orjson.dumps({"version": VLLM_VERSION}))
        elif path == "/kv/pull":
            self._transfers.serve_pull(conn, request)
        elif path == "/kv_event_sources":
            publisher = self.publisher
            conn.respond(200, publisher.sources_body() if publisher is not None else sources_body(None))
        elif path == "/reset_prefix_cache":
            conn.respond(200, orjson.dumps({"success": self.engine.reset_prefix_cache()}))
        else:
            self._tokenize(conn, request)

    def _generate(self, conn: Connection, request: Request, chat: bool) -> None:
        """Run a generation request as vLLM does: each prompt of a completions batch is its own
        request of ``n`` sequences, choice ``i * n + j`` being prompt ``i``'s ``j``-th; usage sums them."""
        if self.state != "ready":
            error = ApiError(503, "The server is shutting down.", "ServiceUnavailableError")
            conn.respond(503, error.body())
            return
        parsed = parse_generation(request.body, chat, self.model, self.max_model_len)
        if isinstance(parsed, ApiError):
            conn.respond(parsed.status, parsed.body())
            return
        prompts = [self._prompts.encode(self._prompts.template.render(parsed.messages))] if chat else []
        for prompt in parsed.prompts:
            prompts.append(
                self._prompts.encode(prompt) if isinstance(prompt, str) else self._prompts.token_ids(prompt)
            )
        role = self.role
        requested_max = 1 if role is Role.PREFILL else parsed.max_tokens
        caps: list[int] = []
        for token_ids, _hashes in prompts:
            cap = fit_to_context(self.max_model_len, len(token_ids), requested_max)
            if isinstance(cap, ApiError):
                conn.respond(cap.status, cap.body())
                return
            caps.append(cap)
        kv_transferred = role is Role.DECODE and parsed.remote_prefill
        handoff = parsed.kv_transfer_params or {}
        if kv_transferred and any(handoff.get(name) is None for name in HANDOFF_FIELDS):
            missing = [name for name in HANDOFF_FIELDS if handoff.get(name) is None]
            error = ApiError(400, f"kv_transfer_params lacks {', '.join(missing)}.", "BadRequestError")
            conn.respond(error.status, error.body())
            return
        header_id = request.headers.get(b"x-request-id")
        base_id = header_id.decode("latin-1") if header_id else f"{self._id_prefix}{next(self._ids)}"
        response_id = ("chatcmpl-" if chat else "cmpl-") + base_id
        record = None
        if self._records is not None:
            record = bytearray()
            self._records[response_id] = record
            if header_id:
                self._records[base_id] = record
        choices = len(prompts) * parsed.n
        exchange = Exchange(
            self,
            conn,
            chat,
            parsed.stream,
            parsed.include_usage,
            response_id,
            parsed.model,
            choices,
            sum(len(token_ids) for token_ids, _hashes in prompts),
            record,
        )
        exchange.cached_tokens_reported = self.prompt_tokens_details
        if role is Role.PREFILL:
            exchange.kv_transfer_params = self._transfers.offer(
                base_id, exchange.prompt_tokens, self.host, self.port
            )
        self._exchanges.add(exchange)
        self._idle.clear()
        request.on_disconnect = exchange.on_disconnect
        if parsed.stream:
            # As vLLM's StreamingResponse: status and headers at once, events from the first token.
            conn.start_stream()
        if kv_transferred:
            pull = asyncio.create_task(self._receive_kv(exchange, handoff, prompts, caps, parsed))
            self._pulls.add(pull)
            pull.add_done_callback(self._pulls.discard)
            return
        latency_s = self.profile.frontend_latency_s * self.time_scale
        if latency_s > 0:
            # vLLM's front end (tokenisation, hand-off to the engine) runs beside the engine: the
            # request arrives now and can be scheduled once it is through.
            arrival_s = self.sim_now()
            loop = asyncio.get_running_loop()
            loop.call_later(latency_s, self._admit, exchange, prompts, caps, parsed, arrival_s)
            return
        self._add_sequences(exchange, prompts, caps, parsed, kv_transferred=False)

    def _admit(
        self,
        exchange: Exchange,
        prompts: list[tuple[list[int], list[int]]],
        caps: list[int],
        parsed: GenerationRequest,
        arrival_s: float,
    ) -> None:
        """The front end is through: queue the request, unless its client left (or the replica died)."""
        if exchange in self._exchanges:
            self._add_sequences(exchange, prompts, caps, parsed, kv_transferred=False, arrival_s=arrival_s)

    def _add_sequences(
        self,
        exchange: Exchange,
        prompts: list[tuple[list[int], list[int]]],
        caps: list[int],
        parsed: GenerationRequest,
        kv_transferred: bool,
        arrival_s: float | None = None,
    ) -> None:
        """Queue every choice's sequence; ``caps[i]``: prompt ``i``'s output cap (``fit_to_context``);
        ``arrival_s``: when it reached the replica (default now)."""
        arrival_s = self.sim_now() if arrival_s is None else arrival_s
        choices = len(prompts) * parsed.n
        for index in range(choices):
            token_ids, hashes = prompts[index // parsed.n]
            max_tokens = caps[index // parsed.n]
            seq_id = exchange.response_id if choices == 1 else f"{exchange.response_id}-{index}"
            exchange.seqs.append(
                self.engine.add_request(
                    seq_id,
                    token_ids,
                    max_tokens,
                    arrival_s,
                    min_tokens=parsed.min_tokens,
                    ignore_eos=parsed.ignore_eos,
                    prompt_hashes=hashes,
                    handle=(exchange, index),
                    kv_transferred=kv_transferred,
                )
            )
        self._wake.set()

    async def _receive_kv(
        self,
        exchange: Exchange,
        handoff: dict[str, Any],
        prompts: list[tuple[list[int], list[int]]],
        caps: list[int],
        parsed: GenerationRequest,
    ) -> None:
        """Pull the prompt's KV from the prefill instance, spend the link's time on the bytes, then
        decode; a failed pull fails the request."""
        host, port = str(handoff["remote_host"]), int(handoff["remote_port"])
        moved = await pull(host, port, str(handoff["remote_request_id"]))
        if exchange not in self._exchanges:
            return
        if isinstance(moved, str):
            message = f"KV transfer for request {exchange.response_id} failed: {moved}"
            error = ApiError(500, message, "InternalServerError")
            self.finish(exchange)
            if exchange.templates is None:
                exchange.conn.respond(error.status, error.body())
            else:
                exchange.conn.end_stream(b"data: " + error.body() + b"\n\n" + DONE_CHUNK)
            return
        if self.time_scale > 0:
            await asyncio.sleep(moved / self.profile.kv_link_bytes_per_s * self.time_scale)
            if exchange not in self._exchanges:
                return
        self._add_sequences(exchange, prompts, caps, parsed, kv_transferred=True)

    def _tokenize(self, conn: Connection, request: Request) -> None:
        parsed = tokenize_request(request.body, self.model)
        if isinstance(parsed, ApiError):
            conn.respond(parsed.status, parsed.body())
            return
        chat, content = parsed
        text = self._prompts.template.render(content) if chat else content
        token_ids, _hashes = self._prompts.encode(text)
        conn.respond(200, tokenize_body(token_ids, self.max_model_len))


def parse_role(role: Role | str) -> Role:
    """``mixed``, ``prefill`` or ``decode``; anything else is a ``ValueError`` naming the choices."""
    try:
        return Role(role)
    except ValueError:
        choices = ", ".join(r.value for r in Role)
        raise ValueError(f"role must be one of {choices}, got {role!r}") from None
