"""A minimal RFC 6455 client for the load generator of the process benchmarks.

A plain asyncio Protocol with a hand-rolled frame parser, after the raw client of the
shared harness (``../shared/bench/common.py``): it costs far less CPU per frame than a
WebSocket library, so the server under test is what the figures measure. Each frame is
stamped with ``time.perf_counter()`` when its bytes arrive, before any parsing. No
extensions, no client pings; the server's pings are answered, text and binary frames are
queued, a close frame ends the connection.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import socket
import time
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import msgspec
from websockets.speedups import apply_mask

__all__ = ["Closed", "WebSocket", "connect", "frame_type"]


CONNECT_TIMEOUT = 10.0
"""Seconds to connect and get the handshake's answer."""
CLOSE_TIMEOUT = 2.0
"""Seconds the server has to end the connection after our close frame."""


class Closed(Exception):
    """The connection ended (close frame, reset, or a refused handshake)."""


class _Head(msgspec.Struct):
    type: str = ""


_decode_head = msgspec.json.Decoder(_Head).decode


def frame_type(payload: bytes) -> str:
    """The ``type`` of a JSON message, decoding nothing else."""
    return _decode_head(payload).type


class _Protocol(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.handshake: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.open = False
        self.frames: deque[tuple[float, bytes]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self._buf = b""
        self._fragments: list[bytes] | None = None
        self._rand = random.Random()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if not self.handshake.done():
            self.handshake.set_exception(Closed(f"closed during the handshake: {exc}"))
        if not self.lost.done():
            self.lost.set_result(None)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()  # arrival, before any parsing
        if self._buf:
            data, self._buf = self._buf + data, b""
        if not self.open:
            data = self._handshake_reply(data)
            if not self.open:
                return
        self._frames(now, data)

    def _handshake_reply(self, data: bytes) -> bytes:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self._buf = data
            return b""
        head, rest = data[:end], data[end + 4 :]
        if not head.startswith(b"HTTP/1.1 101"):
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            self.handshake.set_exception(Closed(f"handshake refused: {line}"))
            assert self.transport is not None
            self.transport.abort()
            return b""
        self.open = True
        self.handshake.set_result(None)
        return rest

    def _frames(self, now: float, data: bytes) -> None:
        n, pos, delivered = len(data), 0, False
        while n - pos >= 2:
            b0, length, head = data[pos], data[pos + 1] & 0x7F, 2
            if length == 126:
                if n - pos < 4:
                    break
                length, head = int.from_bytes(data[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if n - pos < 10:
                    break
                length, head = int.from_bytes(data[pos + 2 : pos + 10], "big"), 10
            end = pos + head + length
            if end > n:
                break
            payload, pos = data[pos + head : end], end
            delivered |= self._frame(now, b0, payload)
        self._buf = data[pos:]
        if delivered:
            self._wake()

    def _frame(self, now: float, b0: int, payload: bytes) -> bool:
        opcode, final = b0 & 0x0F, bool(b0 & 0x80)
        if opcode in (1, 2):
            if final:
                self.frames.append((now, payload))
                return True
            self._fragments = [payload]
        elif opcode == 0 and self._fragments is not None:
            self._fragments.append(payload)
            if final:
                self.frames.append((now, b"".join(self._fragments)))
                self._fragments = None
                return True
        elif opcode == 9:  # ping: answer it
            self.write(0x8A, payload)
        elif opcode == 8:  # close: answer it and end
            self.write(0x88, payload[:2])
            self.open = False
            assert self.transport is not None
            self.transport.close()
        return False

    def write(self, b0: int, payload: bytes) -> None:
        length = len(payload)
        if length < 126:
            head = bytes((b0, 0x80 | length))
        elif length < 65536:
            head = bytes((b0, 0x80 | 126)) + length.to_bytes(2, "big")
        else:
            head = bytes((b0, 0x80 | 127)) + length.to_bytes(8, "big")
        mask = self._rand.getrandbits(32).to_bytes(4, "big")
        assert self.transport is not None
        self.transport.write(head + mask + apply_mask(payload, mask))


class WebSocket:
    """One client connection: ``send`` a text frame, ``recv`` (arrival time, payload)."""

    def __init__(self, protocol: _Protocol) -> None:
        self._p = protocol

    def send(self, payload: bytes) -> None:
        """Write one text frame (the benchmarks send small frames, one at a time)."""
        if not self._p.open:
            raise Closed("send on a closed connection")
        self._p.write(0x81, payload)

    async def recv(self) -> tuple[float, bytes]:
        """The next frame and the ``perf_counter()`` time its bytes arrived."""
        p = self._p
        while not p.frames:
            if not p.open:
                raise Closed("connection closed")
            p.waiter = p.loop.create_future()
            await p.waiter
            p.waiter = None
        return p.frames.popleft()

    async def recv_type(self, wanted: str) -> tuple[float, bytes]:
        """The next frame of type ``wanted``, skipping others; an ``error`` raises."""
        while True:
            at, payload = await self.recv()
            kind = frame_type(payload)
            if kind == wanted:
                return at, payload
            if kind == "error":
                raise RuntimeError(f"the gateway answered an error: {payload.decode()}")

    async def close(self) -> None:
        """Close handshake, then drop the TCP connection if the server is slow to end it."""
        p = self._p
        if p.open:
            p.write(0x88, (1000).to_bytes(2, "big"))
        try:
            await asyncio.wait_for(asyncio.shield(p.lost), CLOSE_TIMEOUT)
        except TimeoutError:
            if p.transport is not None:
                p.transport.abort()


async def connect(url: str) -> WebSocket:
    """Open a WebSocket to ``url`` (``ws://host:port/path``)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loop = asyncio.get_running_loop()
    transport, protocol = await asyncio.wait_for(
        loop.create_connection(lambda: _Protocol(loop), host, port), CONNECT_TIMEOUT
    )
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    transport.write(request.encode())  # uvloop may call connection_made after this
    try:
        await asyncio.wait_for(asyncio.shield(protocol.handshake), CONNECT_TIMEOUT)
    except BaseException:
        transport.abort()
        raise
    return WebSocket(protocol)
