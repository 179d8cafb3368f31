"""A fleet of simulated replicas in one process, plus the HTTP control API that resizes it.

Replica ids are stable: ``replicas[i]`` (and ``urls[i]``) is the replica created i-th, whatever
happened to it since; ``live`` lists the ones not killed or removed. Ports are chosen up front
(``port`` … ``port + N - 1``, or free ephemeral ports when ``port`` is 0), so a replica's URL is
known during its cold start while its port still refuses connections.

With ``kv_events``, replica ``i`` publishes its KV cache events on ``kv_events.port + i`` (a free
port when that is 0); its vLLM block hashes come from one ``BlockDigests`` the fleet shares, seeded as
vLLM's are by ``PYTHONHASHSEED`` if set.

Control API (``control_port``; JSON in and out): ``GET /replicas`` lists ``{id, url, port, state,
role, kv_events_endpoint}``; ``POST /replicas`` adds one (body ``{"cold_start_s": S, "role": R,
"kv_events": B}``, all optional) and answers at once while it loads; ``DELETE /replicas/{id}`` drains
then removes it; ``POST /replicas/{id}/kill``, ``/pause``, ``/resume`` and ``/drain`` apply that fault
or transition; ``POST /replicas/{id}/reset_prefix_cache`` resets its prefix cache (``{"success": B}``,
false while requests hold blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import orjson

from kvgate.admission.tokenizer import ChatTemplate, Tokenizer
from kvgate.sim.http import Connection, Request
from kvgate.sim.kv_publisher import KvEventsConfig
from kvgate.sim.ports import free_ports
from kvgate.sim.profile import DEFAULT_PROFILE
from kvgate.sim.profile_file import load_profile
from kvgate.sim.replica import SimReplica, parse_role
from kvgate.sim.validation import parse_body
from kvgate.sim.vllm_block_hash import BlockDigests
from kvgate.vocabulary.replica import Role

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_REPLICA_PATH = re.compile(r"^/replicas/(\d+)(?:/(kill|pause|resume|drain|reset_prefix_cache))?$")


async def _load(replica: SimReplica, cold_start_s: float) -> None:
    # A bind failure is kept on the replica (state "failed"); wait_ready() re-raises it.
    with contextlib.suppress(OSError):
        await replica.start(cold_start_s)


class SimFleet:
    def __init__(
        self,
        replicas: int = 1,
        profile: str = DEFAULT_PROFILE,
        model: str = DEFAULT_MODEL,
        time_scale: float = 1.0,
        cold_start_s: float = 0.0,
        seed: int = 0,
        record_streams: bool = False,
        overrides: Mapping[str, Any] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        control_port: int | None = None,
        wait_ready: bool = True,
        tokenizer: Tokenizer | None = None,
        chat_template: ChatTemplate | None = None,
        role: Role | str = Role.MIXED,
        kv_events: KvEventsConfig | None = None,
        prompt_tokens_details: bool = False,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        if time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self.profile = load_profile(profile, overrides)
        self.role = parse_role(role)
        self.model = model
        self.time_scale = time_scale
        self.cold_start_s = cold_start_s
        self.seed = seed
        self.record_streams = record_streams
        self.host = host
        self.replicas: list[SimReplica] = []
        self._initial = replicas
        self._base_port = port
        self._control_port = control_port
        self._wait_ready = wait_ready
        self._tokenizer = tokenizer
        self._chat_template = chat_template
        self._starts: set[asyncio.Task[None]] = set()
        self._control: asyncio.Server | None = None
        self._control_conns: set[Connection] = set()
        self.control_url: str | None = None
        self.kv_events = kv_events
        self.prompt_tokens_details = prompt_tokens_details
        self._digests: BlockDigests | None = None

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    @property
    def live(self) -> list[SimReplica]:
        return [r for r in self.replicas if r.state not in ("killed", "removed")]

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the control API and the initial replicas; on failure, undo what was started."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        if self._control_port is not None:
            self._control = await asyncio.get_running_loop().create_server(
                lambda: Connection(self._handle_control, self._control_conns),
                self.host,
                self._control_port,
                reuse_address=True,
            )
            self.control_url = f"http://{self.host}:{self._control.sockets[0].getsockname()[1]}"
        for _ in range(self._initial):
            await self.add_replica(self.cold_start_s)
        if self._wait_ready:
            await asyncio.gather(*(r.wait_ready() for r in self.replicas))

    async def close(self) -> None:
        for task in list(self._starts):
            task.cancel()
        await asyncio.gather(*self._starts, return_exceptions=True)
        for replica in self.replicas:
            await replica.stop()
        if self._control is not None:
            self._control.close()
            for conn in list(self._control_conns):
                conn.abort()
            self._control = None

    async def add_replica(
        self, cold_start_s: float | None = None, role: Role | str | None = None, kv_events: bool | None = None
    ) -> SimReplica:
        """Create a replica and begin loading it; it listens once its cold start has passed.

        ``role`` defaults to the fleet's; ``kv_events`` to whether the fleet publishes them (on a free
        port if the fleet has no ``kv_events`` of its own). With no cold start the replica is serving
        when this returns; otherwise await ``replica.wait_ready()``.
        """
        index = len(self.replicas)
        events = None
        if kv_events or (kv_events is None and self.kv_events is not None):
            events = (self.kv_events or KvEventsConfig()).for_replica(index)
            if self._digests is None:
                self._digests = BlockDigests(os.environ.get("PYTHONHASHSEED"))
        cold = self.cold_start_s if cold_start_s is None else cold_start_s
        loading = cold > 0 and self.time_scale > 0
        port = self._next_port() if (self._base_port or loading) else 0
        replica = SimReplica(
            index,
            self.profile,
            self.model,
            host=self.host,
            port=port,
            time_scale=self.time_scale,
            seed=self.seed,
            record_streams=self.record_streams,
            tokenizer=self._tokenizer,
            chat_template=self._chat_template,
            role=self.role if role is None else role,
            kv_events=events,
            digests=self._digests,
            prompt_tokens_details=self.prompt_tokens_details,
        )
        self.replicas.append(replica)
        if loading:
            task = asyncio.create_task(_load(replica, cold), name=f"sim-load-{index}")
            self._starts.add(task)
            task.add_done_callback(self._starts.discard)
        else:
            await replica.start()
        return replica

    def _next_port(self) -> int:
        if not self._base_port:
            return free_ports(host=self.host)
        taken = {r.port for r in self.replicas}
        port = self._base_port
        while port in taken or port == self._control_port:
            port += 1
        return port

    async def kill(self, i: int) -> None:
        self.replicas[i].kill()

    async def pause(self, i: int) -> None:
        self.replicas[i].pause()

    async def resume(self, i: int) -> None:
        self.replicas[i].resume()

    async def drain(self, i: int) -> None:
        await self.replicas[i].drain()

    def reset_prefix_cache(self, i: int) -> bool:
        """Reset replica ``i``'s GPU prefix cache; False while requests hold blocks there."""
        return self.replicas[i].engine.reset_prefix_cache()

    async def remove(self, i: int) -> None:
        """Drain replica ``i`` (in-flight requests finish), then shut it down for good."""
        await self.replicas[i].drain()
        await self.replicas[i].stop()

    # control API
    def _describe(self, replica: SimReplica) -> dict[str, Any]:
        return {
            "id": replica.index,
            "url": replica.url,
            "port": replica.port,
            "state": replica.state,
            "role": replica.role.value,
            "kv_events_endpoint": replica.kv_events_endpoint,
        }

    def _handle_control(self, conn: Connection, request: Request) -> None:
        task = asyncio.create_task(self._control_request(conn, request))
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)

    async def _control_request(self, conn: Connection, request: Request) -> None:
        status, body = await self._control_answer(request)
        conn.respond(status, orjson.dumps(body))

    async def _control_answer(self, request: Request) -> tuple[int, Any]:
        method, path = request.method, request.path
        if path == "/replicas":
            if method == "GET":
                return 200, {"replicas": [self._describe(r) for r in self.replicas]}
            if method == "POST":
                body = parse_body(request.body or b"{}")
                if not isinstance(body, dict):
                    return 400, {"detail": body.message}
                cold = body.get("cold_start_s", self.cold_start_s)
                if isinstance(cold, bool) or not isinstance(cold, int | float) or cold < 0:
                    return 400, {"detail": f"cold_start_s must be a number >= 0, got {cold!r}"}
                role = body.get("role", self.role)
                try:
                    parse_role(role)
                except ValueError as exc:
                    return 400, {"detail": str(exc)}
                kv_events = body.get("kv_events")
                if kv_events is not None and not isinstance(kv_events, bool):
                    return 400, {"detail": f"kv_events must be true or false, got {kv_events!r}"}
                replica = await self.add_replica(float(cold), role, kv_events)
                return 201, self._describe(replica)
            return 405, {"detail": "Method Not Allowed"}
        match = _REPLICA_PATH.match(path)
        if match is None:
            return 404, {"detail": "Not Found"}
        index = int(match.group(1))
        if index >= len(self.replicas):
            return 404, {"detail": f"no replica {index}"}
        action = match.group(2)
        if action == "reset_prefix_cache" and method == "POST":
            return 200, {"success": self.reset_prefix_cache(index)}
        if action is None and method == "DELETE":
            await self.remove(index)
        elif action is not None and method == "POST":
            await getattr(self, action)(index)
        elif action is None and method == "GET":
            pass
        else:
            return 405, {"detail": "Method Not Allowed"}
        return 200, self._describe(self.replicas[index])
