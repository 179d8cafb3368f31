"""Credentials and headers between clients, the gateway and replicas.

The client's ``Authorization`` and ``Cookie`` stay at the gateway unless
``auth.forward_client_credentials`` says otherwise; a pool's own ``api_key`` goes to every call to
its replicas (completions, ``/tokenize``, health probes, ``/metrics`` scrapes); a replica's
``Set-Cookie`` and hop-by-hop headers never reach the client by default; an error the client sees
names the replica, never its URL. The replica here is a stand-in that records every request's
headers (the simulator does not keep them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config

CLIENT_KEY = "sk-client-key"
POOL_KEY = "pool-secret-key"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
REPLICA_EXTRA_HEADERS = (
    b"set-cookie: replica-session=abc; Path=/\r\n"
    b"keep-alive: timeout=5\r\n"
    b"proxy-authenticate: Basic\r\n"
    b"x-hop: private\r\n"
    b"connection: keep-alive, x-hop\r\n"
    b"x-replica-note: kept\r\n"
)


class RecordingReplica:
    """A stand-in vLLM replica on loopback that records ``(path, headers)`` of every request.

    ``mode`` is ``ok`` (a chat completion), ``error`` (500 on completions) or ``hang_up`` (closes
    the connection instead of answering a completion)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def seen(self, path: str) -> list[dict[str, str]]:
        return [headers for p, headers in self.requests if p == path]

    async def __aenter__(self) -> RecordingReplica:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                path = head[0].split(" ")[1]
                headers = {}
                for line in head[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((path, headers))
                answer = self._answer(path, body)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def _answer(self, path: str, body: bytes) -> bytes | None:
        status, extra, payload = 200, b"", b""
        if path == "/tokenize":
            payload = b'{"tokens": [1, 2, 3], "count": 3}'
        elif path == "/v1/chat/completions":
            if self.mode == "hang_up":
                return None
            if self.mode == "error":
                status, payload = 500, b'{"error": {"message": "engine failed"}}'
            else:
                extra = REPLICA_EXTRA_HEADERS
                payload = orjson.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "model": orjson.loads(body)["model"],
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                    }
                )
        head = b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
            status,
            len(payload),
        )
        return head + extra + b"\r\n" + payload


