"""One client socket of a session: a bounded outbound queue drained by a writer task.

A session outlives its sockets; a ``Connection`` is one of them. The driver
pushes encoded events with ``send`` (never blocking: a slow client makes the
queue merge deltas, then closes with 1013); ``close`` ends the socket, after
flushing what is queued or at once.

A client that stops reading stalls the writer: once one send has waited
``send_timeout`` seconds the socket is closed with 1013, and if even the close
cannot be handed over within ``close_timeout`` the connection is aborted (the
server's own close timer aborts it too when the close frame is never answered).
Either way ``done`` is set, so the session detaches and its TTL starts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from gateway.errors import CloseCode
from gateway.inbox import Inbox
from gateway.outqueue import OutboundQueue
from gateway.protocol import Pong, ServerMsg

__all__ = [
    "ABORT_SCOPE_KEY",
    "SEND_FRAMES_SCOPE_KEY",
    "Abort",
    "Connection",
    "SendFrames",
    "Socket",
]

log = structlog.get_logger("gateway.connection")

Abort = Callable[[], None]
"""Drops a socket's connection at once, unsent bytes and all."""

ABORT_SCOPE_KEY = "gateway.abort"
"""ASGI scope key under which the gateway's server puts an ``Abort`` for the WebSocket."""

SendFrames = Callable[[list[bytes]], Awaitable[None]]
"""Sends text frames, each already UTF-8 JSON, in one write to the socket."""

SEND_FRAMES_SCOPE_KEY = "gateway.send_frames"
"""ASGI scope key under which the gateway's server puts a ``SendFrames`` for the WebSocket:
the writer then hands it every event that is ready at once, instead of one ASGI message
(a ``str``, encoded again) and one socket write per event."""

_BATCH_BYTES = 64 * 2**10
"""At most this many bytes of events go in one write (a long replay goes in several)."""

_NOT_READING = "client not reading: resume to get the rest"


