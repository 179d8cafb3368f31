"""vLLM's OpenAI wire format: request validation, error bodies, and pre-encoded response bytes.

Validation returns an ``ApiError`` value with vLLM's status, ``type`` and wording class (``{"error":
{"message", "type", "param", "code"}}``), never raises: bad input gets an answer, not a traceback.
Streaming bodies are assembled from byte templates built once per request, so a streamed token
costs a few byte concatenations rather than a JSON encode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

VLLM_VERSION = "0.10.1.1"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# Generated text: one word per token, pure ASCII so it needs no JSON escaping.
WORDS: tuple[bytes, ...] = tuple(
    w.encode()
    for w in (
        " the", " model", " token", " cache", " of", " a", " and", " to", " block", " batch",
        " is", " in", " prefix", " that", " request", " it", " with", " for", " GPU", " as",
        " on", " this", " decode", " by", " prefill", " are", " from", " queue", " at", " be",
        " kernel", " memory",
    )
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ApiError:
    status: int
    message: str
    type: str = "BadRequestError"
    param: str | None = None

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}
        )


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    chat: bool
    model: str
    prompts: list[str | list[int]]
    """A completions request's prompts, text or token ids: each runs as its own request, as in vLLM."""
    messages: list[dict[str, Any]]
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    min_tokens: int
    kv_transfer_params: dict[str, Any] | None
    """P/D disaggregation metadata, passed through as vLLM's connectors receive it."""

    @property
    def remote_prefill(self) -> bool:
        """The prompt's KV was computed by a prefill instance (``do_remote_prefill``)."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")


def _int_field(body: dict[str, Any], name: str, minimum: int) -> int | ApiError | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return _bad(f"{name} must be an integer, got {value!r}.", name)
    if value < minimum:
        return _bad(f"{name} must be at least {minimum}, got {value}.", name)
    return value


def parse_body(raw: bytes) -> dict[str, Any] | ApiError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _bad(f"JSON decode error: {exc}")
    if not isinstance(body, dict):
        return _bad("Request body must be a JSON object.")
    return body


def parse_generation(raw: bytes, chat: bool, served_model: str) -> GenerationRequest | ApiError:
    body = parse_body(raw)
    if isinstance(body, ApiError):
        return body
    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        return _bad("model must be a string.", "model")
    prompts: list[str | list[int]] = []
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _bad("messages: field required, a list of message objects.", "messages")
        if not messages:
            return _bad("messages must contain at least one message.", "messages")
    else:
        messages = []
        given = _prompts(body.get("prompt"))
        if given is None:
            return _bad(
                "prompt: field required, a string, a list of strings, a list of token ids or a list of "
                "lists of token ids, none of them empty.",
                "prompt",
            )
        prompts = given
    max_tokens = _int_field(body, "max_completion_tokens" if chat else "max_tokens", 1)
    if max_tokens is None and chat:
        max_tokens = _int_field(body, "max_tokens", 1)
    if isinstance(max_tokens, ApiError):
        return max_tokens
    if max_tokens is None and not chat:
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    n = _int_field(body, "n", 1)
    min_tokens = _int_field(body, "min_tokens", 0)
    best_of = _int_field(body, "best_of", 1)
    for checked in (n, min_tokens, best_of):
        if isinstance(checked, ApiError):
            return checked
    assert not isinstance(n, ApiError) and not isinstance(min_tokens, ApiError)
    assert not isinstance(best_of, ApiError)
    if best_of is not None and best_of > 1:
        return _bad("vLLM V1 does not yet support best_of.", "best_of")
    min_tokens = min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        return _bad(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        return _bad("stream must be a boolean.", "stream")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not stream:
            return _bad("Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(stream_options, dict):
            return _bad("stream_options must be an object.", "stream_options")
    ignore_eos = body.get("ignore_eos", False)
    kv_transfer_params = body.get("kv_transfer_params")
    if kv_transfer_params is not None and not isinstance(kv_transfer_params, dict):
        return _bad("kv_transfer_params must be an object.", "kv_transfer_params")
    if model != served_model:
        return model_not_found(model)
    return GenerationRequest(
        chat=chat,
        model=model,
        prompts=prompts,
        messages=messages,
        max_tokens=max_tokens,
        n=n or 1,
        stream=bool(stream),
        include_usage=bool(stream_options and stream_options.get("include_usage")),
        ignore_eos=bool(ignore_eos),
        min_tokens=min_tokens,
        kv_transfer_params=kv_transfer_params,
    )


def _prompts(prompt: Any) -> list[str | list[int]] | None:
    """vLLM's completions ``prompt`` forms as a list of prompts; None for anything else or empty."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if all(
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        for p in prompt
    ):
        return [list(p) for p in prompt]
    return None


def length_error(max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> ApiError | None:
    if prompt_tokens >= max_model_len:
        return _bad(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages."
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        return _bad(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens})."
        )
    return None


class StreamTemplates:
    """SSE byte templates for one request: ``head + word + tail`` is one content chunk."""

    __slots__ = ("_envelope", "chat", "heads", "role_chunks", "tail", "tail_stop")

    def __init__(self, chat: bool, response_id: str, created: int, model: str, n: int) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        envelope = orjson.dumps({"id": response_id, "object": obj, "created": created, "model": model})[:-1]
        self._envelope = envelope
        self.heads: list[bytes] = []
        self.role_chunks: list[bytes] = []
        for index in range(n):
            if chat:
                self.heads.append(b'data: %s,"choices":[{"index":%d,"delta":{"content":"' % (envelope, index))
                self.role_chunks.append(
                    b'data: %s,"choices":[{"index":%d,"delta":{"role":"assistant","content":""},'
                    b'"logprobs":null,"finish_reason":null}]}\n\n' % (envelope, index)
                )
            else:
                self.heads.append(b'data: %s,"choices":[{"index":%d,"text":"' % (envelope, index))
        if chat:
            self.tail = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            self.tail_stop = b'"},"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
        else:
            self.tail = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.tail_stop = b'","logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
            prompt_tokens,
            prompt_tokens + completion_tokens,
            completion_tokens,
        )
        return b'data: %s,"choices":[],"usage":%s}\n\n' % (self._envelope, usage)


DONE_CHUNK = b"data: [DONE]\n\n"


def full_response(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    texts: list[str],
    finish_reasons: list[str],
    prompt_tokens: int,
    completion_tokens: int,
    kv_transfer_params: dict[str, Any] | None = None,
) -> bytes:
    choices: list[dict[str, Any]]
    if chat:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
    else:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
    return orjson.dumps(
        {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "kv_transfer_params": kv_transfer_params,
        }
    )


def models_body(model: str, max_model_len: int, created: int, id_prefix: str) -> bytes:
    """``GET /v1/models`` as vLLM answers it for one served model."""
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": model,
                    "parent": None,
                    "max_model_len": max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{id_prefix}",
                            "object": "model_permission",
                            "created": created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }
    )


def tokenize_body(token_ids: list[int], max_model_len: int) -> bytes:
    """``POST /tokenize`` as vLLM answers it."""
    return orjson.dumps(
        {"count": len(token_ids), "max_model_len": max_model_len, "tokens": token_ids, "token_strs": None}
    )
