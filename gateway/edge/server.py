"""uvicorn's HTTP and WebSocket protocols with the limits that hold under attack.

uvicorn alone holds a connection that never finishes its request headers forever
(slowloris), closes a WebSocket whose peer stopped reading with ``transport.close()``
(which waits for the unsent bytes, so forever), and answers a missed keepalive pong
with 1011 (our bug, for a peer's fault). The subclasses here change exactly that:

- ``handshake_timeout``: a connection has that long for its whole HTTP request (request
  line, headers, body; a WebSocket upgrade included) from its first byte, or from the
  connection itself; then it is aborted.
- ``max_connections`` (uvicorn's ``limit_concurrency``) applies to WebSocket upgrades too:
  past it the upgrade gets HTTP 503, as plain requests do.
- A WebSocket close never waits for the peer to read: the close frame is queued and, when
  the closing handshake is not done within ``ws_close_timeout``, the connection is
  aborted. Whatever closes the transport (the peer, a shutdown, the app returning) gets
  the same bound.
- A keepalive ping left unanswered closes with 1013 ("no pong in time"), not 1011.
- The ASGI scope of each WebSocket carries an ``Abort`` under ``ABORT_SCOPE_KEY`` (see
  ``gateway.shell.connection``), so the app can drop a connection that does not read, and the
  protocol itself as a ``FrameWriter`` under ``FRAME_WRITER_SCOPE_KEY``, so it can write
  every ready event in one go, as the UTF-8 bytes it encoded, framed here.

This module and ``__main__`` are the only ones that import uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any, ClassVar

import structlog
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.http11 import Request
from websockets.protocol import State

from gateway.config import Config
from gateway.errors import closing
from gateway.shell.connection import ABORT_SCOPE_KEY, FRAME_WRITER_SCOPE_KEY, BinaryFrame

__all__ = ["GatewayHttpProtocol", "GatewayWebSocketProtocol", "fit_open_file_limit", "protocols"]

log = structlog.get_logger("gateway.server")

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 27\r\nconnection: close\r\n\r\nExceeded concurrency limit."
)


def _framed(frames: list[bytes]) -> list[bytes]:
    """Each frame as a whole unmasked text frame (RFC 6455 5.2), header then payload: what
    websockets' ``send_text`` writes for a server without extensions, at a fraction of
    the cost (it builds a ``Frame`` object and its header per frame)."""
    out: list[bytes] = []
    for data in frames:
        size = len(data)
        opcode = 0x82 if type(data) is BinaryFrame else 0x81  # FIN and binary, or text
        if size < 126:
            out.append(_SHORT_HEADERS[size] if opcode == 0x81 else bytes((opcode, size)))
        elif size < 65_536:
            out.append(_MEDIUM_HEADER.pack(opcode, 126, size))
        else:
            out.append(_LONG_HEADER.pack(opcode, 127, size))
        out.append(data)
    return out


_SHORT_HEADERS = [bytes((0x81, size)) for size in range(126)]
_MEDIUM_HEADER = struct.Struct("!BBH")
_LONG_HEADER = struct.Struct("!BBQ")


def _drop(transport: asyncio.Transport) -> None:
    """Abort ``transport`` with a TCP reset, so the kernel frees what it still buffers.

    A plain close of a socket with unsent bytes leaves an orphan the kernel keeps trying
    to send to (for minutes, to a peer that does not read); ``SO_LINGER`` 0 discards them.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def protocols(config: Config) -> tuple[type[GatewayHttpProtocol], type[GatewayWebSocketProtocol]]:
    """The protocol classes to give ``uvicorn.Config(http=..., ws=...)`` for ``config``."""

    class Http(GatewayHttpProtocol):
        handshake_timeout = config.handshake_timeout

    class WebSocket(GatewayWebSocketProtocol):
        close_wait = config.ws_close_timeout

    return Http, WebSocket


