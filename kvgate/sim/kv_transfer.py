"""The KV hand-off of vLLM's disaggregated serving (the NixlConnector), as a simulated replica does it.

A ``prefill`` replica runs every request as a prefill instance given ``max_tokens=1``: one token,
and its response carries the ``kv_transfer_params`` a decode instance needs (``do_remote_prefill``,
``remote_engine_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``, ``remote_request_id``,
``tp_size``); the transfer is kept for the decode instance to pull until ``kv_transfer_timeout_s``
(vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``), then dropped. A ``decode`` replica given those
parameters pulls the KV from ``remote_host:remote_port`` (the simulator's side channel is ``POST
/kv/pull`` on the prefill replica's own port), waits the time the bytes take over
``kv_link_bytes_per_s``, and skips the prefill: its prompt blocks are allocated as if transferred
and only the last prompt token runs before decoding. A pull that fails (the prefill replica is gone,
the transfer id is unknown, already pulled or expired) fails the request as vLLM's ``fail``
load-failure policy does: a 500, or an error event and ``[DONE]`` on a stream. The prefill replica
frees its KV blocks at its answer (vLLM holds them until the pull); the time a transfer occupies is
charged on the decode side only. Without the parameters a decode replica serves the request as a
mixed replica would.
"""

from __future__ import annotations

import asyncio
import itertools

import orjson

from kvgate.sim.http import Connection, Request
from kvgate.sim.profile import Profile
from kvgate.sim.validation import parse_body

PULL_TIMEOUT_S = 5.0
HANDOFF_FIELDS = ("remote_request_id", "remote_host", "remote_port", "remote_block_ids")
"""What a decode replica needs of ``kv_transfer_params`` to pull; a request lacking one is a 400."""


class KvTransfers:
    """A prefill replica's KV kept for decode instances, by transfer id, until pulled or expired."""

    def __init__(self, profile: Profile, time_scale: float, engine_id: str) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self.engine_id = engine_id
        self._held: dict[str, tuple[float, int]] = {}
        """Transfer id -> (expiry on the loop's clock, bytes)."""
        self._handoffs = itertools.count()

    def __len__(self) -> int:
        """Transfers held, not yet pulled (expired ones included until a pull finds them)."""
        return len(self._held)

    def clear(self) -> None:
        self._held.clear()

    def offer(self, request_id: str, prompt_tokens: int, host: str, port: int) -> dict[str, object]:
        """What a prefill instance's connector returns for the decode instance to pull the KV; the
        transfer is kept until it is pulled or ``kv_transfer_timeout_s`` passes."""
        profile = self.profile
        blocks = -(-prompt_tokens // profile.block_size_tokens)
        first_block = next(self._handoffs) * blocks % max(1, profile.num_gpu_blocks)
        expires_s = asyncio.get_running_loop().time() + profile.kv_transfer_timeout_s * (
            self.time_scale or 1.0
        )
        self._held[request_id] = (expires_s, prompt_tokens * profile.kv_bytes_per_token)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(first_block, first_block + blocks)),
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": 1,
        }

    def serve_pull(self, conn: Connection, request: Request) -> None:
        """The side channel: a decode instance takes the KV of one transfer, once."""
        body = parse_body(request.body)
        transfer_id = body.get("remote_request_id") if isinstance(body, dict) else None
        held = self._held.pop(transfer_id, None) if isinstance(transfer_id, str) else None
        if held is None or held[0] < asyncio.get_running_loop().time():
            message = f"no KV held for transfer {transfer_id!r} (unknown, already pulled or expired)"
            conn.respond(404, orjson.dumps({"error": message}))
            return
        conn.respond(200, orjson.dumps({"bytes": held[1]}))


async def pull(host: str, port: int, transfer_id: str) -> int | str:
    """Take one transfer's KV from a prefill replica's side channel: the bytes moved, or why not."""
    body = orjson.dumps({"remote_request_id": transfer_id})
    head = b"POST /kv/pull HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n" % (
        host.encode(),
        port,
    )
    try:
        async with asyncio.timeout(PULL_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(head + b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
                answer = await reader.read()
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        return f"cannot reach the prefill instance at {host}:{port}: {exc!r}"
    status_line, _, rest = answer.partition(b"\r\n")
    payload = rest.partition(b"\r\n\r\n")[2]
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        parsed = None
    if not status_line.startswith(b"HTTP/1.1 200") or not isinstance(parsed, dict):
        return str(parsed.get("error")) if isinstance(parsed, dict) else status_line.decode("latin-1")
    return int(parsed["bytes"])
