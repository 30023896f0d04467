"""A TCP proxy the test controls: real socket drops, a gateway that does not answer, garbage.

Clients connect to the proxy as they would to the gateway (or to a load balancer in
front of several nodes); the test cuts every connection the hard way (no close frame),
points new connections at another node, or makes new connections misbehave after the
WebSocket handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Proxy", "proxy_to"]

Mode = Literal["pass", "mute", "garble"]
"""What new connections do after the handshake: forward both ways; swallow what the client
sends (a gateway that never answers); or answer the client's first frame with a frame
that is not JSON, then swallow."""

_END_OF_HEADERS = b"\r\n\r\n"
# An unmasked server text frame with the 8-byte payload "not json" (RFC 6455, 5.2).
_GARBAGE_FRAME = b"\x81\x08not json"


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    garbled: bool = False

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
    _pairs: set[_Pair] = field(default_factory=set)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def url(self, path: str = "/v1/realtime") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._pairs)

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
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer)
        await self._track(pair, add=True)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, mode, pair, upstream=True),
                self._pump(up_reader, writer, "pass", pair, upstream=False),
            )
        finally:
            pair.abort()
            await self._track(pair, add=False)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        mode: Mode,
        pair: _Pair,
        *,
        upstream: bool,
    ) -> None:
        """Copy one direction until EOF; the client's side obeys ``mode`` after the handshake."""
        seen = b""
        handshake_done = False
        try:
            while data := await reader.read(65536):
                if mode != "pass" and upstream:
                    if handshake_done:
                        self._swallow(pair, mode)
                        continue
                    seen += data
                    if _END_OF_HEADERS in seen:
                        handshake_done = True
                        head, _, rest = seen.partition(_END_OF_HEADERS)
                        writer.write(head + _END_OF_HEADERS)
                        if rest:
                            self._swallow(pair, mode)
                        continue
                writer.write(data)
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
