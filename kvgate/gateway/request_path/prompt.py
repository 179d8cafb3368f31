"""The prompt's tokens (count and prefix block hashes), counted the way each model's config says.

Tokenisers come from the top-level ``models[]`` entries (the one home of model facts). A local
tokeniser runs inline for small prompts and in a worker thread above ``OFF_LOOP_TEXT_BYTES`` of text,
so one huge prompt never stalls every other request on the event loop. Prompts counted inline are
remembered, by model and text, in a bounded least-recently-used map (``CACHED_PROMPTS``): a repeated
prompt (a system prompt, a retried or replayed request) costs one dictionary lookup instead of a
tokenisation and a hashing. Kind ``replica``
asks a replica of the model's pool for its own count (``POST /tokenize``): exact, one round trip.
A completions prompt given as token ids is counted as it is, whatever the kind: the replica takes
those ids as they are too.

Counting a large prompt is bounded, because an 8 MB prompt costs seconds of CPU: at most the
model's ``tokenize_concurrency`` prompts over ``OFF_LOOP_TEXT_BYTES`` are counted at once (a worker
thread or a replica's /tokenize each), the rest wait their turn, and a waiter whose client leaves is
cancelled and stops waiting at once. A worker counts in an ``EncodeJob``: when the awaiting request
is cancelled (its client left) the job stops before its next run, and it stops by itself once the
count reaches the model's ``max_model_len`` (the request then gets the over-context 400 from
``kvgate.admission.cost``, whose count is then the count reached, a lower bound), or before counting at all
when the text's lower bound already does. A turn is given back when the worker really stops, not
when its client leaves, so the bound holds for CPU, not just for requests.
``running``, ``waiting`` and ``tokens_counted`` show that work to operators and tests.

What pricing needs of a prompt is its count and its prefix block hashes (``PromptTokens``), not its
ids. A worker hashes each run's blocks as soon as the run is counted and lets its ids go, so a
prompt of a quarter of a million tokens never has its ids held at once, hashed or freed on the event
loop (each of those took milliseconds there, stalling every small request beside it).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from kvgate.admission.counting import prompt_of, template_for, tokenizer_for
from kvgate.admission.encode_job import EncodeJob
from kvgate.admission.tokenizer import ChatTemplate, Tokenizer, prompt_text
from kvgate.config.models import Model
from kvgate.routing.prefix_hash import BlockHasher, block_hashes

OFF_LOOP_TEXT_BYTES = 32 * 1024
CACHED_PROMPTS = 1024
_GIVE_WAY = functools.partial(time.sleep, 0)
"""Between a worker's runs: the GIL to a waiting event loop at once (``EncodeJob.pause``)."""


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A prompt as pricing and routing see it: its token count and its full blocks' chained hashes
    (``kvgate.routing.prefix_hash``). A prompt counted off the event loop to the model's window or past it
    has no blocks: it is refused as over the context, so nothing routes it."""

    count: int
    block_hashes: tuple[int, ...]

    @classmethod
    def of(cls, token_ids: Sequence[int], block_size_tokens: int) -> PromptTokens:
        return cls(len(token_ids), tuple(block_hashes(token_ids, block_size_tokens)))


class PromptEncoder:
    """A request body's prompt counted (``PromptTokens``), per model."""

    def __init__(self, models: Sequence[Model], block_size_tokens: int) -> None:
        self._block_size_tokens = block_size_tokens
        """The replicas' KV block size: prompts are hashed in their blocks."""
        self._local = {m.name: (tokenizer_for(m.tokenizer), template_for(m.chat_template)) for m in models}
        self._cache: dict[tuple[str, str], PromptTokens] = {}
        self._limits = {m.name: m.max_model_len for m in models}
        self._turns = {m.name: asyncio.Semaphore(m.tokenize_concurrency) for m in models}
        self._jobs: list[EncodeJob] = []
        self._tokens_finished = 0
        self.running = 0
        """Prompts being counted off the event loop now (worker threads and replica round trips)."""
        self.waiting = 0
        """Prompts waiting for a turn to be counted off the event loop."""

    @property
    def tokens_counted(self) -> int:
        """Tokens counted off the event loop since start, including jobs still running."""
        return self._tokens_finished + sum(job.tokens_counted for job in self._jobs)

    def is_local(self, model: str) -> bool:
        """Whether ``model`` is counted here (no replica needed)."""
        return self._local[model][0] is not None

    def encode_inline(self, model: str, body: Mapping[str, Any], raw_size_bytes: int) -> PromptTokens | None:
        """The prompt when it is counted here, on the event loop (a local tokeniser and a body of at
        most ``OFF_LOOP_TEXT_BYTES``); None when ``encode`` must ask a replica or a worker thread."""
        tokenizer, template = self._local[model]
        if raw_size_bytes > OFF_LOOP_TEXT_BYTES or (tokenizer is None and not _has_token_ids(body)):
            return None
        prompt = prompt_of(body, template)
        if isinstance(prompt, list):
            return PromptTokens.of(prompt, self._block_size_tokens)
        assert tokenizer is not None
        cache = self._cache
        key = (model, prompt)
        tokens = cache.pop(key, None)
        if tokens is None:
            tokens = PromptTokens.of(tokenizer.encode(prompt), self._block_size_tokens)
            if len(cache) >= CACHED_PROMPTS:
                del cache[next(iter(cache))]
        cache[key] = tokens
        return tokens

    async def encode(
        self,
        model: str,
        body: Mapping[str, Any],
        raw_size_bytes: int,
        session: aiohttp.ClientSession,
        url: str,
        headers: Mapping[str, str] | None = None,
    ) -> PromptTokens:
        """The prompt counted inline, in a worker thread or by a replica; see the module's docstring
        for the bounds on that work. ``headers`` go with a ``/tokenize`` call (the pool's
        ``Authorization``)."""
        tokens = self.encode_inline(model, body, raw_size_bytes)
        if tokens is not None:
            return tokens
        tokenizer, template = self._local[model]
        by_replica = tokenizer is None and not _has_token_ids(body)
        if by_replica and raw_size_bytes <= OFF_LOOP_TEXT_BYTES:
            return PromptTokens.of(
                await _replica_tokens(session, url, model, body, headers), self._block_size_tokens
            )
        turns = self._turns[model]
        self.waiting += 1
        try:
            await turns.acquire()
        finally:
            self.waiting -= 1
        if by_replica:
            self.running += 1
            try:
                return PromptTokens.of(
                    await _replica_tokens(session, url, model, body, headers), self._block_size_tokens
                )
            finally:
                self.running -= 1
                turns.release()
        job = EncodeJob(self._limits[model], pause=_GIVE_WAY)
        self._jobs.append(job)
        self.running += 1
        try:
            count = functools.partial(_count, job, tokenizer, template, body, self._block_size_tokens)
            work = asyncio.get_running_loop().run_in_executor(None, count)
        except BaseException:
            self._finished(job, turns, None)
            raise
        work.add_done_callback(functools.partial(self._finished, job, turns))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            job.stopped = True
            raise

    def _finished(self, job: EncodeJob, turns: asyncio.Semaphore, work: asyncio.Future[Any] | None) -> None:
        """The worker stopped: its turn goes to the next waiter. An error of a job whose client left
        has nobody to go to; it is taken here so asyncio does not report it as never retrieved."""
        self._jobs.remove(job)
        self._tokens_finished += job.tokens_counted
        self.running -= 1
        turns.release()
        if work is not None and not work.cancelled():
            work.exception()


