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

import functools
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol, TypeGuard

import orjson
import yaml

from kvgate.admission.tokenizer import DEFAULT_ENCODING, TiktokenTokenizer, Tokenizer
from kvgate.loadtest.arrivals import Process, RateStep, arrival_offsets_s

Api = Literal["chat", "completions"]


class Distribution(Protocol):
    def sample(self, rng: random.Random) -> int: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Fixed:
    value_tokens: int

    def sample(self, rng: random.Random) -> int:
        return self.value_tokens

    def describe(self) -> str:
        return f"{self.value_tokens}"


@dataclass(frozen=True, slots=True)
class Uniform:
    low_tokens: int
    high_tokens: int

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low_tokens, self.high_tokens)

    def describe(self) -> str:
        return f"uniform[{self.low_tokens}, {self.high_tokens}]"


@dataclass(frozen=True, slots=True)
class LogNormal:
    median_tokens: float
    sigma: float
    min_tokens: int
    max_tokens: int

    def sample(self, rng: random.Random) -> int:
        value = round(self.median_tokens * math.exp(self.sigma * rng.gauss(0.0, 1.0)))
        return min(max(value, self.min_tokens), self.max_tokens)

    def describe(self) -> str:
        shape = f"lognormal(median {self.median_tokens:g}, sigma {self.sigma:g})"
        return f"{shape} in [{self.min_tokens}, {self.max_tokens}]"


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


PRESETS = ("chat", "summarize", "mixed", "shared-prefix", "burst", "overload")

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more can "
    "time about into than them only other new some could these two may first then do any like my now "
    "over such our man me even most made after also did many before must through back years where much "
    "your way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three house himself "
    "few during without again place around however home small found thought went say part once high "
    "general upon school every does got united left number course war until always away something fact "
    "though water less public put think almost hand enough far took head yet government system better set "
    "told nothing night end why called eyes find going look asked later knew point next program city "
    "business give group toward young days let room president side social given present several order "
    "national possible rather second face per among form important often things looked early white case "
    "john become large big need four within felt along children saw best church ever least power "
    "development light thing seemed family interest want members mind country area others done turned "
    "although open problem service certain kind different thus began door help means sense whole matter "
    "perhaps itself york times law human line above name example action company hands local show whether "
    "five history gave today either act feet across taken past quite anything seen having death experience "
    "body word half really field am car words already themselves information tell together college shall "
    "money period held keep sure free real seems behind cannot miss political air question making office "
    "brought whose special heard major problems ago became federal study available known result street "
    "economic boy position reason change south board individual job areas society west close turn love "
    "community true court force full seem am policy voice plan early minutes river market report model "
    "signal token cache replica queue budget latency window memory batch engine request stream"
)
_WORDS = tuple(_WORD_TEXT.split())

_HEAD_WORDS = 6


