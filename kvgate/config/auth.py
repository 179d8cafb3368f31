"""The auth section: every credential the gateway checks or passes on, and the rules about them.

Who may call what is one decision, reviewed at once: which bearer key is which tenant and whether
a key is required, the admin token of ``/admin/*``, the read-only token and the switch of the
observability routes, and whether a client's own credentials reach the replicas. They used to be
split between ``server`` and ``admission``, so turning auth on meant editing two sections and the
observability default hung on a key of a third; they are read at those old places for one release
(``kvgate.config.renames``). What a tenant may spend (weight, budget, priority) stays admission's
(``kvgate.config.admission``): auth says who a request is, admission what that tenant gets. A
pool's ``api_key``, the gateway's own credential towards its replicas, stays with its pool.

Every token and key is a secret (``kvgate.config.secrets``): printed as ``**********``, and
readable from a file instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from kvgate.config.base import Frozen
from kvgate.config.secrets import digits_as_text, read_secret_files


class TenantKeys(Frozen):
    name: str = Field(
        min_length=1,
        description=(
            "Tenant the keys identify; its weight, budget and priority are the admission.tenants "
            "entry of this name (defaults when there is none). No default. Example: search-team"
        ),
    )
    api_keys: tuple[SecretStr, ...] = Field(
        default=(),
        description="Bearer API keys that identify this tenant (list of text); secrets, never printed. "
        "Default empty. Example: ['sk-search-1']",
    )
    api_keys_file: str | None = Field(
        default=None,
        description="File holding api_keys, one per line (blank lines skipped); give this or api_keys "
        "(path). Default none. Example: /run/secrets/search-team-keys",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any, info: ValidationInfo) -> Any:
        return read_secret_files(data, (), lists=("api_keys",), info=info)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _digits_are_text(cls, value: object) -> object:
        return digits_as_text(value)


class AdminAccess(Frozen):
    """The admin token alone: all that a client of ``/admin/*`` (``kvgate autoscale``) reads of this
    section, so it needs none of the other secrets' files mounted."""

    SECRETS: ClassVar[tuple[str, ...]] = ("admin_token",)

    admin_token: SecretStr | None = Field(
        default=None,
        min_length=1,
        description=(
            "Bearer token required on /admin/* (Authorization: Bearer <token>); unset: /admin/* "
            "accepts loopback clients only. A secret: never printed. An all-digit value "
            "(KVGATE_AUTH__ADMIN_TOKEN=1234, which YAML reads as a number) is taken as text; quote "
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

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any, info: ValidationInfo) -> Any:
        return read_secret_files(data, cls.SECRETS, info=info)

    @field_validator("admin_token", mode="before")
    @classmethod
    def _digits_are_text(cls, value: object) -> object:
        return digits_as_text(value)


class AuthConfig(AdminAccess):
    SECRETS: ClassVar[tuple[str, ...]] = ("admin_token", "observability_token")

    enabled: bool = Field(
        default=False,
        description="Require a known API key on the completion routes and /v1/models (401 otherwise) "
        "(bool). Default false (as in 'kvgate up'). Example: true",
    )
    tenants: tuple[TenantKeys, ...] = Field(
        default=(),
        description="Which bearer keys are which tenant (list). Default empty. "
        "Example: [{name: search, api_keys: [sk-1]}]",
    )
    protect_observability: bool | None = Field(
        default=None,
        description=(
            "Whether /metrics, /signals, /docs and /openapi.json need a bearer token (the admin "
            "token or observability_token; with neither set, loopback clients only). Unset: "
            "protected exactly when enabled is true. Default unset. Example: true"
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

    @field_validator("observability_token", mode="before")
    @classmethod
    def _observability_digits_are_text(cls, value: object) -> object:
        return digits_as_text(value)

    @model_validator(mode="after")
    def _one_tenant_per_key(self) -> AuthConfig:
        problems: list[str] = []
        owners: dict[str, str] = {}
        names: set[str] = set()
        for tenant in self.tenants:
            if tenant.name in names:
                problems.append(f"tenants: name {tenant.name!r} appears twice")
            names.add(tenant.name)
            for secret in tenant.api_keys:
                key = secret.get_secret_value()
                if key in owners:
                    problems.append(
                        f"tenants: an API key of {tenant.name!r} already belongs to {owners[key]!r}"
                    )
                owners[key] = tenant.name
        if self.enabled and not owners:
            problems.append("enabled = true but no tenant has an API key: every request would be 401")
        if problems:
            raise ValueError("; ".join(problems))
        return self