def _has_token_ids(body: Mapping[str, Any]) -> bool:
    """Whether a completions prompt is token ids (one list, or a batch of lists)."""
    prompt = body.get("prompt")
    if "messages" in body or not isinstance(prompt, list) or not prompt:
        return False
    return not isinstance(prompt[0], str)


def _count(
    job: EncodeJob,
    tokenizer: Tokenizer | None,
    template: ChatTemplate,
    body: Mapping[str, Any],
    block_size_tokens: int,
) -> PromptTokens:
    """In a worker thread: what to count (a chat rendered, which may be long too), then the count
    and the block hashes, each run hashed and let go before the next is counted."""
    prompt = prompt_of(body, template)
    if isinstance(prompt, list):
        return PromptTokens.of(prompt, block_size_tokens)
    assert tokenizer is not None, "a text prompt of a model counted by its replica"
    limit = job.limit_tokens
    hasher = BlockHasher(block_size_tokens)
    count = 0
    for run in job.runs(tokenizer, prompt):
        count += len(run)
        if count < limit:
            hasher.add(run)
    return PromptTokens(count, tuple(hasher.hashes) if count < limit else ())


async def _replica_tokens(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
) -> list[int]:
    payload: dict[str, Any] = {"model": model}
    if "messages" in body:
        payload["messages"] = body["messages"]
    else:
        payload["prompt"] = prompt_text(body.get("prompt"))
    async with session.post(url + "/tokenize", json=payload, headers=headers) as response:
        response.raise_for_status()
        answer = await response.json()
    tokens = answer.get("tokens")
    if isinstance(tokens, list):
        return [int(t) for t in tokens]
    return [_stand_in_id(payload)] * int(answer.get("count", 0))


def _stand_in_id(payload: Mapping[str, Any]) -> int:
    """One id standing for every token of a prompt whose ids the replica did not give: the count
    prices it, and its prefix blocks are the same for the same prompt (a retry finds its replica)
    and shared with no other prompt, since without ids no common prefix can be known."""
    digest = hashlib.blake2b(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS), digest_size=4).digest()
    return int.from_bytes(digest, "big")