class PromptFactory:
    """Builds text of an exact token length; the same ``(key, length_tokens)`` gives the same text."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        decode: Callable[[list[int]], str],
        corpus_seed: int = 0,
        corpus_words: int = 60_000,
    ) -> None:
        self._tokenizer = tokenizer
        self._decode = decode
        corpus = _sentences(random.Random(f"corpus:{corpus_seed}"), corpus_words)
        self._corpus_tokens = tokenizer.encode(corpus)
        self.text = functools.lru_cache(maxsize=1024)(self._text)

    @classmethod
    def from_encoding(cls, encoding_name: str = DEFAULT_ENCODING) -> PromptFactory:
        """Counts through the tokeniser seam; decodes with the same tiktoken encoding."""
        import tiktoken

        encoding = tiktoken.get_encoding(encoding_name)
        return cls(TiktokenTokenizer.from_name(encoding_name), encoding.decode)

    def _text(self, key: int, length_tokens: int) -> str:
        if length_tokens <= 0:
            return ""
        rng = random.Random(key)
        head = " ".join(rng.choice(_WORDS) for _ in range(_HEAD_WORDS)).capitalize() + ":"
        corpus = self._corpus_tokens
        cursor = rng.randrange(len(corpus))
        tokens = self._tokenizer.encode(head)[:length_tokens]
        cursor = self._extend(tokens, cursor, length_tokens - len(tokens))
        text = self._decode(tokens)
        for _ in range(16):
            count = self._tokenizer.count(text)
            if count == length_tokens:
                return text
            if count > length_tokens:
                del tokens[len(tokens) - (count - length_tokens) :]
            else:
                cursor = self._extend(tokens, cursor, length_tokens - count)
            text = self._decode(tokens)
        return _pad_to(self._tokenizer, text, length_tokens)

    def _extend(self, tokens: list[int], cursor: int, count: int) -> int:
        corpus = self._corpus_tokens
        while count > 0:
            take = min(count, len(corpus) - cursor)
            tokens.extend(corpus[cursor : cursor + take])
            count -= take
            cursor = (cursor + take) % len(corpus)
        return cursor


def _pad_to(tokenizer: Tokenizer, text: str, length_tokens: int) -> str:
    """Exact length by whole words when slicing tokens keeps merging across a boundary."""
    while tokenizer.count(text) > length_tokens and text:
        text = text[: text.rfind(" ")] if " " in text else text[:-1]
    while tokenizer.count(text) < length_tokens:
        text += " a"
    return text


def _sentences(rng: random.Random, words: int) -> str:
    parts: list[str] = []
    while words > 0:
        length = rng.randint(6, 18)
        sentence = " ".join(rng.choice(_WORDS) for _ in range(length))
        parts.append(sentence.capitalize() + ".")
        words -= length
    return " ".join(parts)


@functools.cache
def default_factory() -> PromptFactory:
    return PromptFactory.from_encoding()


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


def load_workload(name_or_path: str) -> Workload:
    """A preset by name (see ``PRESETS``) or a YAML file with the same keys."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        text = path.read_text()
    elif name_or_path in PRESETS:
        text = resources.files("kvgate.loadtest").joinpath("workloads", f"{name_or_path}.yaml").read_text()
    else:
        raise ValueError(
            f"unknown workload {name_or_path!r}: not a file, and presets are {', '.join(PRESETS)}"
        )
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"workload {name_or_path!r} must be a mapping")
    return parse_workload(data, default_name=path.stem)


def parse_workload(data: Mapping[str, Any], default_name: str = "workload") -> Workload:
    """Validate a workload mapping, collecting every problem before failing."""
    errors: list[str] = []
    known = {
        "name", "description", "api", "duration_s", "rate_rps", "concurrency", "process", "cv",
        "schedule", "max_requests", "slo_ttft_s", "slo_itl_s", "ignore_eos", "temperature",
        "request_timeout_s", "classes",
    }  # fmt: skip
    errors += [f"unknown key {key!r}" for key in data if key not in known]
    classes: list[RequestClass] = []
    raw_classes = data.get("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        errors.append("classes: need a non-empty list")
        raw_classes = []
    for i, raw in enumerate(raw_classes):
        klass = _parse_class(raw, f"classes[{i}]", errors)
        if klass is not None:
            classes.append(klass)
    schedule: list[RateStep] = []
    for i, step in enumerate(data.get("schedule") or []):
        if isinstance(step, list | tuple) and len(step) == 2 and all(_is_number(x) for x in step):
            schedule.append(RateStep(float(step[0]), float(step[1])))
        else:
            errors.append(f"schedule[{i}]: want [at_ratio, rate_x], got {step!r}")
    api = data.get("api", "chat")
    if api not in ("chat", "completions"):
        errors.append(f"api: want 'chat' or 'completions', got {api!r}")
    process = data.get("process", "poisson")
    if process not in ("poisson", "gamma"):
        errors.append(f"process: want 'poisson' or 'gamma', got {process!r}")
    numbers = {
        "duration_s": 30.0,
        "rate_rps": 2.0,
        "cv": 1.0,
        "slo_ttft_s": 2.0,
        "slo_itl_s": 0.1,
        "temperature": 0.0,
        "request_timeout_s": 600.0,
    }
    values: dict[str, float] = {}
    for key, default in numbers.items():
        value = data.get(key, default)
        if not _is_number(value) or (key != "temperature" and value <= 0):
            errors.append(f"{key}: want a positive number, got {value!r}")
            value = default
        values[key] = float(value)
    optional_ints: dict[str, int | None] = {}
    for key in ("concurrency", "max_requests"):
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or value <= 0):
            errors.append(f"{key}: want a positive integer, got {value!r}")
            value = None
        optional_ints[key] = value
    if errors:
        raise ValueError("invalid workload: " + "; ".join(errors))
    return Workload(
        name=str(data.get("name", default_name)),
        description=str(data.get("description", "")),
        classes=tuple(classes),
        api=api,
        duration_s=values["duration_s"],
        rate_rps=values["rate_rps"],
        concurrency=optional_ints["concurrency"],
        process=process,
        cv=values["cv"],
        schedule=tuple(schedule),
        max_requests=optional_ints["max_requests"],
        slo_ttft_s=values["slo_ttft_s"],
        slo_itl_s=values["slo_itl_s"],
        ignore_eos=bool(data.get("ignore_eos", True)),
        temperature=values["temperature"],
        request_timeout_s=values["request_timeout_s"],
    )


