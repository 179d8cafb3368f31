"""A simulated replica's HTTP front end: vLLM's routes, and each request turned into engine sequences.

``SimReplica`` (``kvgate.sim.replica``) owns the lifecycle and the step loop; this is what it answers
over HTTP, apart so that each job reads whole. Generation (chat, completions, and ``/v1/responses``
run as a chat, ``kvgate.sim.responses``) and pooling (embeddings, pooling, classify, score, rerank:
one prefill step each, ``kvgate.sim.pooling``) queue sequences on the engine; ``/tokenize`` and
``/detokenize`` answer at once. A route vLLM does not serve is its ``{"detail":"Not Found"}``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import orjson

from kvgate.admission.route_work import POOLING_ROUTES, WorkView, work_view
from kvgate.sim.engine import Engine
from kvgate.sim.exchange import Exchange
from kvgate.sim.http import Connection, Request
from kvgate.sim.kv_publisher import KvEventPublisher, sources_body
from kvgate.sim.kv_transfer import HANDOFF_FIELDS, KvTransfers, pull
from kvgate.sim.metrics import render_metrics
from kvgate.sim.pooling import PoolingExchange
from kvgate.sim.profile import Profile
from kvgate.sim.prompts import PromptEncoder
from kvgate.sim.protocol import DONE_CHUNK, VLLM_VERSION, WORDS, ApiError, models_body, tokenize_body
from kvgate.sim.responses import ResponsesExchange, chat_body
from kvgate.sim.validation import (
    GenerationRequest,
    content_type_error,
    fit_to_context,
    model_not_found,
    parse_body,
    parse_generation,
    tokenize_request,
)
from kvgate.vocabulary.replica import Role

if TYPE_CHECKING:
    from kvgate.sim.engine import StepResult  # noqa: F401

_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_NOT_FOUND = b'{"detail":"Not Found"}'
_METHOD_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
_SHUTTING_DOWN = ApiError(503, "The server is shutting down.", "ServiceUnavailableError")
_GENERATION = {"/v1/chat/completions": True, "/v1/completions": False}
_ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/responses": "POST",
    "/tokenize": "POST",
    "/detokenize": "POST",
    **dict.fromkeys(POOLING_ROUTES, "POST"),
    "/v1/models": "GET",
    "/health": "GET",
    "/version": "GET",
    "/metrics": "GET",
    "/kv/pull": "POST",
    "/kv_event_sources": "GET",
    "/reset_prefix_cache": "POST",
}
_JSON_ROUTES = frozenset(path for path, method in _ROUTES.items() if method == "POST") - {
    "/kv/pull",
    "/reset_prefix_cache",
}
"""Routes whose body vLLM reads as JSON, refusing any other content type."""


class FrontEnd:
    """The HTTP routes of ``SimReplica``; the attributes are the replica's."""

    role: Role
    fingerprint: str
    state: str
    model: str
    max_model_len: int
    created: int
    lag_s: float
    host: str
    port: int
    time_scale: float
    prompt_tokens_details: bool
    profile: Profile
    engine: Engine
    publisher: KvEventPublisher | None
    _prompts: PromptEncoder
    _records: dict[str, bytearray] | None
    _ids: itertools.count[int]
    _id_prefix: str
    _transfers: KvTransfers
    _pulls: set[asyncio.Task[None]]
    _exchanges: set[Exchange]
    _stalled: list[tuple[Connection, Request]]
    _wake: asyncio.Event
    _idle: asyncio.Event

    def sim_now(self) -> float:
        raise NotImplementedError

    def finish(self, exchange: Exchange) -> None:
        raise NotImplementedError

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
        elif (chat := _GENERATION.get(path)) is not None:
            self._generate(conn, request, chat)
        elif path == "/v1/responses":
            self._respond(conn, request)
        elif path in POOLING_ROUTES:
            self._pool(conn, request, path)
        elif path == "/detokenize":
            self._detokenize(conn, request)
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

    def _respond(self, conn: Connection, request: Request) -> None:
        """``/v1/responses``: run as the chat it asks for, answered as a Response."""
        body = parse_body(request.body)
        chat = body if isinstance(body, ApiError) else chat_body(body)
        if isinstance(chat, ApiError):
            conn.respond(chat.status, chat.body())
            return
        self._generate(conn, request, True, orjson.dumps(chat), chat.get("max_tokens"))

    def _generate(
        self,
        conn: Connection,
        request: Request,
        chat: bool,
        responses_body: bytes | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        """Run a generation request as vLLM does: each prompt of a completions batch is its own
        request of ``n`` sequences, choice ``i * n + j`` being prompt ``i``'s ``j``-th; usage sums them.
        ``responses_body``: the chat a ``/v1/responses`` request runs as (answered as a Response)."""
        if self.state != "ready":
            conn.respond(503, _SHUTTING_DOWN.body())
            return
        raw = request.body if responses_body is None else responses_body
        parsed = parse_generation(raw, chat, self.model, self.max_model_len)
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
        response_id = base_id if responses_body is not None else ("chatcmpl-" if chat else "cmpl-") + base_id
        record = None
        if self._records is not None:
            record = bytearray()
            self._records[response_id] = record
            if header_id:
                self._records[base_id] = record
        choices = len(prompts) * parsed.n
        exchange = (Exchange if responses_body is None else ResponsesExchange)(
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
        if isinstance(exchange, ResponsesExchange):
            exchange.bind(max_output_tokens)
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

    def _pool(self, conn: Connection, request: Request, path: str) -> None:
        """A pooling route: each prompt one prefill step on the engine, answered whole."""
        if self.state != "ready":
            conn.respond(503, _SHUTTING_DOWN.body())
            return
        body = parse_body(request.body)
        if isinstance(body, ApiError):
            conn.respond(body.status, body.body())
            return
        model = body.get("model")
        if model and model != self.model:
            refused = model_not_found(str(model), self.model)
            conn.respond(refused.status, refused.body())
            return
        view = work_view(POOLING_ROUTES[path], body)
        if not isinstance(view, WorkView):
            refused = ApiError(400, view.message, "BadRequestError", view.param)
            conn.respond(refused.status, refused.body())
            return
        prompts = self._pooled_prompts(view)
        for token_ids, _hashes in prompts:
            fits = fit_to_context(self.max_model_len, len(token_ids), 1)
            if isinstance(fits, ApiError):
                conn.respond(fits.status, fits.body())
                return
        response_id = f"{self._id_prefix}{next(self._ids)}"
        total = sum(len(token_ids) for token_ids, _hashes in prompts)
        exchange = PoolingExchange(
            self, conn, False, False, False, response_id, self.model, len(prompts), total, None
        )
        exchange.bind(path, body, [token_ids for token_ids, _hashes in prompts])
        self._exchanges.add(exchange)
        self._idle.clear()
        request.on_disconnect = exchange.on_disconnect
        arrival_s = self.sim_now()
        for index, (token_ids, hashes) in enumerate(prompts):
            exchange.seqs.append(
                self.engine.add_request(
                    f"{response_id}-{index}",
                    token_ids,
                    1,
                    arrival_s,
                    ignore_eos=True,
                    prompt_hashes=hashes,
                    handle=(exchange, index),
                )
            )
        self._wake.set()

    def _pooled_prompts(self, view: WorkView) -> list[tuple[list[int], list[int]]]:
        encoder = self._prompts
        if view.chat:
            return [encoder.encode(encoder.template.render(view.body["messages"]))]
        given = view.body["prompt"]
        if isinstance(given, str):
            return [encoder.encode(given)]
        if given and all(isinstance(t, int) for t in given):
            return [encoder.token_ids(list(given))]
        return [encoder.encode(p) if isinstance(p, str) else encoder.token_ids(list(p)) for p in given]

    def _detokenize(self, conn: Connection, request: Request) -> None:
        """``POST /detokenize``: the text of ``tokens`` (the simulator's words stand for them)."""
        body = parse_body(request.body)
        if isinstance(body, ApiError):
            conn.respond(body.status, body.body())
            return
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            error = ApiError(400, "'tokens' must be a list of token ids.", "BadRequestError", "tokens")
            conn.respond(error.status, error.body())
            return
        text = b"".join(WORDS[t % len(WORDS)] for t in tokens).decode()
        conn.respond(200, orjson.dumps({"prompt": text}))
