"""Redis coordination when Redis fails: the gateway starts whatever Redis does, says what it sees
(``kvgate_coordination_up``, errors by kind, a log line), and either keeps admitting on local state
(``fail_mode: open``) or refuses new requests with a 503 until it sees the other gateways again
(``fail_mode: closed``). Garbage under the namespace is skipped entry by entry and counted.

Stopping, pausing (SIGSTOP: connections accepted, nothing answered), restarting and
password-protecting Redis use a private ``redis-server`` per test; the shared one is never touched.
Without a ``redis-server`` binary these tests skip, or fail under ``KVGATE_REQUIRE_REDIS=1``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from kvgate.admission.claims import Share
from kvgate.gateway.coordination.claim_script import claims_key
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.gateway.state import GatewayState
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from kvgate.vocabulary.replica import ReplicaLoad
from tests.conftest import redis_server_binary
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

FAST_SYNC = {"interval_s": 0.05, "lease_s": 1.0}
REQUEST = {"model": MODEL, "prompt": "x", "max_tokens": 2}


class PrivateRedis:
    """A ``redis-server`` of this test's own on a fixed free port, which it can stop and restart."""

    def __init__(self, workdir: str, password: str | None = None) -> None:
        self.binary = redis_server_binary("this test stops its own Redis")
        self.workdir = workdir
        self.password = password
        self.port = free_ports()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, password: str | None = None) -> str:
        auth = f":{password}@" if password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            args, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(500):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                await writer.wait_closed()
                return
            assert self.proc.poll() is None, "redis-server exited"
            await asyncio.sleep(0.02)
        pytest.fail(f"redis-server did not start on port {self.port}")

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections, nothing answers (a hung Redis)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server would hold SIGTERM pending
            self.proc.terminate()
            await asyncio.to_thread(self.proc.wait, 10)
        self.proc = None


@contextlib.asynccontextmanager
async def private_redis(password: str | None = None) -> AsyncIterator[PrivateRedis]:
    with tempfile.TemporaryDirectory() as workdir:
        server = PrivateRedis(workdir, password)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


def config_for(
    fleet: SimFleet, redis_url: str, namespace: str, fail_mode: str, lease_s: float = FAST_SYNC["lease_s"]
) -> Any:
    coordination = {
        "redis_url": redis_url,
        "namespace": namespace,
        "fail_mode": fail_mode,
        **FAST_SYNC,
        "lease_s": lease_s,
    }
    return gateway_config(fleet.urls, routing={"warmup_s": 0}, coordination=coordination)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the Prometheus exposition ``text``, or None when absent."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


async def scrape(http: httpx.AsyncClient, gw: RunningGateway) -> str:
    return (await http.get(gw.url + "/metrics")).text


def coordination_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "kvgate.coordination" and r.levelno >= logging.WARNING
    ]


