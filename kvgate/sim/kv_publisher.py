"""A simulated replica's KV cache event publisher, as vLLM's ``ZmqEventPublisher`` runs it.

A PUB socket sends one multipart message per engine step that changed the cache: ``[topic, seq,
payload]``, ``seq`` eight bytes big-endian counting from 0 when the replica starts, ``payload`` the
batch in vLLM's msgpack (``kvgate.routing.kv_events.encode_batch``). Sends never block the event
loop: a subscriber too slow to keep under the high-water mark loses messages, as with vLLM, and
sees the gap in ``seq``. With a replay port, a ROUTER socket answers a DEALER's ``[b"", start]`` with
every batch still buffered from ``start`` on, as ``[b"", topic, seq, payload]``, then the end marker
``[b"", b"", seq -1, b""]``; the last ``buffer_steps`` batches are kept.

vLLM binds the endpoint it is configured with (``tcp://*:5557``) and reports it so in
``/kv_event_sources``; a consumer puts the replica's host in place of ``*``. The simulator binds
its replica's host and reports the same shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import zmq
import zmq.asyncio

from kvgate.routing.kv_events import KvEvent, KvEventBatch, encode_batch

REPLAY_END = b"\xff" * 8
"""The ``seq`` frame of the replay's end marker: -1 as eight bytes."""


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """Where a fleet's replicas publish (vLLM's ``--kv-events-config``, one replica each)."""

    port: int = 0
    """Replica ``i`` publishes on ``port + i``; 0: each on a free port."""
    topic: str = "kv-events"
    """The first frame of every message (vLLM's default is empty; subscribers match by prefix)."""
    replay_port: int | None = None
    """Replica ``i`` answers replay requests on ``replay_port + i``; 0: a free port; None: no replay."""
    buffer_steps: int = 10_000
    hwm: int = 100_000

    def for_replica(self, index: int) -> KvEventsConfig:
        replay = self.replay_port
        return dataclasses.replace(
            self,
            port=self.port + index if self.port else 0,
            replay_port=replay + index if replay else replay,
        )


class KvEventPublisher:
    def __init__(self, config: KvEventsConfig, host: str) -> None:
        self.config = config
        self.host = host
        self.port = config.port
        self.replay_port = config.replay_port
        self._topic = config.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes, bytes]] = deque(maxlen=config.buffer_steps)
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None

    @property
    def num_batches(self) -> int:
        """Batches published so far: the next one's ``seq``."""
        return self._seq

    @property
    def endpoint(self) -> str:
        """Where a subscriber connects."""
        return f"tcp://{self.host}:{self.port}"

    def start(self) -> None:
        """Bind the sockets; an ``OSError`` if a port is taken, with nothing left open."""
        config = self.config
        try:
            pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
            self._pub = pub
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, config.hwm)
            self.port = _bind(pub, self.host, config.port)
            if config.replay_port is not None:
                router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
                self._router = router
                router.setsockopt(zmq.LINGER, 0)
                self.replay_port = _bind(router, self.host, config.replay_port)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(
                exc.errno, f"cannot bind the KV event sockets on {self.host}: {exc.strerror}"
            ) from None
        if self._router is not None:
            self._replay_task = asyncio.create_task(self._serve_replay(self._router), name="kv-events-replay")

    def publish(self, events: Sequence[KvEvent], ts: float) -> None:
        """Send one step's events as the next batch; dropped if the socket is past its high-water mark."""
        if self._pub is None:
            return
        payload = encode_batch(KvEventBatch(ts, tuple(events)))
        seq = self._seq
        self._seq += 1
        seq_frame = seq.to_bytes(8, "big")
        if self._router is not None:
            self._buffer.append((seq, seq_frame, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self._topic, seq_frame, payload], flags=zmq.NOBLOCK)

    def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            self._replay_task = None
        for socket in (self._pub, self._router):
            if socket is not None:
                socket.close(linger=0)
        self._pub = None
        self._router = None

    def sources_body(self) -> bytes:
        return sources_body(self.config, self.port, self.replay_port)

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        topic = self._topic
        while True:
            frames = await router.recv_multipart()
            start = frames[-1]
            if len(frames) < 2 or len(start) != 8:
                continue
            identity = frames[0]
            first = int.from_bytes(start, "big")
            for seq, seq_frame, payload in list(self._buffer):
                if seq >= first:
                    await router.send_multipart([identity, b"", topic, seq_frame, payload])
            await router.send_multipart([identity, b"", b"", REPLAY_END, b""])


def sources_body(config: KvEventsConfig | None, port: int = 0, replay_port: int | None = None) -> bytes:
    """vLLM's ``GET /kv_event_sources``: its KV events config per data-parallel rank (one here), the
    endpoints as bound with ``*`` for the host; with events off, vLLM's defaults, disabled."""
    if config is None:
        disabled = KvEventsConfig(port=5557, topic="")
        body = _config_body(disabled, disabled.port, None)
        body.update(enable_kv_cache_events=False, publisher="null")
    else:
        body = _config_body(config, port, replay_port)
    return orjson.dumps({"0": body})


def _config_body(config: KvEventsConfig, port: int, replay_port: int | None) -> dict[str, object]:
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": None if replay_port is None else f"tcp://*:{replay_port}",
        "buffer_steps": config.buffer_steps,
        "hwm": config.hwm,
        "max_queue_size": 100_000,
        "topic": config.topic,
    }


def _bind(socket: zmq.Socket[bytes] | zmq.asyncio.Socket, host: str, port: int) -> int:
    socket.bind(f"tcp://{host}:{port or '*'}")
    endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    return int(endpoint.rsplit(b":", 1)[1])
