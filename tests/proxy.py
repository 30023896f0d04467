"""A TCP proxy the test controls: real socket drops, a gateway that does not answer, garbage.

Clients connect to the proxy as they would to the gateway (or to a load balancer in
front of several nodes); the test cuts every connection the hard way (no close frame),
points new connections at another node, or makes new connections misbehave after the
WebSocket handshake.

It reads the WebSocket frames going each way (unmasking and inflating them), so that a test
can cut a connection exactly where a bug is: as the client sends a given message, or as the
gateway answers it (``cut_at``). It can also reset the next upgrades, or accept them and
never answer (``upgrades``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Cut", "FrameReader", "Proxy", "proxy_to"]

Mode = Literal["pass", "mute", "garble"]
"""What new connections do after the handshake: forward both ways; swallow what the client
sends (a gateway that never answers); or answer the client's first frame with a frame
that is not JSON, then swallow."""

Upgrade = Literal["pass", "reset", "hold"]
"""What a new connection's upgrade request gets: forwarded; reset at once (the client sees
the connection fail before any answer); or held, never answered."""

_END_OF_HEADERS = b"\r\n\r\n"
# An unmasked server text frame with the 8-byte payload "not json" (RFC 6455, 5.2).
_GARBAGE_FRAME = b"\x81\x08not json"


@dataclass
class Cut:
    """Cut the connection, both ways, on the first frame of message ``type`` going ``way``
    (``up``: from the client; ``down``: from the gateway), that frame not forwarded."""

    way: Literal["up", "down"]
    type: str
    times: int = 1
    """How many connections to cut so (one per connection)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once it cut the last of ``times``."""


class FrameReader:
    """WebSocket frames from a byte stream (RFC 6455, 5.2): each frame's raw bytes, and its
    JSON message when it is a whole text message (unmasked; inflated when compressed with
    permessage-deflate, RFC 7692, whose context carries over between messages)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._inflate = zlib.decompressobj(-15)

    def feed(self, data: bytes) -> list[tuple[bytes, dict[str, object] | None]]:
        self._buffer += data
        frames = []
        while (frame := self._next()) is not None:
            frames.append(frame)
        return frames

    def _next(self) -> tuple[bytes, dict[str, object] | None] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        length, at = buf[1] & 0x7F, 2
        if length == 126:
            if len(buf) < 4:
                return None
            length, at = int.from_bytes(buf[2:4], "big"), 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length, at = int.from_bytes(buf[2:10], "big"), 10
        masked = bool(buf[1] & 0x80)
        key = buf[at : at + 4] if masked else b""
        at += len(key)
        if len(buf) < at + length:
            return None
        raw, payload = buf[: at + length], buf[at : at + length]
        self._buffer = buf[at + length :]
        if masked:
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        fin, compressed, opcode = bool(buf[0] & 0x80), bool(buf[0] & 0x40), buf[0] & 0x0F
        if not fin or opcode != 0x1:
            return raw, None  # control frames; the SDKs never fragment a message
        if compressed:
            payload = self._inflate.decompress(payload + b"\x00\x00\xff\xff")
        try:
            message = json.loads(payload)
        except ValueError:
            return raw, None
        return raw, message if isinstance(message, dict) else None


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    garbled: bool = False
    budget: int | None = None
    """Frames it may still carry (``Proxy.budget``)."""

    def abort(self) -> None:
        self.client.transport.abort()
        self.upstream.transport.abort()


