"""One generation request in flight on a simulated replica, and what its client has been sent.

An exchange holds the request's sequences (``n`` per prompt) and turns the tokens each engine step
produces into the bytes vLLM would write: a mid-stream token of a single-choice stream is written at
once (``send_token``, the hot path), everything else is gathered per step and written once
(``on_token`` then ``flush``), a whole body at the end of a non-streamed request.
"""

from __future__ import annotations

import time
from typing import Protocol

from kvgate.sim.engine import Engine, EngineRequest
from kvgate.sim.http import Connection, chunk_frame, unframe
from kvgate.sim.protocol import DONE_CHUNK, WORDS, StreamTemplates, full_response


class ExchangeOwner(Protocol):
    """The replica an exchange runs on: its engine, its ``system_fingerprint``, and who hears that
    the exchange is over."""

    engine: Engine
    fingerprint: str

    def finish(self, exchange: Exchange) -> None: ...


class Exchange:
    """One generation request in flight: its sequences (``n`` per prompt) and what its client was sent."""

    __slots__ = (
        "buf",
        "cached_tokens_reported",
        "chat",
        "conn",
        "created",
        "finish_reasons",
        "framed",
        "include_usage",
        "kv_transfer_params",
        "model",
        "owner",
        "prompt_tokens",
        "record",
        "remaining",
        "response_id",
        "roles_sent",
        "seqs",
        "single_stream",
        "templates",
        "texts",
    )

    def __init__(
        self,
        owner: ExchangeOwner,
        conn: Connection,
        chat: bool,
        stream: bool,
        include_usage: bool,
        response_id: str,
        model: str,
        n: int,
        prompt_tokens: int,
        record: bytearray | None,
    ) -> None:
        self.owner = owner
        self.conn = conn
        self.chat = chat
        self.include_usage = include_usage
        self.response_id = response_id
        self.model = model
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.record = record
        self.remaining = n
        self.seqs: list[EngineRequest] = []
        self.buf: list[bytes] = []
        self.texts: list[list[bytes]] = [[] for _ in range(n)]
        self.finish_reasons = ["stop"] * n
        self.templates = (
            StreamTemplates(chat, response_id, self.created, model, n, owner.fingerprint, include_usage)
            if stream
            else None
        )
        self.roles_sent = not chat
        self.single_stream = stream and n == 1
        self.framed: list[bytes | None] = [None] * len(WORDS)
        self.kv_transfer_params: dict[str, object] | None = None
        self.cached_tokens_reported = False
        """Report the prompt tokens served from cache in ``usage`` (vLLM's
        ``--enable-prompt-tokens-details``)."""

    def send_token(self, seq: EngineRequest) -> None:
        """The hot path: one mid-stream token of a single-choice stream, written at once."""
        word = (seq.num_output_tokens * 7) % len(WORDS)
        framed = self.framed[word]
        if framed is None:
            templates = self.templates
            assert templates is not None
            framed = self.framed[word] = chunk_frame(templates.heads[0] + WORDS[word] + templates.tail)
        if self.record is not None:
            self.record += unframe(framed)
        transport = self.conn.transport
        if transport is not None:
            transport.write(framed)

    def on_token(self, seq: EngineRequest, index: int) -> bool:
        """Queue one produced token; True if this is the exchange's first token in this step."""
        first = not self.buf
        word = WORDS[(seq.num_output_tokens * 7 + index) % len(WORDS)]
        templates = self.templates
        if templates is None:
            self.texts[index].append(word)
            if first:
                self.buf.append(b"")
        else:
            if not self.roles_sent:
                # As vLLM: every choice's role chunk, in index order, before the first content.
                self.buf.extend(templates.role_chunks)
                self.roles_sent = True
            if seq.finish_reason is None:
                self.buf.append(templates.heads[index] + word + templates.tail)
            else:
                self.buf.append(
                    templates.heads[index] + word + templates.tail_stop % seq.finish_reason.encode()
                )
        if seq.finish_reason is not None:
            self.finish_reasons[index] = seq.finish_reason
            self.remaining -= 1
        return first

    def flush(self) -> None:
        conn = self.conn
        done = self.remaining == 0
        if self.templates is None:
            self.buf.clear()
            if done:
                body = full_response(
                    self.chat,
                    self.response_id,
                    self.created,
                    self.model,
                    [b"".join(t).decode() for t in self.texts],
                    self.finish_reasons,
                    self.prompt_tokens,
                    sum(s.num_output_tokens for s in self.seqs),
                    self.owner.fingerprint,
                    self.kv_transfer_params,
                    self._cached_tokens(),
                )
                self._record(body)
                self.owner.finish(self)
                conn.respond(200, body)
            return
        if done:
            if self.include_usage:
                completion = sum(s.num_output_tokens for s in self.seqs)
                usage = self.templates.usage_chunk(self.prompt_tokens, completion, self._cached_tokens())
                self.buf.append(usage)
            self.buf.append(DONE_CHUNK)
        data = b"".join(self.buf)
        self.buf.clear()
        self._record(data)
        if done:
            self.owner.finish(self)
            conn.end_stream(data)
        else:
            conn.send(data)

    def _cached_tokens(self) -> int | None:
        """The first sequence's prefix-cache hit, as vLLM counts one per request."""
        if not self.cached_tokens_reported or not self.seqs:
            return None
        return max(0, self.seqs[0].num_cached_tokens)

    def _record(self, data: bytes) -> None:
        if self.record is not None:
            self.record += data

    def on_disconnect(self) -> None:
        for seq in self.seqs:
            self.owner.engine.abort(seq)
        self.owner.finish(self)
