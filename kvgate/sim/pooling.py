"""vLLM's pooling routes on a simulated replica: embeddings, pooling, classify, score and rerank.

A pooling request runs each of its prompts (each input; each query-document pair of a score or
rerank) through one prefill step of the engine and decodes nothing: its KV is held for that step,
and its answer is written once every prompt's step is done. The vectors and scores are made up but
fixed by the prompt's tokens (a cosine of two equal texts is 1), the bodies shaped as vLLM's, and
``encoding_format: base64`` (the OpenAI SDK's default) packs little-endian float32 as vLLM does.
The prompts are read as the gateway prices them (``kvgate.admission.route_work``).
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import orjson

from kvgate.admission.route_work import POOLING_ROUTES, Work
from kvgate.sim.engine import EngineRequest
from kvgate.sim.exchange import Exchange

EMBEDDING_DIMENSIONS = 32

_ID_PREFIX = {
    "/v1/embeddings": "embd-",
    "/pooling": "pool-",
    "/classify": "classify-",
    "/score": "score-",
    "/v1/score": "score-",
}


class PoolingExchange(Exchange):
    """A pooling request in flight: each prompt's one step, then the route's body, whole."""

    __slots__ = ("path", "prompt_ids", "request_body")

    def bind(self, path: str, body: dict[str, Any], prompt_ids: list[list[int]]) -> None:
        self.path = path
        self.request_body = body
        self.prompt_ids = prompt_ids

    def on_token(self, seq: EngineRequest, index: int) -> bool:
        first = not self.buf
        if first:
            self.buf.append(b"")
        if seq.finish_reason is not None:
            self.remaining -= 1
        return first

    def flush(self) -> None:
        self.buf.clear()
        if self.remaining:
            return
        body = pooling_body(
            self.path, self.request_body, self.response_id, self.created, self.model, self.prompt_ids
        )
        self._record(body)
        self.owner.finish(self)
        self.conn.respond(200, body)


def pooling_body(
    path: str, request: dict[str, Any], response_id: str, created: int, model: str, prompts: list[list[int]]
) -> bytes:
    """The answer vLLM writes on ``path`` for ``prompts`` (token ids, in the request's order)."""
    prompt_tokens = sum(len(p) for p in prompts)
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    work = POOLING_ROUTES[path]
    if work is Work.RERANK:
        documents = request.get("documents") or []
        scored = [(i, _score(p)) for i, p in enumerate(prompts)]
        scored.sort(key=lambda item: -item[1])
        top_n = request.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            scored = scored[:top_n]
        results = [
            {"index": i, "document": {"text": _document_text(documents, i)}, "relevance_score": score}
            for i, score in scored
        ]
        usage_total = {"total_tokens": prompt_tokens}
        return orjson.dumps(
            {"id": "rerank-" + response_id, "model": model, "usage": usage_total, "results": results}
        )
    data: list[dict[str, Any]]
    if work is Work.SCORE:
        data = [{"index": i, "object": "score", "score": _score(p)} for i, p in enumerate(prompts)]
    elif path == "/classify":
        data = []
        for i, p in enumerate(prompts):
            yes = _score(p)
            label = "LABEL_1" if yes >= 0.5 else "LABEL_0"
            data.append({"index": i, "label": label, "probs": [1.0 - yes, yes], "num_classes": 2})
    else:
        packed = request.get("encoding_format") == "base64"
        kind = "embedding" if path == "/v1/embeddings" else "pooling"
        field = "embedding" if kind == "embedding" else "data"
        data = [
            {"index": i, "object": kind, field: _packed(vector) if packed else vector}
            for i, vector in enumerate(_vector(p) for p in prompts)
        ]
    prefix = _ID_PREFIX.get(path, "pool-")
    return orjson.dumps(
        {
            "id": prefix + response_id,
            "object": "list",
            "created": created,
            "model": model,
            "data": data,
            "usage": usage,
        }
    )


def _vector(token_ids: list[int]) -> list[float]:
    """A unit vector fixed by the tokens: equal texts embed equally."""
    seed = hash(tuple(token_ids)) & 0xFFFFFFFF
    raw = [math.sin(seed * (k + 1) * 0.618 + k) for k in range(EMBEDDING_DIMENSIONS)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _packed(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _score(token_ids: list[int]) -> float:
    return (hash(tuple(token_ids)) & 0xFFFF) / 0xFFFF


def _document_text(documents: Any, index: int) -> str:
    if isinstance(documents, list) and index < len(documents):
        document = documents[index]
        if isinstance(document, str):
            return document
        if isinstance(document, dict):
            return str(document.get("text", ""))
    return ""
