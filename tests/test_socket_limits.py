"""Limits on WebSockets, tried from outside: a client that stops reading, sockets per
address, sessions in total and per principal."""

from __future__ import annotations

import asyncio
import errno
import json
import select
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import websockets

from client_sdk import Connection, connect_raw
from gateway.wire.v1 import (
    SUBPROTOCOL,
    ResponseDone,
    SessionCreated,
    SessionResume,
    SessionResumed,
    SessionStart,
)
from tests.support import Gateway, say, serving, session, streamed_text


def _flood_agent(tmp_path: Path, words: int) -> tuple[str, str]:
    text = " ".join(f"w{i}" for i in range(words))
    (tmp_path / "scenario.toml").write_text(
        f"pace = 0\n[[rules]]\nmatch = 'flood'\nsay = '{text}'\n"
    )
    (tmp_path / "agent.toml").write_text(
        'name = "flood"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
    )
    return str(tmp_path / "agent.toml"), text


def _wait_for_reset(sock: socket.socket, timeout: float) -> int:
    """Block until the peer resets ``sock`` (or ``timeout``); the socket's pending error."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLPRI)  # only errors and hang-ups wake it
    poller.poll(timeout * 1000)
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


def _reset_yet(sock: socket.socket) -> bool:
    """Whether the peer has reset ``sock``, without waiting (nor clearing its error)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLPRI)
    return bool(poller.poll(0))


