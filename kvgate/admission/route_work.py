"""What each served route asks a replica to run, read into the two shapes pricing knows.

Pricing counts a chat's ``messages`` or a completion's ``prompt`` (one, or a batch) and bounds an
output cap. Every other route is read into one of those shapes here, as vLLM runs it:

- ``/v1/responses`` is a chat: ``instructions`` then ``input`` (a string or a list of message items
  whose content is a string or typed parts) as messages, ``max_output_tokens`` its output cap. It
  streams like chat and is priced like it.
- An embedding, pooling, score or rerank request runs its inputs as prompts through one prefill
  step and decodes nothing: each input (each query-document pair of a score or rerank) is a prompt
  of the batch, and the output cap is 0, so its reservation is its prompts' KV until the answer.
- ``/tokenize`` and ``/detokenize`` reach a replica's front end only: no prompt is held, no token
  decoded (a zero cost, still under the tenant's request limits).

A body that cannot be read is an ``InvalidRequest`` naming the field, so the edge answers a 400.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.admission.cost import InvalidRequest
from kvgate.admission.tokenizer import message_text


class Work(enum.Enum):
    CHAT = "chat"
    COMPLETION = "completion"
    RESPONSES = "responses"
    EMBEDDING = "embedding"
    SCORE = "score"
    RERANK = "rerank"
    TOKENS = "tokens"

    @property
    def decodes(self) -> bool:
        return self in _DECODING

    @property
    def counts_prompt(self) -> bool:
        return self is not Work.TOKENS


_DECODING = frozenset({Work.CHAT, Work.COMPLETION, Work.RESPONSES})
POOLING_ROUTES: dict[str, Work] = {
    "/v1/embeddings": Work.EMBEDDING,
    "/pooling": Work.EMBEDDING,
    "/classify": Work.EMBEDDING,
    "/score": Work.SCORE,
    "/v1/score": Work.SCORE,
    "/rerank": Work.RERANK,
    "/v1/rerank": Work.RERANK,
    "/v2/rerank": Work.RERANK,
}
"""vLLM's pooling routes (each a ``POST``) and the work each runs: the gateway serves them and the
simulator answers them from this one table."""
MAX_PAIR_CHARS = 16 * 1024 * 1024
"""Most text a score or rerank request's pairs may hold together: twice the default body, so a 1:N
request cannot make the gateway build many times the text it was sent."""


@dataclass(frozen=True, slots=True)
class WorkView:
    """A body in a shape pricing reads: chat (``messages``) or completion (``prompt``)."""

    body: Mapping[str, Any]
    chat: bool


def work_view(work: Work, body: Mapping[str, Any]) -> WorkView | InvalidRequest:
    """``body`` of a ``work`` route as pricing reads it; chat and completion bodies are their own."""
    if work is Work.CHAT:
        return WorkView(body, True)
    if work is Work.COMPLETION:
        return WorkView(body, False)
    if work is Work.RESPONSES:
        return _responses(body)
    if work is Work.EMBEDDING:
        return _embedding(body)
    if work is Work.SCORE:
        return _pairs(body, ("text_1", "queries"), ("text_2", "documents"))
    if work is Work.RERANK:
        return _pairs(body, ("query",), ("documents",))
    return WorkView({"prompt": ""}, False)


def _responses(body: Mapping[str, Any]) -> WorkView | InvalidRequest:
    cap = body.get("max_output_tokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        message = f"'max_output_tokens' must be a positive integer, got {cap!r}."
        return InvalidRequest(message, "max_output_tokens")
    messages: list[Mapping[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if not isinstance(item, Mapping):
                return InvalidRequest("each item of 'input' must be an object.", "input")
            content = item.get("content", item.get("output", ""))
            messages.append({"role": str(item.get("role", "user")), "content": _parts_text(content)})
    else:
        return InvalidRequest("'input' is required: a string or a list of input items.", "input")
    return WorkView({"messages": messages, "max_completion_tokens": cap}, True)


def _parts_text(content: Any) -> str:
    """A Responses item's content: a string, or parts (``input_text``, ``output_text``, ...) whose
    text counts."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return message_text(content)


def _embedding(body: Mapping[str, Any]) -> WorkView | InvalidRequest:
    messages = body.get("messages")
    if isinstance(messages, list):
        return WorkView({"messages": messages}, True)
    given = body.get("input")
    if isinstance(given, str) or (isinstance(given, list) and given and _texts_or_ids(given)):
        return WorkView({"prompt": given}, False)
    return InvalidRequest(
        "'input' is required: a string, a list of strings, token ids or lists of token ids.", "input"
    )


def _texts_or_ids(given: list[Any]) -> bool:
    return (
        all(isinstance(x, str) for x in given)
        or all(isinstance(x, int) for x in given)
        or all(isinstance(x, list) for x in given)
    )


def _pairs(
    body: Mapping[str, Any], firsts: tuple[str, ...], seconds: tuple[str, ...]
) -> WorkView | InvalidRequest:
    """A score or rerank request: each (first, second) pair is one prompt of the batch, a single
    first paired with every second (vLLM's 1:N), or N firsts with N seconds (N:N)."""
    first = next((body[k] for k in firsts if k in body), None)
    second = next((body[k] for k in seconds if k in body), None)
    lefts = _texts(first)
    rights = _texts(second)
    if not lefts:
        return InvalidRequest(f"'{firsts[0]}' is required: a string or a list of strings.", firsts[0])
    if not rights:
        return InvalidRequest(f"'{seconds[0]}' is required: a string or a list of strings.", seconds[0])
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    elif len(lefts) != len(rights):
        return InvalidRequest(
            f"'{firsts[0]}' and '{seconds[0]}' must have one item, or as many items as each other.", firsts[0]
        )
    expanded = sum(map(len, lefts)) + sum(map(len, rights))
    if expanded > MAX_PAIR_CHARS:
        # A 1:N request repeats its first text for every second: a long query over many short
        # documents would ask for far more text than its body holds.
        return InvalidRequest(
            f"The pairs of this request hold {expanded} characters, over the limit of {MAX_PAIR_CHARS}.",
            seconds[0],
        )
    prompts = [left + right for left, right in zip(lefts, rights, strict=True)]
    return WorkView({"prompt": prompts[0] if len(prompts) == 1 else prompts}, False)


def _texts(value: Any) -> list[str]:
    """A string, a list of strings, or documents as objects with ``text`` (rerank's form)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        value = value.get("content", [value])
    if isinstance(value, list):
        texts = []
        for item in value:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping) and isinstance(item.get("text"), str):
                texts.append(item["text"])
            else:
                return []
        return texts
    return []