def _parse_class(raw: Any, where: str, errors: list[str]) -> RequestClass | None:
    if not isinstance(raw, Mapping):
        errors.append(f"{where}: want a mapping, got {raw!r}")
        return None
    known = {
        "name", "weight", "prompt_tokens", "output_tokens", "system_prompts", "system_prompt_tokens",
        "turns", "live_sessions",
    }  # fmt: skip
    errors += [f"{where}: unknown key {key!r}" for key in raw if key not in known]
    weight = raw.get("weight", 1.0)
    if not _is_number(weight) or weight <= 0:
        errors.append(f"{where}.weight: want a positive number, got {weight!r}")
        weight = 1.0
    counts: dict[str, int] = {}
    for key, default in (("system_prompts", 0), ("live_sessions", 8)):
        value = raw.get(key, default)
        if not isinstance(value, int) or value < 0:
            errors.append(f"{where}.{key}: want an integer >= 0, got {value!r}")
            value = default
        counts[key] = value
    return RequestClass(
        name=str(raw.get("name", where)),
        weight=float(weight),
        prompt_tokens=parse_distribution(raw.get("prompt_tokens"), f"{where}.prompt_tokens", errors),
        output_tokens=parse_distribution(raw.get("output_tokens"), f"{where}.output_tokens", errors),
        system_prompts=counts["system_prompts"],
        system_prompt_tokens=parse_distribution(
            raw.get("system_prompt_tokens", 0), f"{where}.system_prompt_tokens", errors
        ),
        turns=parse_distribution(raw.get("turns", 1), f"{where}.turns", errors),
        live_sessions=counts["live_sessions"],
    )


def parse_distribution(raw: Any, where: str, errors: list[str]) -> Distribution:
    """``50``, ``{fixed: 50}``, ``{uniform: [a, b]}`` or ``{lognormal: {median, sigma, min, max}}``."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return Fixed(raw)
    if isinstance(raw, Mapping) and len(raw) == 1:
        kind, spec = next(iter(raw.items()))
        if kind == "fixed" and isinstance(spec, int) and spec >= 0:
            return Fixed(spec)
        if (
            kind == "uniform"
            and isinstance(spec, list)
            and len(spec) == 2
            and all(isinstance(x, int) for x in spec)
            and 0 <= spec[0] <= spec[1]
        ):
            return Uniform(spec[0], spec[1])
        if kind == "lognormal" and isinstance(spec, Mapping):
            median, sigma = spec.get("median"), spec.get("sigma", 0.5)
            low, high = spec.get("min", 1), spec.get("max")
            if _is_number(median) and median > 0 and _is_number(sigma) and sigma >= 0:
                high = high if isinstance(high, int) else round(median * 10)
                if isinstance(low, int) and 0 <= low <= high:
                    return LogNormal(float(median), float(sigma), low, high)
    errors.append(
        f"{where}: want an integer, {{fixed: n}}, {{uniform: [low, high]}} or "
        f"{{lognormal: {{median, sigma, min, max}}}}, got {raw!r}"
    )
    return Fixed(1)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def with_overrides(
    workload: Workload,
    *,
    duration_s: float | None = None,
    rate_rps: float | None = None,
    concurrency: int | None = None,
    max_requests: int | None = None,
    slo_ttft_s: float | None = None,
    slo_itl_s: float | None = None,
) -> Workload:
    """The workload with command-line values in place of its own; a rate makes it open loop."""
    changes: dict[str, Any] = {}
    if duration_s is not None:
        changes["duration_s"] = duration_s
    if rate_rps is not None:
        changes["rate_rps"] = rate_rps
        changes["concurrency"] = None
    if concurrency is not None:
        changes["concurrency"] = concurrency
    if max_requests is not None:
        changes["max_requests"] = max_requests
    if slo_ttft_s is not None:
        changes["slo_ttft_s"] = slo_ttft_s
    if slo_itl_s is not None:
        changes["slo_itl_s"] = slo_itl_s
    return replace(workload, **changes)
