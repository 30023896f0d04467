"""``DELETE /v1/sessions/{id}`` ends a session without a socket, and the Python SDK's
``close()`` uses it when no socket is attached: it returns within 1 s whatever the network
does, and the session is gone at once when the request gets through."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from client_sdk import connect, connect_raw
from client_sdk.resume import END_TIMEOUT, session_url
from gateway.errors import CloseCode
from gateway.wire.v1 import SessionCreated, SessionResume, SessionStart
from tests.proxy import Proxy, Upgrade, proxy_to
from tests.redis_server import RedisServer
from tests.support import Gateway, serving

KEY = "backend-key-0123456789abcdef"
OTHER_KEY = "other-key-0123456789abcdef"
AUTH: dict[str, Any] = {
    "no_auth": False,
    "api_keys": f"backend:{KEY},other:{OTHER_KEY}",
    "token_secret": "s" * 40,
}
TTL = 60.0
"""Long: a session these tests see end was ended, not expired."""


def http_base(gw: Gateway) -> str:
    return gw.url.replace("ws://", "http://").removesuffix("/v1/realtime")


async def delete(gw: Gateway, session_id: str, credential: str | None) -> httpx.Response:
    headers = {} if credential is None else {"authorization": f"Bearer {credential}"}
    async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client:
        return await client.delete(f"/v1/sessions/{session_id}", headers=headers)


async def counted(gw: Gateway) -> int:
    """The sessions ``/healthz`` counts."""
    async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client:
        sessions: int = (await client.get("/healthz")).json()["sessions"]
    return sessions


@asynccontextmanager
async def live_session(
    gw: Gateway, **credentials: Any
) -> AsyncIterator[tuple[websockets.ClientConnection, SessionCreated]]:
    """A session with its socket attached (``token=``/``api_key=`` as ``connect_raw``)."""
    async with connect_raw(gw.url, **credentials) as conn:
        await conn.send(SessionStart())
        created = await conn.recv()
        assert isinstance(created, SessionCreated), created
        yield conn.websocket, created


async def close_code(websocket: websockets.ClientConnection) -> tuple[int, str]:
    """The close the gateway sent on ``websocket``."""
    await asyncio.wait_for(websocket.wait_closed(), 5)
    rcvd = websocket.protocol.close_rcvd
    assert rcvd is not None
    return rcvd.code, rcvd.reason


async def test_the_resume_token_ends_a_live_session_at_once():
    async with serving(session_ttl=TTL) as gw, live_session(gw) as (websocket, created):
        assert await counted(gw) == 1
        response = await delete(gw, created.session_id, created.resume_token)
        assert response.status_code == 204
        # Answered once the session ended: /healthz no longer counts it, its socket is closed
        # as when the agent ends a session, its store entry is gone.
        assert await counted(gw) == 0
        assert await close_code(websocket) == (CloseCode.NORMAL, "session ended")
        assert await gw.runtime.store.get_session(created.session_id) is None
        assert await gw.runtime.store.ended(created.session_id)


async def test_a_repeat_is_204_and_ends_nothing_else():
    async with serving(session_ttl=TTL) as gw, live_session(gw) as (_, created):
        first = await delete(gw, created.session_id, created.resume_token)
        again = await delete(gw, created.session_id, created.resume_token)
        assert (first.status_code, again.status_code) == (204, 204)


async def test_a_wrong_token_and_an_unknown_id_are_the_same_404():
    async with serving(session_ttl=TTL) as gw, live_session(gw) as (websocket, created):
        wrong = await delete(gw, created.session_id, created.resume_token[:-2] + "xx")
        unknown = await delete(gw, "sess_nope", created.resume_token)
        assert (wrong.status_code, unknown.status_code) == (404, 404)
        assert wrong.json() == unknown.json()
        none = await delete(gw, created.session_id, None)  # the id alone never suffices
        assert none.status_code == 401
        assert await counted(gw) == 1
        assert websocket.state is websockets.State.OPEN


async def test_a_detached_session_ends_at_once():
    async with serving(session_ttl=TTL) as gw:
        async with live_session(gw) as (websocket, created):
            websocket.transport.abort()  # no close frame: the session waits for a resume
        driver = gw.runtime.drivers[created.session_id]
        await asyncio.wait_for(driver.detached.wait(), 5)
        assert (await delete(gw, created.session_id, created.resume_token)).status_code == 204
        assert await counted(gw) == 0


async def mint(gw: Gateway, key: str, user: str) -> str:
    async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client:
        response = await client.post(
            "/v1/sessions", json={"user": {"id": user}}, headers={"authorization": f"Bearer {key}"}
        )
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


async def test_with_auth_on_the_owners_key_ends_a_session_another_key_does_not():
    async with serving(session_ttl=TTL, **AUTH) as gw:
        token = await mint(gw, KEY, "42")  # the session is key:backend/user:42's
        async with live_session(gw, token=token) as (websocket, created):
            assert (await delete(gw, created.session_id, OTHER_KEY)).status_code == 404
            assert (await delete(gw, created.session_id, token)).status_code == 404  # no key
            assert await counted(gw) == 1
            assert (await delete(gw, created.session_id, KEY)).status_code == 204
            assert await counted(gw) == 0
            assert await close_code(websocket) == (CloseCode.NORMAL, "session ended")
        async with live_session(gw, api_key=KEY) as (_, created):  # key:backend's own
            assert (await delete(gw, created.session_id, created.resume_token)).status_code == 204


async def test_under_no_auth_the_anonymous_needs_the_token():
    async with serving(session_ttl=TTL, api_keys=f"backend:{KEY}") as gw:
        async with live_session(gw) as (_, created):  # anonymous
            assert (await delete(gw, created.session_id, KEY)).status_code == 404
            assert (await delete(gw, created.session_id, "anything")).status_code == 404
            assert (await delete(gw, created.session_id, created.resume_token)).status_code == 204


def test_the_sessions_url_follows_the_sockets():
    assert (
        session_url("wss://example.com/gw/v1/realtime?token=t&x=1", "sess_a/b")
        == "https://example.com/gw/v1/sessions/sess_a%2Fb"
    )
    assert session_url("ws://127.0.0.1:8/v1/realtime", "s") == "http://127.0.0.1:8/v1/sessions/s"


# ----------------------------------------------------------------- the SDK's close()


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with serving(session_ttl=TTL) as running:
        yield running


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[Proxy]:
    async with proxy_to(gateway.port) as running:
        yield running


async def test_close_during_a_resume_held_by_the_network_ends_the_session_within_1_s(
    gateway: Gateway, proxy: Proxy
) -> None:
    async with connect(proxy.url(), max_reconnect_delay=0.1) as conv:
        await conv.start()
        proxy.upgrades = ["hold"]  # the resume's upgrade: sent, never answered
        proxy.drop()
        await proxy.wait_until(lambda: proxy.held == 1)
        assert await counted(gateway) == 1
        began = time.monotonic()
        await conv.close()
        took = time.monotonic() - began
    assert took < 1.0, took
    async with asyncio.timeout(1.0 - took):
        await gateway.runtime.idle.wait()
    assert await counted(gateway) == 0
    print(f"close() took {took * 1000:.0f} ms; session gone {time.monotonic() - began:.3f} s after")


async def test_close_returns_within_1_s_when_the_network_holds_everything(
    gateway: Gateway, proxy: Proxy
) -> None:
    async with connect(proxy.url(), max_reconnect_delay=0.1) as conv:
        await conv.start()
        proxy.upgrades = ["hold", "hold"]  # the resume, then the DELETE: neither answered
        proxy.drop()
        await proxy.wait_until(lambda: proxy.held == 1)
        began = time.monotonic()
        await conv.close()
        took = time.monotonic() - began
    assert END_TIMEOUT <= took < 1.0, took
    assert proxy.held == 2  # the DELETE was sent, and abandoned
    assert await counted(gateway) == 1  # it ends at its TTL, as the docstring says


# ----------------------------------------------------------------- the JS SDK's close()

LIVE_CLOSE = Path(__file__).parent / "js" / "live_close.mjs"


async def js_close(proxy: Proxy, impl: str, holds: list[Upgrade]) -> dict[str, Any]:
    """Run tests/js/live_close.mjs through ``proxy``: at its ``ready``, drop its socket and
    hold what the next connections ask (``holds``), then let it close(); its result."""
    if impl == "ws":
        assert (LIVE_CLOSE.parent / "node_modules" / "ws").is_dir(), "run make test"
    flags = ["--experimental-websocket"] if impl == "builtin" else []
    node = await asyncio.create_subprocess_exec(
        *("node", "--no-warnings", *flags, str(LIVE_CLOSE), proxy.url(), impl),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert node.stdin is not None
    assert node.stdout is not None
    try:
        async with asyncio.timeout(20):
            assert (await node.stdout.readline()).decode().strip() == "ready"
            proxy.upgrades = holds
            proxy.drop()
            await proxy.wait_until(lambda: proxy.held == 1)
            node.stdin.write(b"go\n")
            await node.stdin.drain()
            line = (await node.stdout.readline()).decode()
            _, stderr = await node.communicate()
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
    assert line.startswith("result "), (line, stderr.decode())
    result: dict[str, Any] = json.loads(line.removeprefix("result "))
    return result


node_impls = pytest.mark.parametrize("impl", ["ws", "builtin"])
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")


@needs_node
@node_impls
async def test_js_close_during_a_held_resume_ends_the_session_within_1_s(
    gateway: Gateway, proxy: Proxy, impl: str
) -> None:
    result = await js_close(proxy, impl, ["hold"])
    assert result["state"] == "reconnecting"
    assert result["took"] < 1000, result
    async with asyncio.timeout(1.0 - result["took"] / 1000):
        await gateway.runtime.idle.wait()
    print(f"JS ({impl}) close() took {result['took']:.0f} ms")


@needs_node
@node_impls
async def test_js_close_returns_within_1_s_when_the_network_holds_everything(
    gateway: Gateway, proxy: Proxy, impl: str
) -> None:
    result = await js_close(proxy, impl, ["hold", "hold"])
    assert 700 <= result["took"] < 1000, result
    assert proxy.held == 2  # the DELETE was sent, and abandoned
    assert await counted(gateway) == 1


# ----------------------------------------------------------------- nodes on one Redis


@asynccontextmanager
async def two_nodes(redis: RedisServer) -> AsyncIterator[tuple[Gateway, Gateway]]:
    async with (
        serving(store=redis.url, node_id="node-a", lease_ttl=1.0, session_ttl=TTL) as a,
        serving(store=redis.url, node_id="node-b", lease_ttl=1.0, session_ttl=TTL) as b,
    ):
        yield a, b


async def resume_refused_with(gw: Gateway, created: SessionCreated) -> int:
    """The close code a ``session.resume`` of ``created`` gets on ``gw``."""
    async with connect_raw(gw.url) as conn:
        resume = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=0
        )
        await conn.send(resume)
        code, _ = await close_code(conn.websocket)
    return code


async def test_on_its_own_node_a_durable_session_ends_as_on_one(redis: RedisServer) -> None:
    async with two_nodes(redis) as (a, _), live_session(a) as (websocket, created):
        assert (await delete(a, created.session_id, created.resume_token)).status_code == 204
        assert await counted(a) == 0
        assert await close_code(websocket) == (CloseCode.NORMAL, "session ended")


async def test_a_delete_on_another_node_ends_the_session_everywhere(redis: RedisServer) -> None:
    async with two_nodes(redis) as (a, b), live_session(a) as (websocket, created):
        began = time.monotonic()
        assert (await delete(b, created.session_id, created.resume_token)).status_code == 204
        # No node resumes it from now on; node A learns at its next lease renewal (a third
        # of lease_ttl) and closes its socket with 1013, whose resume is refused.
        assert await resume_refused_with(b, created) == CloseCode.SESSION_EXPIRED
        code, _ = await close_code(websocket)
        assert code == CloseCode.TRY_AGAIN
        print(f"node A closed its socket {time.monotonic() - began:.3f} s after the DELETE")
        async with asyncio.timeout(2):
            await a.runtime.idle.wait()
        assert await resume_refused_with(a, created) == CloseCode.SESSION_EXPIRED
        assert (await counted(a), await counted(b)) == (0, 0)
        assert (await delete(a, created.session_id, created.resume_token)).status_code == 204
