"""The server section: the gateway's listener, what it allows a client, and its upstream connections.
Who may call it is the auth section's (``kvgate.config.auth``).

Client limits follow the proxies operators already know (NGINX, Envoy, Apache), named after them
in each description, so a value can be carried over; every limit is in its unit (``_s``,
``_bytes``) and bounded, so no setting turns a limit off by accident.
"""

from __future__ import annotations

from pydantic import Field

from kvgate.config.base import Frozen


class Timeouts(Frozen):
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


class Server(Frozen):
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