def config_for(replica: RecordingReplica, **sections: Any) -> Any:
    pool = {"name": "default", "replicas": [replica.url], "kv_capacity_tokens": 450000}
    pool.update(sections.pop("pool", {}))
    model = {"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}
    model.update(sections.pop("model", {}))
    return gateway_config([replica.url], pools=[pool], models=[model], **sections)


@asynccontextmanager
async def gateway_before(
    replica: RecordingReplica, **sections: Any
) -> AsyncIterator[tuple[RunningGateway, httpx.AsyncClient]]:
    async with (
        running_gateway(config_for(replica, **sections)) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
    ):
        yield gw, http


CLIENT_HEADERS = {
    "authorization": f"Bearer {CLIENT_KEY}",
    "cookie": "client-session=xyz",
    "proxy-authorization": "Basic cHJveHk6cHc=",
}


async def test_by_default_client_credentials_stay_and_replica_cookies_and_hop_headers_do_not_come_back() -> (
    None
):
    async with RecordingReplica() as replica, gateway_before(replica) as (gw, http):
        response = await http.post("/v1/chat/completions", json=CHAT, headers=CLIENT_HEADERS)
        assert response.status_code == 200, response.text
        [sent] = replica.seen("/v1/chat/completions")
        assert "authorization" not in sent and "cookie" not in sent and "proxy-authorization" not in sent
        assert CLIENT_KEY not in str(replica.requests)
        for name in ("set-cookie", "keep-alive", "proxy-authenticate", "x-hop"):
            assert name not in response.headers, name
        assert response.headers["x-replica-note"] == "kept"
        await assert_idle(gw)


async def test_headers_the_clients_connection_header_names_are_not_forwarded() -> None:
    async with RecordingReplica() as replica, gateway_before(replica) as (gw, http):
        headers = {"connection": "keep-alive, X-Client-Hop", "x-client-hop": "1", "x-end-to-end": "2"}
        response = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert response.status_code == 200, response.text
        [sent] = replica.seen("/v1/chat/completions")
        assert "x-client-hop" not in sent, "named in Connection: hop-by-hop (RFC 9110 7.6.1)"
        assert sent["x-end-to-end"] == "2"
        await assert_idle(gw)


async def test_client_credentials_and_replica_cookies_pass_when_configured() -> None:
    auth = {"forward_client_credentials": True}
    async with RecordingReplica() as replica, gateway_before(replica, auth=auth) as (gw, http):
        response = await http.post("/v1/chat/completions", json=CHAT, headers=CLIENT_HEADERS)
        assert response.status_code == 200, response.text
        [sent] = replica.seen("/v1/chat/completions")
        assert sent["authorization"] == f"Bearer {CLIENT_KEY}"
        assert sent["cookie"] == "client-session=xyz"
        assert "proxy-authorization" not in sent
        assert response.headers["set-cookie"] == "replica-session=abc; Path=/"
        assert "keep-alive" not in response.headers and "x-hop" not in response.headers
        await assert_idle(gw)


async def test_a_pools_api_key_goes_to_every_call_to_its_replicas_in_place_of_the_clients() -> None:
    auth = {
        "enabled": True,
        "tenants": [{"name": "team", "api_keys": [CLIENT_KEY]}],
        "forward_client_credentials": True,
    }
    sections: dict[str, Any] = {
        "pool": {"api_key": POOL_KEY},
        "model": {"tokenizer": {"kind": "replica"}},
        "auth": auth,
    }
    async with RecordingReplica() as replica, gateway_before(replica, **sections) as (gw, http):
        response = await http.post("/v1/chat/completions", json=CHAT, headers=CLIENT_HEADERS)
        assert response.status_code == 200, response.text
        for path in ("/v1/chat/completions", "/tokenize", "/health", "/metrics"):
            seen = replica.seen(path)
            assert seen, path
            assert all(h.get("authorization") == f"Bearer {POOL_KEY}" for h in seen), (path, seen)
        assert CLIENT_KEY not in str(replica.requests)
        assert POOL_KEY not in repr(gw.state.replicas) + repr(gw.gateway.config)
        await assert_idle(gw)


def assert_names_the_replica_not_its_url(gw: RunningGateway, response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    [replica] = gw.state.replicas.values()
    message = response.json()["error"]["message"]
    assert replica.name in message
    port = replica.url.rsplit(":", 1)[1]
    assert "127.0.0.1" not in response.text and port not in response.text and "http" not in message


async def test_replica_failures_name_the_replica_never_its_url() -> None:
    for mode in ("error", "hang_up"):
        async with RecordingReplica(mode) as replica, gateway_before(replica) as (gw, http):
            response = await http.post("/v1/chat/completions", json=CHAT)
            assert_names_the_replica_not_its_url(gw, response, 502)
            await assert_idle(gw)


async def test_an_api_key_without_bearer_is_refused_as_openai_does(fleet: SimFleet) -> None:
    auth = {"enabled": True, "tenants": [{"name": "team", "api_keys": [CLIENT_KEY]}]}
    config = gateway_config(fleet.urls, auth=auth)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        bare = await http.post("/v1/completions", json=body, headers={"authorization": CLIENT_KEY})
        assert bare.status_code == 401 and bare.json()["error"]["type"] == "AuthenticationError"
        for scheme in ("Bearer", "bearer"):
            good = await http.post(
                "/v1/completions", json=body, headers={"authorization": f"{scheme} {CLIENT_KEY}"}
            )
            assert good.status_code == 200, good.text
        await assert_idle(gw)