def assert_refused_for_coordination(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
    assert error["reason"] == "coordination_unavailable"


async def test_garbage_under_the_namespace_is_skipped_counted_and_the_rest_still_counts(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(redis_url)
    far = 1 << 50
    async with SimFleet(replicas=2, time_scale=0.0, seed=0) as fleet:
        config = config_for(fleet, redis_url, namespace, "closed")
        replicas = sorted(parse_config_ids(config))
        garbage, wrong_type = claims_key(namespace, replicas[0]), claims_key(namespace, replicas[1])
        broken = {
            b"not-numbers": b"not a claim",
            b"too-few": b"1 2 3",
            b"negative": f"-1 0 0 0 0 0 450000 128 {far}".encode(),
            b"huge": f"{1 << 41} 0 0 0 0 0 450000 128 {far}".encode(),
            b"fraction": f"1.5 0 0 0 0 0 450000 128 {far}".encode(),
            b"\xff\xfe-not-utf8": b"",
        }
        good = {b"good": f"300 2 300 2 0 0 450000 128 {far}".encode()}
        await client.hset(garbage, mapping={**broken, **good})  # type: ignore[arg-type]
        await client.set(wrong_type, b"garbage")
        try:
            async with (
                running_gateway(config) as gw,
                httpx.AsyncClient(timeout=30) as http,
            ):
                coordinator = gw.gateway.coordinator
                assert coordinator is not None and coordinator.connected
                assert coordinator.book.claimed() == {replicas[0]: Share(450000 - 300, 128 - 2)}
                assert set(await client.hkeys(garbage)) == {b"good", coordinator.gateway_id.encode()}
                text = await scrape(http, gw)
                assert metric(text, "kvgate_coordination_up") == 1.0
                bad = metric(text, "kvgate_coordination_errors_total", kind="bad_value")
                assert bad is not None and bad >= len(broken) + 1, text
                assert any("bad value" in line for line in coordination_logs(caplog))
                for _ in range(4):
                    answer = await http.post(gw.url + "/v1/completions", json=REQUEST)
                    assert answer.status_code == 200, answer.text
                assert (await http.get(gw.url + "/readyz")).status_code == 200
                await assert_idle(gw)
                served = sorted(sum(r.engine.stats.request_success.values()) for r in fleet.replicas)
                assert served == [0, 4], "the replica with no claim takes nothing"
        finally:
            await client.delete(garbage, wrong_type)
            await client.aclose()


def parse_config_ids(config: Any) -> list[str]:
    """The replica ids a gateway on ``config`` gives its replicas."""
    return list(GatewayState.from_config(config).replicas)


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_a_wrong_password_starts_the_gateway_and_says_so(
    fail_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        private_redis(password="right") as server,
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
    ):
        config = config_for(fleet, server.url(password="wrong"), "kvgate", fail_mode)
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            text = await scrape(http, gw)
            assert metric(text, "kvgate_coordination_up") == 0.0
            errors = metric(text, "kvgate_coordination_errors_total", kind="authentication")
            assert errors is not None and errors >= 1, text
            assert any("authentication" in line for line in coordination_logs(caplog))
            ready = await http.get(gw.url + "/readyz")
            answer = await http.post(gw.url + "/v1/completions", json=REQUEST)
            if fail_mode == "closed":
                assert ready.status_code == 503
                assert ready.json()["reason"] == "coordination_unavailable"
                assert_refused_for_coordination(answer)
                text = await scrape(http, gw)
                refused = metric(
                    text,
                    "kvgate_admission_decisions_total",
                    decision="reject",
                    reason="coordination_unavailable",
                )
                assert refused == 1.0, text
            else:
                assert ready.status_code == 200
                assert answer.status_code == 200, answer.text
            await assert_idle(gw)


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_redis_stopped_under_two_gateways_then_restarted(
    fail_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.coordination")
    async with private_redis() as server, SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet:
        replica = fleet.urls[0]
        # A lease of 3 s: what this test reads (up, refused, back) follows Redis's state, and a
        # loaded machine can stall a 50 ms sync loop past a 1 s lease without Redis doing anything.
        config = config_for(fleet, server.url(), "kvgate", fail_mode, lease_s=3.0)
        async with (
            running_gateway(config) as gw_a,
            running_gateway(config) as gw_b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            a, b = gw_a.gateway.coordinator, gw_b.gateway.coordinator
            assert a is not None and b is not None
            assert await eventually(lambda: replica in a.book.held and replica in b.book.held)
            assert metric(await scrape(http, gw_b), "kvgate_coordination_up") == 1.0

            await server.stop()
            assert await eventually(lambda: not b.connected)
            text = await scrape(http, gw_b)
            assert metric(text, "kvgate_coordination_up") == 0.0
            errors = metric(text, "kvgate_coordination_errors_total", kind="connection")
            assert errors is not None and errors >= 1, text
            age = metric(text, "kvgate_coordination_last_sync_age_seconds")
            assert age is not None and age > 0, text
            assert any("down" in line for line in coordination_logs(caplog))
            answer = await http.post(gw_b.url + "/v1/completions", json=REQUEST)
            ready = await http.get(gw_b.url + "/readyz")
            if fail_mode == "closed":
                assert_refused_for_coordination(answer)
                assert ready.status_code == 503 and ready.json()["reason"] == "coordination_unavailable"
            else:
                assert answer.status_code == 200, answer.text
                assert ready.status_code == 200
            await assert_idle(gw_b)

            await server.start()
            assert await eventually(lambda: a.connected and b.connected)
            assert await eventually(lambda: replica in a.book.held and replica in b.book.held)
            assert metric(await scrape(http, gw_b), "kvgate_coordination_up") == 1.0
            recovered = [r.getMessage() for r in caplog.records if r.name == "kvgate.coordination"]
            assert any(line.startswith("coordination up") for line in recovered), recovered
            answer = await http.post(gw_b.url + "/v1/completions", json=REQUEST)
            assert answer.status_code == 200, answer.text
            assert (await http.get(gw_b.url + "/readyz")).status_code == 200
            await assert_idle(gw_a)
            await assert_idle(gw_b)


async def test_fail_closed_holds_the_queue_while_blind_and_dispatches_when_redis_is_back() -> None:
    async with private_redis() as server, SimFleet(replicas=1, time_scale=0.1, seed=0) as fleet:
        replica = fleet.urls[0]
        config = gateway_config(
            fleet.urls,
            pools=[{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": 20000}],
            routing={"warmup_s": 0},
            admission={"max_queue_wait_s": 3600},
            coordination={"redis_url": server.url(), "fail_mode": "closed", **FAST_SYNC},
        )
        hold = {"model": MODEL, "prompt": "x", "max_tokens": 19000, "ignore_eos": True}
        late = {"model": MODEL, "prompt": "x", "max_tokens": 1000, "ignore_eos": True}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=60) as http:
            coordinator = gw.gateway.coordinator
            assert coordinator is not None and coordinator.connected
            holder = asyncio.create_task(http.post(gw.url + "/v1/completions", json=hold))
            assert await eventually(lambda: gw.state.ledger.load(replica).resident_sequences == 1)
            waiter = asyncio.create_task(http.post(gw.url + "/v1/completions", json=late))
            assert await eventually(lambda: gw.state.queued == 1)

            await server.stop()
            assert await eventually(lambda: not coordinator.connected)
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            assert await eventually(lambda: gw.state.ledger.load(replica) == ReplicaLoad())
            await asyncio.sleep(0.3)
            assert gw.state.queued == 1 and not waiter.done()
            assert gw.state.ledger.load(replica) == ReplicaLoad()

            await server.start()
            answer = await waiter
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 1000
            await assert_idle(gw)


@pytest.mark.parametrize(("required", "outcome"), [("1", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_private_redis_without_its_binary_fails_where_redis_is_required(
    required: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("KVGATE_REQUIRE_REDIS", required)
    with pytest.raises(outcome, match="no redis-server"):
        PrivateRedis(str(tmp_path))


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_a_hung_redis_is_seen_as_down_then_up_again(
    fail_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A paused Redis accepts connections and answers nothing: the sync's socket timeout is what
    notices, requests never wait on it, and fail_mode decides what they get meanwhile."""
    caplog.set_level(logging.INFO, logger="kvgate.coordination")
    async with private_redis() as server, SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet:
        config = config_for(fleet, server.url(), "kvgate", fail_mode, lease_s=3.0)
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            coordinator = gw.gateway.coordinator
            assert coordinator is not None
            assert await eventually(lambda: coordinator.connected and fleet.urls[0] in coordinator.book.held)
            assert (await http.post(gw.url + "/v1/completions", json=REQUEST)).status_code == 200

            server.pause()
            try:
                assert await eventually(lambda: not coordinator.connected)
                text = await scrape(http, gw)
                assert metric(text, "kvgate_coordination_up") == 0.0
                timeouts = metric(text, "kvgate_coordination_errors_total", kind="timeout")
                assert timeouts is not None and timeouts >= 1, text
                assert any("down (timeout" in line for line in coordination_logs(caplog))
                answer = await http.post(gw.url + "/v1/completions", json=REQUEST)
                ready = await http.get(gw.url + "/readyz")
                if fail_mode == "closed":
                    assert_refused_for_coordination(answer)
                    assert ready.status_code == 503 and ready.json()["reason"] == "coordination_unavailable"
                else:
                    assert answer.status_code == 200, answer.text
                    assert ready.status_code == 200
                assert server.proc is not None and server.proc.poll() is None, (
                    "answered with Redis still paused"
                )
                await assert_idle(gw)
            finally:
                server.resume()

            assert await eventually(lambda: coordinator.connected)
            assert metric(await scrape(http, gw), "kvgate_coordination_up") == 1.0
            said = [r.getMessage() for r in caplog.records if r.name == "kvgate.coordination"]
            down = next(i for i, line in enumerate(said) if line.startswith("coordination down"))
            assert any(line.startswith("coordination up") for line in said[down:]), said
            answer = await http.post(gw.url + "/v1/completions", json=REQUEST)
            assert answer.status_code == 200, answer.text
            assert (await http.get(gw.url + "/readyz")).status_code == 200
            await assert_idle(gw)
