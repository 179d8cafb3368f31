"""vLLM's ``/v1/responses`` on a simulated replica: a chat generation, answered as a Response.

The request is read as a chat (``instructions`` as the system message, ``input`` as the messages,
``max_output_tokens`` the cap) and runs on the engine like one. Its answer is a ``response`` object
with one assistant message of ``output_text``, and ``usage`` in input and output tokens. Streamed,
it is vLLM's typed events, each ``event: <type>`` then ``data: <json>``: created, in progress, the
output item and content part added, one ``response.output_text.delta`` per token, then the text,
part and item done and ``response.completed`` carrying the whole response with its usage. In a
prefill/decode pair it takes and answers ``kv_transfer_params`` as the chat routes do.
"""

from __future__ import annotations

from typing import Any

import orjson

from kvgate.admission.route_work import Work, WorkView, work_view
from kvgate.sim.engine import EngineRequest
from kvgate.sim.exchange import Exchange
from kvgate.sim.protocol import WORDS, ApiError


def chat_body(body: dict[str, Any]) -> dict[str, Any] | ApiError:
    """The chat request a Responses request runs as."""
    view = work_view(Work.RESPONSES, body)
    if not isinstance(view, WorkView):
        return ApiError(400, view.message, "BadRequestError", view.param)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": view.body["messages"]}
    for name in ("temperature", "top_p", "stream"):
        if name in body:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in ("ignore_eos", "min_tokens", "kv_transfer_params"):
        if name in body:
            chat[name] = body[name]
    return chat


class ResponsesExchange(Exchange):
    """A Responses request in flight: its text, and (streamed) the events written so far."""

    __slots__ = ("item_id", "max_output_tokens", "sequence", "started")

    def bind(self, max_output_tokens: int | None) -> None:
        self.max_output_tokens = max_output_tokens
        self.item_id = "msg_" + self.response_id
        self.sequence = 0
        self.started = False
        self.single_stream = False

    def on_token(self, seq: EngineRequest, index: int) -> bool:
        first = not self.buf
        word = WORDS[(seq.num_output_tokens * 7 + index) % len(WORDS)]
        self.texts[index].append(word)
        if self.templates is None:
            if first:
                self.buf.append(b"")
        else:
            if not self.started:
                self.started = True
                self.buf.append(self._event("response.created", response=self._response("in_progress")))
                self.buf.append(self._event("response.in_progress", response=self._response("in_progress")))
                item = {"id": self.item_id, "type": "message", "role": "assistant", "status": "in_progress"}
                self.buf.append(
                    self._event("response.output_item.added", output_index=0, item=item | {"content": []})
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                self.buf.append(self._part_event("response.content_part.added", part=part))
            self.buf.append(self._part_event("response.output_text.delta", delta=word.decode(), logprobs=[]))
        if seq.finish_reason is not None:
            self.finish_reasons[index] = seq.finish_reason
            self.remaining -= 1
        return first

    def flush(self) -> None:
        done = self.remaining == 0
        if self.templates is None:
            self.buf.clear()
            if done:
                body = orjson.dumps(self._response("completed"))
                self._record(body)
                self.owner.finish(self)
                self.conn.respond(200, body)
            return
        if done:
            text = self._text()
            self.buf.append(self._part_event("response.output_text.done", text=text, logprobs=[]))
            part = {"type": "output_text", "text": text, "annotations": []}
            self.buf.append(self._part_event("response.content_part.done", part=part))
            self.buf.append(self._event("response.output_item.done", output_index=0, item=self._message()))
            self.buf.append(self._event("response.completed", response=self._response("completed")))
        data = b"".join(self.buf)
        self.buf.clear()
        self._record(data)
        if done:
            self.owner.finish(self)
            self.conn.end_stream(data)
        else:
            self.conn.send(data)

    def _text(self) -> str:
        return b"".join(self.texts[0]).decode()

    def _message(self) -> dict[str, Any]:
        content: list[dict[str, Any]] = [
            {"type": "output_text", "text": self._text(), "annotations": [], "logprobs": None}
        ]
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": content,
        }

    def _response(self, status: str) -> dict[str, Any]:
        completed = status == "completed"
        output_tokens = sum(s.num_output_tokens for s in self.seqs)
        usage = {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + output_tokens,
        }
        response: dict[str, Any] = {
            "id": "resp_" + self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": self.max_output_tokens,
            "metadata": None,
            "model": self.model,
            "output": [self._message()] if completed else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "temperature": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage if completed else None,
        }
        if self.kv_transfer_params is not None:
            response["kv_transfer_params"] = self.kv_transfer_params
        return response

    def _part_event(self, kind: str, **fields: Any) -> bytes:
        return self._event(kind, item_id=self.item_id, output_index=0, content_index=0, **fields)

    def _event(self, kind: str, **fields: Any) -> bytes:
        number = self.sequence
        self.sequence = number + 1
        data = orjson.dumps({"type": kind, "sequence_number": number, **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"