class GatewayHttpProtocol(HttpToolsProtocol):
    """httptools' protocol with a deadline for each request and a bound on upgrades."""

    handshake_timeout: ClassVar[float | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._start_request_timer()  # a connection that never sends a byte counts too

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_request_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_request_timer()  # the next request on a kept-alive connection

    def on_message_complete(self) -> None:
        self._stop_request_timer()
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._stop_request_timer()  # the request is complete; the WebSocket takes over
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            # uvicorn checks limit_concurrency only for plain requests.
            self.logger.warning("Exceeded concurrency limit.")
            self.transport.write(_BUSY)
            self.transport.close()
            return
        super().handle_websocket_upgrade()

    def _start_request_timer(self) -> None:
        if self.handshake_timeout is not None and self._request_timer is None:
            self._request_timer = self.loop.call_later(self.handshake_timeout, self._timed_out)

    def _stop_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _timed_out(self) -> None:
        self._request_timer = None
        log.debug("handshake_timed_out", timeout=self.handshake_timeout)
        _drop(self.transport)


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    """The sans-I/O websockets protocol, with closes that cannot hang (see the module)."""

    close_wait: ClassVar[float] = 5.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_timeout = self.close_wait
        self._abort_timer: asyncio.TimerHandle | None = None

    def abort(self) -> None:
        """Drop the connection now, and whatever is still unsent with it."""
        if not self.disconnected:
            log.info("socket_aborted", close_wait=self.close_wait)
            _drop(self.transport)

    # Hooks: after each of these, a transport left closing must be gone within close_wait.

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101:
            # The app task has been created, not started: it sees this key.
            self.scope[ABORT_SCOPE_KEY] = self.abort  # type: ignore[literal-required]
            self.scope[FRAME_WRITER_SCOPE_KEY] = self  # type: ignore[literal-required]
        self._bound_closing()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._bound_closing()

    def shutdown(self) -> None:
        super().shutdown()
        self._bound_closing()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        self._bound_closing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        super().connection_lost(exc)

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "websocket.close" and self.handshake_complete:
            if self.initial_response is None:
                # uvicorn would first wait until the peer reads (forever, if it does not).
                self._close(message.get("code", 1000), message.get("reason") or "")
                return
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            # The handshake's request and response (two sets of headers, a dozen objects
            # for the collector to walk) are not read again: not kept for the socket's life.
            self.request = self.response = None  # type: ignore[assignment]
        self._bound_closing()

    def write_now(self, frames: list[bytes]) -> bool:
        """``FrameWriter.write_now``: text frames (UTF-8 already) in one write, unless the
        transport's buffer is full (uvicorn's flow control cleared ``writable``)."""
        if not self.writable.is_set():
            return False
        self._write_frames(frames)
        return True

    async def write(self, frames: list[bytes]) -> None:
        """``FrameWriter.write``: waits while the transport's buffer is full, as ``send``
        does for one ``websocket.send``."""
        await self.writable.wait()
        self._write_frames(frames)

    def _write_frames(self, frames: list[bytes]) -> None:
        if self.disconnected:
            raise ClientDisconnected()
        if self.close_sent or not self.handshake_complete:
            return  # as uvicorn does with a send after the close: dropped
        if self.conn.state is not State.OPEN:
            raise ClientDisconnected()  # the peer's close came in: what send_text raises
        if self.conn.extensions:  # permessage-deflate: websockets compresses each frame
            for data in frames:
                if type(data) is BinaryFrame:
                    self.conn.send_binary(data)
                else:
                    self.conn.send_text(data)
            self.transport.write(b"".join(self.conn.data_to_send()))
        elif len(frames) == 1 and len(frames[0]) < 126 and type(frames[0]) is not BinaryFrame:
            # A delta, a pong: the usual case.
            self.transport.write(_SHORT_HEADERS[len(frames[0])] + frames[0])
        else:
            self.transport.write(b"".join(_framed(frames)))

    def keepalive_timeout(self) -> None:
        self.pong_timer = None
        self.pending_ping_payload = None
        if self.close_sent or self.transport.is_closing():
            return
        log.info("ping_timed_out", ping_timeout=self.ping_timeout)
        no_pong = closing("no_pong")
        self._close(no_pong.code, no_pong.reason)

    def _close(self, code: int, reason: str) -> None:
        """Start the closing handshake without waiting for the peer; abort if it stalls."""
        if self.close_sent or self.disconnected or self.transport.is_closing():
            return  # closing already (by us or by the peer)
        try:
            self.conn.send_close(code, reason)
        except InvalidState:
            return  # the peer's close came first
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused:  # read on, to see the peer's close frame
            self.read_paused = False
            self.transport.resume_reading()
        # uvicorn's handle_close cancels close_timer when the peer answers, then closes.
        self.close_timer = self.loop.call_later(self.close_wait, self.abort)

    def _bound_closing(self) -> None:
        if self._abort_timer is None and not self.disconnected and self.transport.is_closing():
            self._abort_timer = self.loop.call_later(self.close_wait, self.abort)


_SPARE_FILES = 1024
"""Open files beyond one per connection: logs, the store, the schema worker, upstream HTTP."""


def fit_open_file_limit(config: Config) -> None:
    """Raise this process's soft open-file limit so ``max_connections`` sockets fit.

    Linux often starts processes at 1024 open files, far fewer than a node's connections;
    the hard limit is usually higher and a process may raise its own soft limit up to it.
    Logs a warning when the hard limit is too low for ``max_connections``.
    """
    import resource  # POSIX only: the gateway serves from Linux and macOS

    wanted = (config.max_connections or 65_536) + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open_file_limit_low",
            limit=soft,
            wanted=wanted,
            note="fewer sockets than max_connections can be open: raise `ulimit -n`",
        )
