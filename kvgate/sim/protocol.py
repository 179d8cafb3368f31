"""vLLM 0.32's OpenAI wire format: error bodies and pre-encoded response bytes.

Every body carries the keys vLLM's own carries, in its order, with the values a gateway or SDK
reads (ids, counts, finish reasons) and nulls where vLLM sends nulls, so that a client cannot tell
the simulator from vLLM by the shape of what it receives: the non-streamed response's envelope,
each stream chunk's fields (a chat stream opens with one role chunk per choice; each choice's last
chunk says why it finished and, without ``include_usage``, carries the ``system_fingerprint``),
and the usage-only chunk (``"choices": []``). Streaming bodies are assembled from byte templates
built once per request, so a streamed token costs a few byte concatenations rather than a JSON
encode. What is refused, and how, is ``kvgate.sim.validation``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

VLLM_VERSION = "0.32.0"

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


def system_fingerprint(seed: int, index: int) -> str:
    """vLLM's ``vllm-<version>-<8 hex digits>``, fixed per replica."""
    return f"vllm-{VLLM_VERSION}-{(seed * 1_000_003 + index) & 0xFFFFFFFF:08x}"


class StreamTemplates:
    """SSE byte templates for one request: ``heads[i] + word + tail`` is one content chunk of
    choice ``i``, ``heads[i] + word + tail_stop % reason`` its last."""

    __slots__ = ("_envelope", "_fingerprint", "chat", "heads", "role_chunks", "tail", "tail_stop")

    def __init__(
        self,
        chat: bool,
        response_id: str,
        created: int,
        model: str,
        n: int,
        fingerprint: str,
        include_usage: bool,
    ) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        envelope = orjson.dumps({"id": response_id, "object": obj, "created": created, "model": model})[:-1]
        self._envelope = envelope
        self._fingerprint = fingerprint.encode()
        self.heads: list[bytes] = []
        self.role_chunks: list[bytes] = []
        for index in range(n):
            if chat:
                self.heads.append(b'data: %s,"choices":[{"index":%d,"delta":{"content":"' % (envelope, index))
                self.role_chunks.append(
                    b'data: %s,"choices":[{"index":%d,"delta":{"role":"assistant","content":""},'
                    b'"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
                    % (envelope, index)
                )
            else:
                self.heads.append(b'data: %s,"choices":[{"index":%d,"text":"' % (envelope, index))
        # The last chunk of a choice carries the fingerprint unless a usage chunk follows, which does.
        end = b"]}\n\n" if include_usage else b'],"system_fingerprint":"%s"}\n\n' % self._fingerprint
        if chat:
            self.tail = b'"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            stop = b'"},"logprobs":null,"finish_reason":"%s","stop_reason":null,"token_ids":null}'
            self.tail_stop = stop + end
        else:
            fields = b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null}'
            self.tail = b'","logprobs":null,"finish_reason":null,' + fields + b"]}\n\n"
            self.tail_stop = b'","logprobs":null,"finish_reason":"%s",' + fields + end

    def usage_chunk(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> bytes:
        usage = b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d' % (
            prompt_tokens,
            prompt_tokens + completion_tokens,
            completion_tokens,
        )
        if cached_tokens is not None:
            usage += b',"prompt_tokens_details":{"cached_tokens":%d}' % cached_tokens
        usage += b"}"
        return b'data: %s,"choices":[],"usage":%s,"system_fingerprint":"%s"}\n\n' % (
            self._envelope,
            usage,
            self._fingerprint,
        )


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
    fingerprint: str,
    kv_transfer_params: dict[str, Any] | None = None,
    cached_tokens: int | None = None,
) -> bytes:
    """The whole response; ``cached_tokens`` (prompt tokens served from the prefix cache) is reported
    as vLLM started with ``--enable-prompt-tokens-details`` reports it."""
    choices: list[dict[str, Any]]
    if chat:
        choices = [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
    else:
        choices = [
            {
                "index": i,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None if cached_tokens is None else _prompt_details(cached_tokens),
            "completion_tokens_details": None,
        },
    }
    if chat:
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=kv_transfer_params, ec_transfer_params=None, metrics=None)
    return orjson.dumps(body)


def _prompt_details(cached_tokens: int) -> dict[str, Any]:
    return {"cached_tokens": cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}


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
