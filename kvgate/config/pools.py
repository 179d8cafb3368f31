"""The pools section: groups of replicas, where they are (static URLs or a DNS name) and what each holds.

Every static URL goes through ``kvgate.config.urls`` so the gateway stores, probes and labels one
normal form. A pool's ``api_key`` goes into an HTTP header, so it must be visible ASCII.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator

from kvgate.config.base import Frozen
from kvgate.config.secrets import digits_as_text, read_secret_files
from kvgate.config.urls import replica_base_url


def _replica_url(url: object) -> str:
    try:
        return replica_base_url(url)
    except ValueError as exc:
        raise ValueError(f"replica URL {url!r}: {exc}") from None


ReplicaUrl = Annotated[str, BeforeValidator(_replica_url)]
"""A static replica URL in normal form; each bad one of a list is its own problem (key and index)."""


class DnsReplicas(Frozen):
    name: str = Field(description="DNS name whose A/AAAA records are the replicas. Example: vllm.default.svc")
    port: int = Field(default=8000, gt=0, le=65535, description="Replica port. Default 8000. Example: 8000")
    refresh_s: float = Field(
        default=10.0, gt=0, description="Seconds between re-resolutions. Default 10. Example: 30"
    )
    scheme: Literal["http", "https"] = Field(default="http", description="URL scheme. Default http.")


class Pool(Frozen):
    name: str = Field(description="Pool name, unique. Example: chat")
    role: Literal["mixed", "prefill", "decode"] = Field(
        default="mixed", description="Replica role. Default mixed."
    )
    models: tuple[str, ...] = Field(
        default=(),
        description="Model names served by this pool; empty means every configured model. Default [].",
    )
    replicas: tuple[ReplicaUrl, ...] = Field(
        default=(),
        description="Static replica base URLs (without /v1); or give dns. Example: [http://10.0.0.5:8000]",
    )
    dns: DnsReplicas | None = Field(
        default=None, description="Discover replicas from a DNS name (headless Service)."
    )
    kv_capacity_tokens: int | None = Field(
        default=None,
        gt=0,
        description=(
            "KV cache capacity of one replica, in tokens. Default none: each replica's own, read from "
            "its vllm:cache_config_info (kv_cache_size_tokens, or num_gpu_blocks x block_size) on its "
            "first /metrics scrape; "
            "until then it takes no requests. When given, it overrides what replicas report, and a "
            "replica that reports another value is warned about. Example: 455000"
        ),
    )
    max_sequences: int = Field(
        default=256,
        gt=0,
        description=(
            "Most concurrent sequences per replica (vLLM's --max-num-seqs, which its /metrics does not "
            "report). Default 256. Example: 128"
        ),
    )
    kv_events: Literal["auto", "off"] = Field(
        default="auto",
        description=(
            "Follow each replica's KV cache events (vLLM's --kv-events-config, ZMQ): 'auto' asks "
            "each replica's GET /kv_event_sources where it publishes and subscribes, so routing reads "
            "what its prefix cache holds, evictions included; a replica that publishes nothing is "
            "routed on what kvgate sent it. 'off' never subscribes. Default auto. Example: off"
        ),
    )
    api_key: SecretStr | None = Field(
        default=None,
        min_length=1,
        description=(
            "Key the gateway sends as 'Authorization: Bearer <key>' on every call to this pool's "
            "replicas (completions, /tokenize, health probes, /metrics scrapes), as vLLM's --api-key "
            "expects; it replaces any client Authorization. A secret: never printed. Default none. "
            "Example: sk-vllm-pool-1"
        ),
    )
    api_key_file: str | None = Field(
        default=None,
        description="File holding api_key; give this or api_key. Default none. "
        "Example: /run/secrets/vllm-api-key",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any, info: ValidationInfo) -> Any:
        return read_secret_files(data, ("api_key",), info=info)

    @field_validator("api_key", mode="before")
    @classmethod
    def _digits_are_text(cls, value: object) -> object:
        return digits_as_text(value)

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not all(0x21 <= ord(ch) <= 0x7E for ch in key.get_secret_value()):
            raise ValueError("an api_key is visible ASCII (it goes into an HTTP header)")
        return key

    @model_validator(mode="after")
    def _one_source(self) -> Pool:
        if bool(self.replicas) == (self.dns is not None):
            raise ValueError("give exactly one of replicas (a list of URLs) or dns")
        return self
