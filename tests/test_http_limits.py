"""Limits at the HTTP level, tried from outside over raw sockets: slowloris, body size."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import tracemalloc
from typing import Any

import httpx
import pytest
import websockets
from structlog.testing import capture_logs

from gateway.wire.v1 import SUBPROTOCOL
from tests.support import say, serving, session, streamed_text

SLOWLORIS = 500
TRICKLERS = 50
"""Of the slowloris sockets, these send one more header line every 0.1 s, forever."""


def _enough_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


async def _hold_open(port: int, kind: int) -> tuple[float, float]:
    """One slowloris socket; returns when it was opened and when the server closed it."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = loop.time()
    trickle: asyncio.Task[None] | None = None
    if kind == 1:  # says nothing at all
        pass
    elif kind == 2:  # most of an upgrade request, never the blank line that ends it
        writer.write(
            b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        )
    else:  # trickles header lines, each well within the timeout

        async def trickle_headers() -> None:
            writer.write(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            line = 0
            while True:
                await asyncio.sleep(0.1)  # the attack's pace, not a wait for the server
                writer.write(b"X-Slow-%d: 1\r\n" % line)
                line += 1

        trickle = asyncio.create_task(trickle_headers())
    try:
        with contextlib.suppress(ConnectionError):
            assert await reader.read() == b""  # no answer: the server just drops it
        return opened, loop.time()
    finally:
        if trickle is not None:
            trickle.cancel()
        writer.transport.abort()


async def test_slowloris_sockets_are_dropped_while_a_conversation_goes_on():
    _enough_files(4 * SLOWLORIS + 256)
    timeout = 2.0
    async with serving(handshake_timeout=timeout) as gateway:
        kinds = [1 + i % 2 for i in range(SLOWLORIS - TRICKLERS)] + [3] * TRICKLERS
        holders = [asyncio.create_task(_hold_open(gateway.port, kind)) for kind in kinds]
        async with session(gateway.url) as (conn, _created):
            for turn in range(5):
                events = await asyncio.wait_for(say(conn, f"echo turn {turn}"), 5)
                assert streamed_text(events) == f"turn {turn}"
            async with asyncio.timeout(timeout + 20):
                spans = await asyncio.gather(*holders)
            # The conversation outlived every slowloris socket, and still works.
            events = await asyncio.wait_for(say(conn, "echo still here"), 5)
            assert streamed_text(events) == "still here"
    held = sorted(closed - opened for opened, closed in spans)
    assert len(held) == SLOWLORIS
    assert held[0] >= timeout * 0.9, held[0]  # none is dropped early...
    assert held[-1] < timeout + 5, held[-1]  # ...and none is held much past the timeout


async def _post(port: int, head: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    await asyncio.get_running_loop().sock_sendall(sock, head)
    return sock


async def _response(sock: socket.socket) -> tuple[int, dict[str, object], bytes]:
    """Read one HTTP response, up to the server closing the connection."""
    loop = asyncio.get_running_loop()
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await loop.sock_recv(sock, 65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body), head


async def test_a_declared_oversized_body_is_refused_before_it_is_sent():
    async with serving(max_body_size=1024) as gateway:
        sock = await _post(
            gateway.port,
            b"POST /v1/tools/add/test HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 268435456\r\n\r\n",
        )
        try:
            async with asyncio.timeout(5):  # not one byte of the body was sent
                status, answer, head = await _response(sock)
        finally:
            sock.close()
    assert status == 413
    assert answer == {"error": "body_too_large: the request body is over 1024 bytes"}
    assert b"connection: close" in head.lower()


async def test_a_streamed_oversized_body_is_cut_early_and_never_held():
    limit = 64 * 1024
    chunk = memoryview(b"x" * 65536)
    planned = 64 * 2**20
    async with serving(max_body_size=limit) as gateway:
        loop = asyncio.get_running_loop()
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            # One chunk declared 256 MiB long, streamed for as long as the server reads.
            sock = await _post(
                gateway.port,
                b"POST /v1/tools/add/test HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n10000000\r\n",
            )
            sent = 0

            async def stream() -> None:
                nonlocal sent
                with contextlib.suppress(ConnectionError):
                    while sent < planned:
                        await loop.sock_sendall(sock, chunk)
                        sent += len(chunk)

            streaming = asyncio.create_task(stream())
            try:
                async with asyncio.timeout(10):
                    status, answer, _ = await _response(sock)
                    await streaming
            finally:
                streaming.cancel()
                sock.close()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert status == 413
    assert answer["error"].startswith("body_too_large")  # type: ignore[union-attr]
    assert sent < planned  # the server closed the connection instead of reading on
    # What the gateway held stayed far below what the client pushed at it.
    assert peak - base < 4 * 2**20, (peak - base, sent)


async def test_a_body_within_the_limit_is_served():
    async with serving(max_body_size=1024) as gateway:
        base = f"http://127.0.0.1:{gateway.port}"
        async with httpx.AsyncClient(base_url=base) as client:
            reply = await client.post("/v1/tools/add/test", json={"a": 2, "b": 3})
    assert reply.status_code == 200, reply.text
    assert reply.json()["output"] == {"total": 5}


async def test_past_max_connections_upgrades_and_requests_get_503():
    async with serving(max_connections=3) as gateway:
        async with session(gateway.url) as (first, _), session(gateway.url):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(gateway.url, subprotocols=[SUBPROTOCOL])
            assert refused.value.response.status_code == 503
            base = f"http://127.0.0.1:{gateway.port}"
            async with httpx.AsyncClient(base_url=base) as client:
                assert (await client.get("/healthz")).status_code == 503
            # The sockets already in are served as usual.
            assert streamed_text(await say(first, "echo in")) == "in"


async def _closed_after(sock: socket.socket) -> float:
    """Read until the server closes ``sock``; seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with contextlib.suppress(ConnectionError):
        while await loop.sock_recv(sock, 65536):
            pass
    return loop.time() - started


async def test_a_body_that_trickles_in_is_cut_at_the_handshake_timeout():
    async with serving(handshake_timeout=0.5) as gateway:
        sock = await _post(
            gateway.port,
            b"POST /v1/tools/add/test HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        try:
            held = await asyncio.wait_for(_closed_after(sock), 10)
        finally:
            sock.close()
    assert 0.4 < held < 5


async def test_an_idle_keep_alive_connection_is_closed():
    async with serving(keep_alive_timeout=0.5) as gateway:
        sock = await _post(gateway.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            loop = asyncio.get_running_loop()
            first = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
            assert first.startswith(b"HTTP/1.1 200")
            held = await asyncio.wait_for(_closed_after(sock), 10)
        finally:
            sock.close()
    assert held < 5


@pytest.mark.parametrize("path", ["/a2a", "/v1/tools/add/test"])
async def test_a_client_gone_mid_body_is_no_error_of_the_gateway(path: str) -> None:
    """Half a body, then the socket goes: the request ends quietly (logged at info, not an
    error with a traceback) and the gateway goes on serving."""
    gone = asyncio.Event()

    def watch(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if event["event"] == "client_gone_mid_request":
            gone.set()
        return event

    async with serving(a2a=True) as gateway:
        with capture_logs(processors=[watch]) as logs:
            _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n\r\n".encode()
                + b'{"jsonrpc": "2.0", "id": 1,'
            )
            await writer.drain()
            writer.transport.abort()
            async with asyncio.timeout(10):
                await gone.wait()
        assert not [e for e in logs if e["log_level"] in ("error", "critical")]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            assert (await http.get("/healthz")).status_code == 200