class Socket(Protocol):
    """What a Connection needs of a WebSocket (Starlette's fits)."""

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class Connection:
    """See the module docstring."""

    def __init__(
        self,
        socket: Socket,
        *,
        soft_size: int,
        hard_size: int,
        send_timeout: float | None = None,
        close_timeout: float = 5.0,
        abort: Abort | None = None,
        send_frames: SendFrames | None = None,
    ) -> None:
        self._socket = socket
        self._send_frames = send_frames
        self._send_timeout = send_timeout
        self._close_timeout = close_timeout
        self._abort = abort
        self._queue = OutboundQueue(soft_size=soft_size, hard_size=hard_size)
        self._replay: deque[bytes] = deque()
        self._ready = asyncio.Event()
        self._closing: tuple[int, str] | None = None
        self.done = asyncio.Event()
        """Set once the socket is closed (or given up on)."""
        self.close_requested = asyncio.Event()
        """Set as soon as ``close`` is called."""
        self.close_code: int | None = None
        self.pongs_owed = 0
        """Pings read from this socket whose pong is not queued yet (see ``_Reader``)."""
        self.inbox: Inbox[Any] | None = None
        """Frames read from this socket, not yet handed to its session (set by the
        transport's reader; probes and tests read its size)."""
        self._loop = asyncio.get_running_loop()
        self._sending_since: float | None = None
        """When the send under way started (loop time), if one is."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._send_stalled = False
        self._writer = asyncio.create_task(self._write_loop(), name="gateway:writer")
        self._closer: asyncio.Task[None] | None = None

    @property
    def closing(self) -> bool:
        return self._closing is not None

    @property
    def merged(self) -> int:
        return self._queue.merged

    def send(self, msg: ServerMsg | None, data: bytes) -> None:
        """Queue an event; never blocks. Over the hard bound the socket closes with 1013."""
        if self._closing is not None:
            return
        if type(msg) is Pong and self.pongs_owed:
            self.pongs_owed -= 1
        if not self._queue.push(msg, data):
            log.warning("client_too_slow", queued_size=self._queue.size, merged=self._queue.merged)
            self.close(1013, "client too slow: resume to get the rest")
            return
        self._ready.set()

    def replay(self, data: bytes) -> None:
        """Queue a replayed (or connection-level) event ahead of live ones.

        Replayed events are the log's own bytes, already bounded by the log, so they
        do not count against the outbound bounds: a long replay cannot overflow.
        """
        if self._closing is None:
            self._replay.append(data)
            self._ready.set()

    def close(self, code: int, reason: str = "", *, flush: bool = False) -> None:
        """Close the socket: after what is queued (``flush``) or at once."""
        if self._closing is not None:
            return
        self._closing = (code, reason)
        self.close_code = code
        self.close_requested.set()
        if flush:
            self._ready.set()  # the writer drains the queue, then closes
            return
        self._queue.clear()
        self._replay.clear()
        self._writer.cancel()
        self._closer = asyncio.create_task(self._close_socket(), name="gateway:closer")

    async def aclose(self) -> None:
        """Stop the tasks; for when the socket is gone already."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        for task in (self._writer, self._closer):
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in (self._writer, self._closer) if t is not None), return_exceptions=True
        )
        self.done.set()

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                try:
                    while (data := self._next()) is not None:
                        self._sending_since = self._loop.time()
                        if self._watchdog is None and self._send_timeout is not None:
                            self._watchdog = self._loop.call_later(
                                self._send_timeout, self._check_sends
                            )
                        if self._send_frames is None:
                            await self._socket.send_text(data.decode())
                        else:
                            await self._send_frames(self._batch(data))
                finally:
                    self._sending_since = None
                if self._closing is not None:
                    break
        except asyncio.CancelledError:
            if not self._send_stalled:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # our own doing
            self._stalled()
        except Exception as exc:  # whatever the socket raises once the peer is gone
            log.debug("send_failed", error=type(exc).__name__)
            self.done.set()  # the receive loop notices the disconnect too
            return
        await self._close_socket()

    def _check_sends(self) -> None:
        """The stall watchdog: cut a send that has waited ``send_timeout``.

        One timer per busy socket, armed by the first send and re-armed while sends go on
        (not one per send: the writer is on the path of every delta); an idle socket has
        none.
        """
        self._watchdog = None
        since = self._sending_since
        if since is None or self._send_timeout is None:
            return
        stalled_for = self._loop.time() - since
        if stalled_for < self._send_timeout:
            self._watchdog = self._loop.call_later(
                self._send_timeout - stalled_for, self._check_sends
            )
            return
        self._send_stalled = True
        self._writer.cancel()

    def _stalled(self) -> None:
        """A send waited ``send_timeout``: the client stopped reading; close with 1013."""
        log.warning("client_not_reading", send_timeout=self._send_timeout, queued=self._queue.size)
        if self._closing is None:
            self._closing = (CloseCode.TRY_AGAIN, _NOT_READING)
            self.close_code = CloseCode.TRY_AGAIN
            self.close_requested.set()
        self._queue.clear()
        self._replay.clear()

    def _next(self) -> bytes | None:
        return self._replay.popleft() if self._replay else self._queue.pop()

    def _batch(self, first: bytes) -> list[bytes]:
        """``first`` and the events ready after it, up to ``_BATCH_BYTES``: one write."""
        batch, size = [first], len(first)
        while size < _BATCH_BYTES and (data := self._next()) is not None:
            batch.append(data)
            size += len(data)
        return batch

    async def _close_socket(self) -> None:
        assert self._closing is not None
        code, reason = self._closing
        try:
            async with asyncio.timeout(self._close_timeout):
                await self._socket.close(code, reason or None)
        except TimeoutError:
            # A peer that never reads; closing would wait for it forever, with the unsent
            # bytes held in our buffers and the kernel's. Drop the connection.
            log.info("socket_aborted", code=code, close_timeout=self._close_timeout)
            if self._abort is not None:
                self._abort()
        except Exception as exc:  # already closed
            log.debug("close_failed", code=code, error=type(exc).__name__)
        self.done.set()