async def _stubborn_client(url: str) -> tuple[websockets.ClientConnection, socket.socket]:
    """A WebSocket client with a tiny receive buffer that reads only when told to."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = url.removeprefix("ws://").split("/")[0].split(":")
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    # max_queue=1: once one frame waits unread, the client stops reading the socket.
    websocket = await websockets.connect(url, sock=sock, subprotocols=[SUBPROTOCOL], max_queue=1)
    return websocket, sock


async def test_a_client_that_stops_reading_is_aborted_detached_and_resumes(tmp_path):
    agent, text = _flood_agent(tmp_path, 20_000)  # ~500 KB of events: more than buffers hold
    close_timeout = 0.5
    async with serving(
        agent=agent,
        send_buffer=4096,
        send_timeout=1.5,  # long enough that the resumed client, reading, is never cut
        ws_close_timeout=close_timeout,
        ws_ping_interval=None,  # the stalled send alone must catch it
        replay_max_events=50_000,  # the resume gets every event back
    ) as gateway:
        websocket, sock = await _stubborn_client(gateway.url)
        await websocket.send(json.dumps({"type": "session.start"}))
        created = json.loads(await websocket.recv())
        driver = gateway.runtime.drivers[created["session_id"]]
        conn = driver.connection
        assert conn is not None
        reset_when_detached: list[bool] = []  # looked at the moment it detaches
        driver.detached.on_set(lambda: reset_when_detached.append(_reset_yet(sock)))
        loop = asyncio.get_running_loop()
        asked_at = loop.time()  # before anything the close timeout counts from
        await websocket.send(json.dumps({"type": "user.message", "text": "flood"}))
        await asyncio.wait_for(conn.close_requested.wait(), 10)
        assert conn.close_code == 1013  # resumable; never 1011, which means our bug
        await asyncio.wait_for(driver.detached.wait(), 10)
        # Detached at once, not when the socket is given up on: it was not reset yet.
        assert reset_when_detached == [False]
        assert created["session_id"] in gateway.runtime.drivers  # its TTL runs
        # Unread, the socket is aborted after the close timeout: reset, not closed, so the
        # kernel lets go of what it buffered for it.
        error = await loop.run_in_executor(None, _wait_for_reset, sock, 10.0)
        assert error == errno.ECONNRESET
        assert loop.time() - asked_at >= close_timeout * 0.9
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(_read_to_the_end(websocket), 10)
        assert closed.value.rcvd is None  # the close frame was dropped with the rest
        # The session resumes and the client gets everything.
        await asyncio.wait_for(driver.quiet.wait(), 10)
        async with connect_raw(gateway.url) as fresh:
            await fresh.send(
                SessionResume(
                    session_id=created["session_id"],
                    resume_token=created["resume_token"],
                    last_seq=created["seq"],
                )
            )
            resumed = await fresh.recv()
            assert isinstance(resumed, SessionResumed)
            events = await fresh.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == text


async def test_a_peer_that_misses_a_pong_is_closed_with_1013_not_1011():
    async with serving(ws_ping_interval=0.2, ws_ping_timeout=0.2) as gateway:
        async with connect_raw(gateway.url) as conn:
            await conn.send(SessionStart())
            created = await conn.recv()
            assert isinstance(created, SessionCreated)
            driver = gateway.runtime.drivers[created.session_id]
            conn.websocket.transport.pause_reading()  # no more pongs
            await asyncio.wait_for(driver.detached.wait(), 10)
            conn.websocket.transport.resume_reading()
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(conn.websocket.recv(), 10)
        # Checked while the gateway runs: once it stops, it stops every session.
        assert created.session_id in gateway.runtime.drivers
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1013
    assert closed.value.rcvd.reason == "no pong in time: resume to get the rest"


async def _read_to_the_end(websocket: websockets.ClientConnection) -> None:
    while True:
        await websocket.recv()


async def _try_session(url: str) -> websockets.ClientConnection | None:
    """A socket with a session on it, or ``None`` when the gateway refused the socket."""
    websocket = await websockets.connect(url, subprotocols=[SUBPROTOCOL])
    await websocket.send(json.dumps({"type": "session.start"}))
    try:
        reply = json.loads(await websocket.recv())
    except websockets.ConnectionClosed:
        return None
    assert reply["type"] == "session.created"
    return websocket


async def _refused(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with websockets.connect(
        url, subprotocols=[SUBPROTOCOL], additional_headers=headers
    ) as websocket:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(websocket.recv(), 10)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def test_sockets_per_address_are_limited_and_given_back():
    async with serving(max_sockets_per_ip=3, forwarded_allow_ips="") as gateway:
        held = [await websockets.connect(gateway.url, subprotocols=[SUBPROTOCOL]) for _ in "abc"]
        # The header is not from a trusted proxy: the socket still counts as 127.0.0.1.
        spoofed = {"X-Forwarded-For": "203.0.113.9"}
        assert await _refused(gateway.url, spoofed) == (
            1013,
            "too many sockets from this address",
        )
        await held.pop().close()
        # The slot comes back once the server has let go of the socket.
        async with asyncio.timeout(10):
            while (websocket := await _try_session(gateway.url)) is None:
                pass  # refused until then: each try is a real round trip, not a sleep
        held.append(websocket)
        assert refused(gateway, "too_many_sockets") >= 1
        for websocket in held:
            await websocket.close()


async def test_a_trusted_proxy_forwards_the_client_address():
    async with serving(max_sockets_per_ip=1, forwarded_allow_ips="127.0.0.1") as gateway:
        first = {"X-Forwarded-For": "203.0.113.1"}
        async with websockets.connect(
            gateway.url, subprotocols=[SUBPROTOCOL], additional_headers=first
        ):
            assert await _refused(gateway.url, first) == (
                1013,
                "too many sockets from this address",
            )
            # Another client behind the same proxy has its own count.
            async with session(gateway.url) as (conn, _):
                events = await say(conn, "echo other client")
    assert streamed_text(events) == "other client"


KEY = "backend-key-0123456789abcdef"
"""An API key: its sessions belong to the principal ``key:backend``."""


@asynccontextmanager
async def keyed_session(url: str) -> AsyncIterator[tuple[Connection, SessionCreated]]:
    async with connect_raw(url, api_key=KEY) as conn:
        await conn.send(SessionStart())
        created = await conn.recv()
        assert isinstance(created, SessionCreated), created
        yield conn, created


async def test_sessions_per_principal_count_detached_ones_until_they_end():
    keyed = {"no_auth": False, "api_keys": f"backend:{KEY}"}
    async with serving(max_sessions_per_principal=2, max_sessions=None, **keyed) as gateway:
        async with (
            keyed_session(gateway.url) as (first, _),
            keyed_session(gateway.url) as (second, created),
        ):
            code, reason = await _start_refused(gateway.url, KEY)
            assert (code, reason) == (4029, "too many sessions: at most 2 per client")
            # A dropped session waits for its resume, and still counts.
            driver = gateway.runtime.drivers[created.session_id]
            second.websocket.transport.abort()
            await asyncio.wait_for(driver.detached.wait(), 10)
            assert await _start_refused(gateway.url, KEY) == (code, reason)
            # Another principal has its own quota.
            other = await gateway.runtime.start_session(principal="key:other")
            other.stop()
            # The sessions that were let in work as usual.
            assert streamed_text(await say(first, "echo fine")) == "fine"
            async with connect_raw(gateway.url, api_key=KEY) as again:
                await again.send(
                    SessionResume(
                        session_id=created.session_id,
                        resume_token=created.resume_token,
                        last_seq=created.seq,
                    )
                )
                assert isinstance(await again.recv(), SessionResumed)
        # Both closed with 1000: their sessions end, and the quota comes back.
        await asyncio.wait_for(gateway.runtime.idle.wait(), 10)
        async with keyed_session(gateway.url) as (conn, _):
            assert streamed_text(await say(conn, "echo back")) == "back"
    assert refused(gateway, "too_many_sessions") == 2


async def test_without_auth_only_the_total_bounds_anonymous_sessions():
    # Every client is the same anonymous principal then (loopback only): a quota per
    # principal would be a second, smaller total.
    async with serving(max_sessions_per_principal=1, max_sessions=3) as gateway:
        async with session(gateway.url), session(gateway.url), session(gateway.url):
            assert await _start_refused(gateway.url) == (1013, "gateway full: try again later")


async def test_a_full_gateway_refuses_new_sessions_with_1013():
    async with serving(max_sessions=2, max_sessions_per_principal=None) as gateway:
        async with session(gateway.url), session(gateway.url) as (conn, _):
            assert await _start_refused(gateway.url) == (1013, "gateway full: try again later")
            assert streamed_text(await say(conn, "echo served")) == "served"
    assert refused(gateway, "gateway_full") == 1


async def _start_refused(url: str, api_key: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with websockets.connect(
        url, subprotocols=[SUBPROTOCOL], additional_headers=headers
    ) as websocket:
        await websocket.send(json.dumps({"type": "session.start"}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(websocket.recv(), 10)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


def refused(gateway: Gateway, label: str) -> float:
    """How many sockets the gateway refused for ``label``, from its metrics."""
    value = gateway.runtime.metrics.registry.get_sample_value(
        "gateway_connections_rejected_total", {"reason": label}
    )
    return value or 0.0
