"""One client socket of a session: a bounded outbound queue drained by a writer task.

A session outlives its sockets; a ``Connection`` is one of them. The driver
pushes encoded events with ``send`` (never blocking: a slow client makes the
queue merge deltas, then closes with 1013); ``close`` ends the socket, after
flushing what is queued or at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import structlog

from gateway.outqueue import OutboundQueue
from gateway.protocol import Pong, ServerMsg

__all__ = ["Connection", "Socket"]

log = structlog.get_logger("gateway.connection")

CLOSE_WAIT = 5.0
"""Seconds a close may wait for a client that does not read; then the socket is dropped."""


class Socket(Protocol):
    """What a Connection needs of a WebSocket (Starlette's fits)."""

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class Connection:
    """See the module docstring."""

    def __init__(self, socket: Socket, *, soft_size: int, hard_size: int) -> None:
        self._socket = socket
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
                while (data := self._next()) is not None:
                    await self._socket.send_text(data.decode())
                if self._closing is not None:
                    break
        except Exception as exc:  # whatever the socket raises once the peer is gone
            log.debug("send_failed", error=type(exc).__name__)
            self.done.set()  # the receive loop notices the disconnect too
            return
        await self._close_socket()

    def _next(self) -> bytes | None:
        return self._replay.popleft() if self._replay else self._queue.pop()

    async def _close_socket(self) -> None:
        assert self._closing is not None
        code, reason = self._closing
        try:
            async with asyncio.timeout(CLOSE_WAIT):
                await self._socket.close(code, reason or None)
        except Exception as exc:  # already closed, or a peer that never reads: give up
            log.debug("close_failed", code=code, error=type(exc).__name__)
        self.done.set()
