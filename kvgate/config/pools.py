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


SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubernetesReplicas(Frozen):
    selector: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Label selector of the EndpointSlices whose ready endpoints are the replicas (an "
            "EndpointSlice carries its Service's labels): an existing fleet found by its labels, "
            "whatever its Service's type. Give this or service. Example: app.kubernetes.io/name=vllm"
        ),
    )
    service: str | None = Field(
        default=None,
        min_length=1,
        description="The Service whose EndpointSlices are the replicas; give this or selector. Example: vllm",
    )
    namespace: str | None = Field(
        default=None,
        description=(
            "Namespace of the EndpointSlices. Default: the gateway pod's own (its service account's "
            "namespace file). Example: inference"
        ),
    )
    port: str = Field(
        default="http",
        min_length=1,
        description=(
            "The endpoints' port, by name (as the Service names it) or number. Default http. Example: 8000"
        ),
    )
    refresh_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two reads of the EndpointSlices. Default 10. Example: 5",
    )
    scheme: Literal["http", "https"] = Field(
        default="http", description="URL scheme of the replicas. Default http."
    )
    api_url: str | None = Field(
        default=None,
        description=(
            "Kubernetes API server. Default: the pod's own cluster (https://$KUBERNETES_SERVICE_HOST:"
            "$KUBERNETES_SERVICE_PORT, with its service account's token and CA). "
            "Example: https://kubernetes.default.svc"
        ),
    )
    token_file: str = Field(
        default=f"{SERVICE_ACCOUNT}/token",
        description="Bearer token for the API server (read at each refresh: it rotates). "
        f"Default {SERVICE_ACCOUNT}/token.",
    )
    ca_file: str = Field(
        default=f"{SERVICE_ACCOUNT}/ca.crt",
        description=f"CA bundle of the API server, for https. Default {SERVICE_ACCOUNT}/ca.crt.",
    )

    @model_validator(mode="after")
    def _one_selection(self) -> KubernetesReplicas:
        if (self.selector is None) == (self.service is None):
            raise ValueError("give exactly one of selector (a label selector) or service (a Service name)")
        return self


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
        default=None,
        description=(
            "Discover replicas from a DNS name (a headless Service); in a pod, a ClusterIP Service's "
            "name is refused (its one virtual IP would look like one replica)."
        ),
    )
    kubernetes: KubernetesReplicas | None = Field(
        default=None,
        description=(
            "Discover replicas from the Kubernetes API: the ready endpoints of the EndpointSlices "
            "of a Service or a label selector (needs get/list/watch on endpointslices)."
        ),
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
        if bool(self.replicas) + (self.dns is not None) + (self.kubernetes is not None) != 1:
            raise ValueError("give exactly one of replicas (a list of URLs), dns or kubernetes")
        return self

    @property
    def discovered(self) -> bool:
        """Its replicas come from discovery (DNS or the Kubernetes API), not from the file."""
        return self.dns is not None or self.kubernetes is not None
