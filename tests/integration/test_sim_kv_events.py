"""Simulated replicas publishing vLLM's KV cache events, read by a real ZMQ SUB socket and decoded
with the gateway's codec: the hashes are vLLM's recipe on the prompt's ``/tokenize`` ids, ``seq``
counts from 0, and the events applied in order are exactly the engine's cache, evictions, host tier
and resets included."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import pickle
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson
import pytest
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from kvgate.routing.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    decode_batch,
    sequence_number,
)
from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet
from kvgate.sim.kv_publisher import REPLAY_END, KvEventsConfig
from kvgate.sim.ports import free_ports
from kvgate.sim.replica import SimReplica

BLOCK = 16
SYSTEM = "You are a careful assistant who answers in full sentences. " * 12


def vllm_hashes(token_ids: Sequence[int], block_size: int = BLOCK) -> list[int]:
    """vLLM 0.32's published block hashes, computed here from its recipe alone (seeded, as vLLM and
    the simulator are, by ``PYTHONHASHSEED`` when it is set)."""
    seed = os.environ.get("PYTHONHASHSEED", "vllm-none-hash")
    parent = hashlib.sha256(pickle.dumps(seed, protocol=5)).digest()
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = tuple(token_ids[start : start + block_size])
        parent = hashlib.sha256(pickle.dumps((parent, block, None), protocol=5)).digest()
        out.append(int.from_bytes(parent[-8:], "big"))
    return out


class Subscriber:
    """A consumer of one replica's events: a SUB socket, and the replay socket for what it missed
    while connecting (a PUB drops what it sends before the subscription arrives)."""

    def __init__(
        self, endpoint: str, replay_endpoint: str | None = None, topic: bytes = b"kv-events"
    ) -> None:
        context = zmq.asyncio.Context.instance()
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.batches: dict[int, tuple[KvEvent, ...]] = {}
        self.live: set[int] = set()
        """Batches the SUB socket received (the others came by replay)."""

    async def until(self, last_seq: int, live: bool = False) -> list[KvEvent]:
        """Every event up to batch ``last_seq``, in order: what the SUB socket has received, the rest
        replayed (or, ``live``, waited for on the SUB socket)."""
        while await self.sub.poll(0) or (live and last_seq not in self.live):
            topic, seq, payload = await asyncio.wait_for(self.sub.recv_multipart(), 30)
            assert topic == b"kv-events"
            self.live.add(sequence_number(seq))
            self.batches[sequence_number(seq)] = decode_batch(payload).events
        missing = [seq for seq in range(last_seq + 1) if seq not in self.batches]
        if missing:
            await self._replay(missing[0])
        assert sorted(self.batches) == list(range(len(self.batches)))
        return [event for seq in range(last_seq + 1) for event in self.batches[seq]]

    async def _replay(self, first: int) -> None:
        assert self.replay_endpoint is not None, f"batches from {first} were lost and there is no replay"
        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart([b"", first.to_bytes(8, "big")])
            while True:
                empty, topic, seq, payload = await asyncio.wait_for(dealer.recv_multipart(), 30)
                assert empty == b""
                if seq == REPLAY_END:
                    assert (topic, payload) == (b"", b"")
                    return
                self.batches.setdefault(sequence_number(seq), decode_batch(payload).events)
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.close(linger=0)


def applied(events: Sequence[KvEvent], medium: str = "GPU") -> Counter[int]:
    """What a consumer holds after ``events``: each cached hash with its number of copies."""
    held: Counter[int] = Counter()
    for event in events:
        if isinstance(event, AllBlocksCleared):
            held.clear()
        elif isinstance(event, BlockStored) and event.medium == medium:
            held.update(event.block_hashes)
        elif isinstance(event, BlockRemoved) and event.medium == medium:
            held.subtract(event.block_hashes)
            assert min(held.values(), default=0) >= 0, "a block removed that was never stored"
    return +held


def gpu_cache(replica: SimReplica) -> Counter[int]:
    log = replica.engine.events
    assert log is not None
    return Counter(log.published_of(block) for block in replica.engine.pool.cached_blocks())


async def tokenize(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[int]:
    async with http.post(url + "/tokenize", json={"model": DEFAULT_MODEL, **body}) as response:
        tokens: list[int] = (await response.json())["tokens"]
    return tokens


async def complete(http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int = 3) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_kvgate_sim_publishes_each_replicas_events_on_its_own_port(http: aiohttp.ClientSession) -> None:
    port, control = free_ports(6), free_ports()
    events_port, replay_port = port + 2, port + 4
    args = ("--replicas", "2", "--port", str(port), "--control-port", str(control))
    args += ("--cold-start-s", "0", "--time-scale", "0", "--kv-capacity-tokens", "16000")
    args += ("--kv-events-port", str(events_port), "--kv-events-replay-port", str(replay_port))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate", "sim", *args, stdout=asyncio.subprocess.PIPE
    )
    subscribers: list[Subscriber] = []
    try:
        assert process.stdout is not None
        lines = [await asyncio.wait_for(process.stdout.readline(), 30) for _ in range(6)]
        assert f"replica 1 KV events tcp://127.0.0.1:{events_port + 1}".encode() in b"".join(lines)
        for i in range(2):
            url = f"http://127.0.0.1:{port + i}"
            for _ in range(300):
                try:
                    async with http.get(url + "/kv_event_sources") as response:
                        sources = orjson.loads(await response.read())
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            config = sources["0"]
            assert (config["endpoint"], config["replay_endpoint"]) == (
                f"tcp://*:{events_port + i}",
                f"tcp://*:{replay_port + i}",
            )
            assert (config["enable_kv_cache_events"], config["topic"]) == (True, "kv-events")
            subscribers.append(
                Subscriber(
                    config["endpoint"].replace("*", "127.0.0.1"),
                    config["replay_endpoint"].replace("*", "127.0.0.1"),
                )
            )
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello!"}]
        for i, subscriber in enumerate(subscribers):
            url = f"http://127.0.0.1:{port + i}"
            ids = await tokenize(http, url, {"messages": messages})
            body = {"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 2}
            async with http.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
            (stored,) = await subscriber.until(0)
            assert isinstance(stored, BlockStored)
            assert list(stored.block_hashes) == vllm_hashes(ids)
            assert stored.token_ids == tuple(ids[: len(stored.block_hashes) * BLOCK])
            assert (stored.parent_block_hash, stored.block_size, stored.medium) == (None, BLOCK, "GPU")
    finally:
        for subscriber in subscribers:
            subscriber.close()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_the_events_track_the_cache_exactly_through_evictions_and_a_reset(
    http: aiohttp.ClientSession,
) -> None:
    overrides = {"kv_capacity_tokens": 1200, "max_num_seqs": 4, "warmup_s": 0}
    config = KvEventsConfig(replay_port=0)
    async with SimFleet(replicas=1, time_scale=0.0, overrides=overrides, kv_events=config) as fleet:
        replica = fleet.replicas[0]
        publisher = replica.publisher
        assert publisher is not None and replica.kv_events_endpoint is not None
        subscriber = Subscriber(replica.kv_events_endpoint, f"tcp://127.0.0.1:{publisher.replay_port}")
        try:
            prompts = [
                f"{SYSTEM[: 200 + 90 * (i % 3)]} Question {i}: " + f"fact {i} " * 40 for i in range(12)
            ]
            stored_ever: set[int] = set()
            for i, prompt in enumerate(prompts):
                await asyncio.gather(
                    complete(http, replica.url, prompt, 4 + i), complete(http, replica.url, prompt)
                )
                events = await subscriber.until(publisher.num_batches - 1)
                assert applied(events) == gpu_cache(replica)
                stored_ever |= {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
                ids = await tokenize(http, replica.url, {"prompt": prompt})
                assert set(vllm_hashes(ids)) <= stored_ever
            assert any(isinstance(e, BlockRemoved) for e in events), "the traffic evicted nothing"
            assert len(stored_ever) > replica.engine.pool.num_blocks
            assert sorted(subscriber.batches) == list(range(publisher.num_batches))

            async with http.post(replica.url + "/reset_prefix_cache") as response:
                assert await response.json() == {"success": True}
            assert gpu_cache(replica) == Counter()
            await complete(http, replica.url, prompts[0])
            events = await subscriber.until(publisher.num_batches - 1, live=True)
            last = subscriber.batches[publisher.num_batches - 1]
            assert isinstance(last[0], AllBlocksCleared)
            assert applied(events) == gpu_cache(replica) != Counter()
        finally:
            subscriber.close()


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise KeyError(name)


async def test_the_host_tier_announces_its_blocks_and_serves_a_hit_between_gpu_and_recompute(
    http: aiohttp.ClientSession,
) -> None:
    overrides = {"kv_capacity_tokens": 3200, "cpu_offload_tokens": 8000, "warmup_s": 0}
    async with SimFleet(
        replicas=1, time_scale=0.0, overrides=overrides, kv_events=KvEventsConfig(replay_port=0)
    ) as fleet:
        replica = fleet.replicas[0]
        publisher, host = replica.publisher, replica.engine.host
        assert publisher is not None and host is not None and replica.kv_events_endpoint is not None
        subscriber = Subscriber(replica.kv_events_endpoint, f"tcp://127.0.0.1:{publisher.replay_port}")
        document = "The quarterly report covers revenue, costs and the outlook for every region. " * 40

        async def ttft_s(prompt: str) -> float:
            async with http.get(replica.url + "/metrics") as response:
                before = metric(await response.text(), "vllm:time_to_first_token_seconds_sum")
            await complete(http, replica.url, prompt, max_tokens=1)
            async with http.get(replica.url + "/metrics") as response:
                return metric(await response.text(), "vllm:time_to_first_token_seconds_sum") - before

        stories = iter(range(100))

        async def unrelated(count: int) -> None:
            """Stories of 125 blocks each: the GPU holds 200 blocks, the host 500."""
            for story in itertools.islice(stories, count):
                await complete(http, replica.url, f"Story {story}: it rained all day. " * 200, max_tokens=1)

        try:
            await unrelated(6)
            cold_s = await ttft_s(document + " Summarise it.")
            gpu_hit_s = await ttft_s(document + " List the regions.")
            await unrelated(3)
            host_hit_s = await ttft_s(document + " Name the costs.")
            assert gpu_hit_s < host_hit_s < cold_s

            events = await subscriber.until(publisher.num_batches - 1)
            assert applied(events) == gpu_cache(replica)
            assert applied(events, "CPU") == Counter(host.published_hashes())
            cpu_stores = [e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"]
            assert cpu_stores and all(e.token_ids == () and e.parent_block_hash is None for e in cpu_stores)
            assert any(isinstance(e, BlockRemoved) and e.medium == "CPU" for e in events)

            async with http.get(replica.url + "/metrics") as response:
                text = await response.text()
            hit = metric(text, "vllm:prompt_tokens_cached_by_source_total", source="host")
            assert hit == metric(text, "vllm:external_prefix_cache_hits_total") > 0
            assert metric(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == hit
            (info,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info"]
            labels = info.samples[0].labels
            offloading = (
                labels["kv_offloading_backend"],
                labels["kv_offloading_size"],
                labels["num_cpu_blocks"],
            )
            assert offloading == ("native", str(8000 * 131_072 / 2**30), "500")
        finally:
            subscriber.close()


async def test_the_control_api_adds_a_publishing_replica_and_resets_a_cache(
    http: aiohttp.ClientSession,
) -> None:
    async with SimFleet(replicas=1, time_scale=0.0, overrides={"warmup_s": 0}, control_port=0) as fleet:
        control = f"{fleet.control_url}/replicas"
        async with http.post(control, json={"kv_events": True}) as response:
            added = await response.json()
        assert response.status == 201 and added["kv_events_endpoint"] == fleet.replicas[1].kv_events_endpoint
        async with http.get(control) as response:
            endpoints = [r["kv_events_endpoint"] for r in (await response.json())["replicas"]]
        assert endpoints[0] is None and endpoints[1].startswith("tcp://127.0.0.1:")
        async with http.get(fleet.urls[0] + "/kv_event_sources") as response:
            sources = await response.json()
        assert sources["0"]["enable_kv_cache_events"] is False and sources["0"]["publisher"] == "null"
        async with http.post(control, json={"kv_events": "yes"}) as response:
            assert response.status == 400

        await complete(http, fleet.urls[1], SYSTEM)
        assert fleet.replicas[1].engine.pool.cached_blocks()
        async with http.post(f"{control}/1/reset_prefix_cache") as response:
            assert await response.json() == {"success": True}
        assert fleet.replicas[1].engine.pool.cached_blocks() == []
