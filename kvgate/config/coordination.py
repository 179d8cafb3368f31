"""The coordination section: gateway replicas of one fleet sharing their claims through Redis.

Absent, a gateway keeps everything in memory (one process). Present, claims are leased, so a
gateway that dies gives its share back within ``lease_s``; ``fail_mode`` says what a gateway does
while it cannot see the others. The Redis URL may carry a password, so it is a secret.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from kvgate.config.base import Frozen
from kvgate.config.secrets import read_secret_files


class Coordination(Frozen):
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
    def _read_secret_files(cls, data: Any, info: ValidationInfo) -> Any:
        return read_secret_files(data, ("redis_url",), info=info)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value
