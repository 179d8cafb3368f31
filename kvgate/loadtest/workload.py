"""Workloads in the language of tokens, and the deterministic trace a seed makes of one.

A workload is a weighted mix of request classes, each with prompt and output lengths drawn from
distributions (fixed, uniform, lognormal clamped to a range), optional shared system prompts and
multi-turn sessions, plus how requests arrive (open loop at a rate with a schedule, or closed loop
at a concurrency) and the SLOs that define goodput. ``build_trace`` turns a workload and a seed into
the exact list of requests, their bodies and send offsets; the same seed gives the same trace, byte
for byte. Prompts are text-like (words from a fixed list) and built to an exact token count on the
project's tokeniser seam, each opening with its own words so unrelated prompts never share a
cached prefix by accident; only system prompts and session history do, as intended.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from kvgate.loadtest.arrivals import Process, RateStep, arrival_offsets_s
from kvgate.loadtest.distributions import Distribution, Fixed
from kvgate.loadtest.prompt_text import PromptFactory, default_factory

Api = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One kind of request in the mix. ``prompt_tokens`` is the new user text per turn."""

    name: str
    weight: float
    prompt_tokens: Distribution
    output_tokens: Distribution
    system_prompts: int = 0
    system_prompt_tokens: Distribution = Fixed(0)
    turns: Distribution = Fixed(1)
    live_sessions: int = 8


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    classes: tuple[RequestClass, ...]
    description: str = ""
    api: Api = "chat"
    duration_s: float = 30.0
    rate_rps: float = 2.0
    concurrency: int | None = None
    process: Process = "poisson"
    cv: float = 1.0
    schedule: tuple[RateStep, ...] = ()
    max_requests: int | None = None
    slo_ttft_s: float = 2.0
    slo_itl_s: float = 0.1
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 600.0

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. ``at_s`` is its send offset (``None`` in a closed loop)."""

    index: int
    class_name: str
    at_s: float | None
    api: Api
    prompt_tokens: int
    max_tokens: int
    payload: Mapping[str, Any] = field(repr=False)
    session: int | None = None

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def body(self, model: str) -> bytes:
        return orjson.dumps({"model": model, **self.payload})


@dataclass(frozen=True, slots=True)
class Trace:
    workload: Workload
    seed: int
    requests: tuple[TraceRequest, ...]
    duration_s: float
    salt: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)


@dataclass(slots=True)
class _Session:
    ident: int
    system_index: int | None
    turns_left: int
    history: list[dict[str, str]]
    history_tokens: int


def build_trace(
    workload: Workload,
    seed: int,
    *,
    factory: PromptFactory | None = None,
    salt: int = 0,
) -> Trace:
    """The requests a seed makes of a workload: open loop by its arrival schedule, closed loop up to
    ``max_requests`` (default: enough for the concurrency to run the duration at one request/s each).

    ``salt`` changes every text and nothing else (same classes, lengths and send times): replaying
    a trace against a warm fleet, or against several gateways sharing replicas, would otherwise
    measure the prefix cache left behind by the previous run."""
    factory = factory or default_factory()
    salt_key = salt << 64
    mix_rng = random.Random(f"{seed}:mix")
    if workload.closed_loop:
        count = workload.max_requests or int(
            max(1, workload.concurrency or 1) * max(workload.duration_s, 1.0)
        )
        offsets: list[float | None] = [None] * count
    else:
        arrivals = arrival_offsets_s(
            workload.rate_rps,
            workload.duration_s,
            random.Random(f"{seed}:arrivals"),
            process=workload.process,
            cv=workload.cv,
            steps=workload.schedule,
        )
        offsets = list(arrivals[: workload.max_requests] if workload.max_requests else arrivals)
    weights = [c.weight for c in workload.classes]
    sessions: dict[str, list[_Session]] = {c.name: [] for c in workload.classes}
    next_session = 0
    requests: list[TraceRequest] = []
    for index, at_s in enumerate(offsets):
        klass = mix_rng.choices(workload.classes, weights)[0]
        user_tokens = klass.prompt_tokens.sample(mix_rng)
        max_tokens = max(1, klass.output_tokens.sample(mix_rng))
        user_text = factory.text(salt_key + mix_rng.getrandbits(64), user_tokens)
        session: _Session | None = None
        if klass.system_prompts > 0 or klass.turns != Fixed(1):
            live = sessions[klass.name]
            if len(live) < max(1, klass.live_sessions):
                system_index = mix_rng.randrange(klass.system_prompts) if klass.system_prompts else None
                session = _Session(next_session, system_index, max(1, klass.turns.sample(mix_rng)), [], 0)
                next_session += 1
                live.append(session)
            else:
                session = live[mix_rng.randrange(len(live))]
        messages: list[dict[str, str]] = []
        prompt_tokens = user_tokens
        if session is not None:
            if session.system_index is not None:
                system_rng = random.Random(f"{seed}:{klass.name}:system:{session.system_index}")
                system_tokens = klass.system_prompt_tokens.sample(system_rng)
                messages.append(
                    {
                        "role": "system",
                        "content": factory.text(salt_key + system_rng.getrandbits(64), system_tokens),
                    }
                )
                prompt_tokens += system_tokens
            messages.extend(session.history)
            prompt_tokens += session.history_tokens
        messages.append({"role": "user", "content": user_text})
        payload = _payload(workload, messages, max_tokens)
        requests.append(
            TraceRequest(
                index=index,
                class_name=klass.name,
                at_s=at_s,
                api=workload.api,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                payload=payload,
                session=session.ident if session else None,
            )
        )
        if session is not None:
            reply = factory.text(salt_key + mix_rng.getrandbits(64), max_tokens)
            session.history += [
                {"role": "user", "content": user_text},
                {"role": "assistant", "content": reply},
            ]
            session.history_tokens += user_tokens + max_tokens
            session.turns_left -= 1
            if session.turns_left <= 0:
                sessions[klass.name].remove(session)
    return Trace(
        workload=workload, seed=seed, requests=tuple(requests), duration_s=workload.duration_s, salt=salt
    )


def _payload(workload: Workload, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    common: dict[str, Any] = {
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": workload.temperature,
    }
    if workload.ignore_eos:
        common["ignore_eos"] = True
    if workload.api == "chat":
        return {"messages": messages, **common}
    return {"prompt": "\n\n".join(m["content"] for m in messages), **common}