@dataclass
class Proxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream`` (which may change any time)."""

    upstream: int
    port: int = 0
    mode: Mode = "pass"
    accepted: int = 0
    """Connections accepted so far."""
    closed: int = 0
    """Connections that ended so far (either side closed or dropped them)."""
    swallowed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a muted or garbled connection swallowed a frame the client sent."""
    cuts: list[Cut] = field(default_factory=list)
    """Where to cut connections (see ``cut_at``)."""
    upgrades: list[Upgrade] = field(default_factory=list)
    """What the next upgrade requests get, in order (then ``pass``)."""
    held: int = 0
    """Upgrade requests held so far, never answered."""
    budget: Callable[[], int | None] | None = None
    """Frames each new connection may carry (both ways, after its handshake) before it is
    cut, without forwarding the next one; ``None`` from it: no limit. A seeded random
    source makes random drops at random points, the same for a given seed and traffic."""
    _pairs: set[_Pair] = field(default_factory=set)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def url(self, path: str = "/v1/realtime") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._pairs)

    def cut_at(self, way: Literal["up", "down"], type: str, times: int = 1) -> Cut:
        """Cut the next ``times`` connections at their first frame of message ``type`` going
        ``way`` (not forwarded); wait on the result's ``done``."""
        cut = Cut(way, type, times)
        self.cuts.append(cut)
        return cut

    def _cuts(self, way: Literal["up", "down"], message: dict[str, object] | None) -> bool:
        """Whether to cut at ``message`` (going ``way``), counting it."""
        for cut in self.cuts:
            if message is not None and cut.way == way and message.get("type") == cut.type:
                cut.times -= 1
                if cut.times == 0:
                    self.cuts.remove(cut)
                    cut.done.set()
                return True
        return False

    def drop(self) -> int:
        """Cut every open connection without a close frame; return how many."""
        pairs = list(self._pairs)
        for pair in pairs:
            pair.abort()
        return len(pairs)

    async def wait_open(self, count: int, within: float = 10.0) -> None:
        """Wait until exactly ``count`` connections are open."""
        await self.wait_until(lambda: self.open == count, within)

    async def wait_until(self, done: Callable[[], bool], within: float = 10.0) -> None:
        """Wait until ``done()`` holds (checked at every connection opened or ended)."""
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(done)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        mode = self.mode
        upgrade = self.upgrades.pop(0) if self.upgrades else "pass"
        async with self._changed:
            self._changed.notify_all()
        if upgrade != "pass":
            await self._refuse(reader, writer, upgrade)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer, budget=self.budget() if self.budget else None)
        await self._track(pair, add=True)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, mode, pair, upstream=True),
                self._pump(up_reader, writer, "pass", pair, upstream=False),
            )
        finally:
            pair.abort()
            await self._track(pair, add=False)

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upgrade: Upgrade
    ) -> None:
        """Reset the upgrade as soon as its request came, or hold it unanswered until the
        client gives up (or the proxy closes)."""
        with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
            await reader.readuntil(_END_OF_HEADERS)
            if upgrade == "hold":
                self.held += 1
                async with self._changed:
                    self._changed.notify_all()
                while await reader.read(65536):
                    pass  # until the client closes
        writer.transport.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        mode: Mode,
        pair: _Pair,
        *,
        upstream: bool,
    ) -> None:
        """Copy one direction until EOF, frame by frame after the handshake (``cuts`` may
        end it at one); the client's side obeys ``mode`` after the handshake."""
        seen = b""
        handshake_done = False
        frames = FrameReader()
        way: Literal["up", "down"] = "up" if upstream else "down"
        try:
            while data := await reader.read(65536):
                if not handshake_done:
                    seen += data
                    if _END_OF_HEADERS not in seen:
                        continue
                    handshake_done = True
                    head, _, data = seen.partition(_END_OF_HEADERS)
                    writer.write(head + _END_OF_HEADERS)
                    if not data:
                        await writer.drain()
                        continue
                if mode != "pass" and upstream:
                    self._swallow(pair, mode)
                    continue
                for raw, message in frames.feed(data):
                    if pair.budget == 0 or self._cuts(way, message):
                        return  # the finally below cuts both ways
                    if pair.budget is not None:
                        pair.budget -= 1
                    writer.write(raw)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            pair.abort()  # one side ended: so does the other, as a dropped route would

    def _swallow(self, pair: _Pair, mode: Mode) -> None:
        if mode == "garble" and not pair.garbled:
            pair.garbled = True
            pair.client.write(_GARBAGE_FRAME)
        self.swallowed.set()

    async def _track(self, pair: _Pair, *, add: bool) -> None:
        async with self._changed:
            if add:
                self._pairs.add(pair)
            else:
                self._pairs.discard(pair)
                self.closed += 1
            self._changed.notify_all()


@asynccontextmanager
async def proxy_to(upstream: int) -> AsyncIterator[Proxy]:
    """A proxy to ``127.0.0.1:upstream`` on a free port, for the block's duration."""
    proxy = Proxy(upstream)
    server = await asyncio.start_server(proxy._serve, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.drop()
        with contextlib.suppress(TimeoutError):
            await proxy.wait_open(0, within=5)
        await server.wait_closed()
