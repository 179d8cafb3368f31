"""The access_log, metrics and tracing sections: what the gateway tells about each request it served.

Both are about the completion routes only. Tracing needs the optional otel extra, so enabling it
without the extra installed fails at start-up, naming the package to install, instead of at the
first request.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, model_validator

from kvgate.config.base import Frozen


class AccessLog(Frozen):
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


class Metrics(Frozen):
    tenant_label: bool = Field(
        default=False,
        description=(
            "Label kvgate_responses_total with the tenant too (bounded: the tenants auth.tenants "
            "names, and anonymous); false: the tenant label is empty, one series per code, reason, "
            "model and route. Default false. Example: true"
        ),
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Tracing(Frozen):
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
