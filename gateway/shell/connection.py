"""One client socket of a session: a bounded outbound queue, written without a task.

A session outlives its sockets; a ``Connection`` is one of them. The driver
pushes encoded events with ``send`` (never blocking: a slow client makes the
queue merge deltas, then closes with 1013); ``close`` ends the socket, after
flushing what is queued or at once.

Writing: the events queued while the loop runs one round go out together, in one
socket write, from one callback (``loop.call_soon``) at the end of that round, as long
as the socket takes them at once (the gateway's server gives each WebSocket a
``FrameWriter`` for that, see ``gateway.edge.server``). Only when the socket pushes back (the
transport's buffer is full) does a writer task start, to wait for it; it ends once the
queue is empty. So an event costs no task switch on its way out, and an idle socket
holds no task.

A client that stops reading stalls the writer: once one write has waited
``send_timeout`` seconds the socket is closed with 1013, and if even the close
cannot be handed over within ``close_timeout`` the connection is aborted (the
server's own close timer aborts it too when the close frame is never answered).
Either way ``done`` is set, so the session detaches and its TTL starts.

A connection may speak another wire protocol than v1: with a ``codec``
(``gateway.wire.codec``), every event is translated into that protocol's frames before it is
queued, and the frames queue as plain bytes (``msg=None``: no v1 delta merging applies
to them). Without one (v1) the session's bytes go out as they are.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from gateway.errors import Closing, closing
from gateway.shell.flag import Flag
from gateway.shell.inbox import Inbox
from gateway.shell.outqueue import OutboundQueue
from gateway.wire.codec import BinaryFrame, Codec
from gateway.wire.v1 import Pong, ServerMsg, decode_server

__all__ = [
    "ABORT_SCOPE_KEY",
    "FRAME_WRITER_SCOPE_KEY",
    "Abort",
    "BinaryFrame",
    "Connection",
    "FrameWriter",
    "Socket",
]

log = structlog.get_logger("gateway.connection")

Abort = Callable[[], None]
"""Drops a socket's connection at once, unsent bytes and all."""

ABORT_SCOPE_KEY = "gateway.abort"
"""ASGI scope key under which the gateway's server puts an ``Abort`` for the WebSocket."""


class FrameWriter(Protocol):
    """Writes text frames, each already UTF-8 JSON, in one write to the socket (and binary
    ones, each a ``BinaryFrame``): what the gateway's server offers besides ASGI's one
    ``websocket.send`` (a ``str``, encoded again) per event. Both methods raise once the
    peer is gone."""

    def write_now(self, frames: list[bytes]) -> bool:
        """Write ``frames`` now, unless the socket's buffer is full: then write nothing
        and return ``False``."""

    async def write(self, frames: list[bytes]) -> None:
        """Write ``frames``, first waiting while the socket's buffer is full."""


FRAME_WRITER_SCOPE_KEY = "gateway.frame_writer"
"""ASGI scope key under which the gateway's server puts a ``FrameWriter`` for the WebSocket."""

_BATCH_BYTES = 64 * 2**10
"""At most this many bytes of events go in one write (a long replay goes in several)."""


class Socket(Protocol):
    """What a Connection needs of a WebSocket (Starlette's fits)."""

    async def send_text(self, data: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

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
        frame_writer: FrameWriter | None = None,
        codec: Codec | None = None,
    ) -> None:
        self.device: str | None = None
        """The device this socket is among the session's (``session.created``'s id for the
        one that started it, ``session.attached``'s for one that joined); ``None`` until
        the session took it."""
        self.functions: frozenset[str] | None = None
        """The client functions this device declared: with several devices attached, the
        calls of a function go only to those that declared it (``None``: every call)."""
        self.acked = 0
        """The highest ``seq`` this socket's client acknowledged."""
        self.opened_at = asyncio.get_running_loop().time()
        """When the socket was accepted (loop time), for ``max_socket_age``."""
        self.codec = codec
        """Translates each event into the frames of this socket's wire protocol; ``None``
        for v1. Set it before the first event."""
        self._socket = socket
        self._frames = frame_writer
        self._send_timeout = send_timeout
        self._close_timeout = close_timeout
        self._abort = abort
        self._queue = OutboundQueue(soft_size=soft_size, hard_size=hard_size)
        self._replay: deque[bytes] | None = None
        """Replayed events, ahead of live ones (made when the first comes: see gateway.flag)."""
        self._closing: tuple[int, str] | None = None
        self._flushing = False
        """The close waits for what is queued to go out first."""
        self._gone = False
        """A write failed: the peer is gone, nothing more is written."""
        self.done = Flag()
        """Set once the socket is closed (or given up on)."""
        self.close_requested = Flag()
        """Set as soon as ``close`` is called."""
        self.close_code: int | None = None
        self.pongs_owed = 0
        """Pings read from this socket whose pong is not queued yet (see ``_Reader``)."""
        self.inbox: Inbox[Any] | None = None
        """Frames read from this socket, not yet handed to its session (set by the
        transport's reader; probes and tests read its size)."""
        self._loop = asyncio.get_running_loop()
        self._write_scheduled = False
        """A ``_write_soon`` callback is due."""
        self._writer: asyncio.Task[None] | None = None
        """Writes while the socket pushes back (or without a ``FrameWriter``), until the
        queue is empty: it takes what is queued meanwhile by itself."""
        self._sending_since: float | None = None
        """When the write under way in the writer task started (loop time), if one is."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._send_stalled = False
        self._closer: asyncio.Task[None] | None = None

    @property
    def closing(self) -> bool:
        return self._closing is not None

    @property
    def peer_gone(self) -> bool:
        """The client is gone: a write failed, or its reader saw the end of the socket (a
        resume the client gave up on while the gateway was answering it, say)."""
        return self._gone or (self.inbox is not None and self.inbox.closed)

    @property
    def merged(self) -> int:
        return self._queue.merged

    def send(self, msg: ServerMsg | None, data: bytes) -> None:
        """Queue an event, written at the end of this round of the event loop with the
        others queued meanwhile; never blocks. Over the hard bound the socket closes with
        1013. With a codec, ``msg=None`` sends ``data`` as a frame of its protocol
        already (the codec's own answers)."""
        if self.queue(msg, data):
            self._kick()

    def send_binary(self, frame: BinaryFrame) -> None:
        """Queue a binary frame outside the session's log (the answer's audio), written
        after the events queued before it; under the same bounds as events. With a codec,
        the frames of its protocol that carry that audio."""
        if self.codec is not None:
            self._send_frames(self.codec.encode_audio(frame))
        elif self.queue(None, frame):
            self._kick()

    def send_all(self, sent: list[tuple[ServerMsg, bytes]]) -> None:
        """``send`` each of ``sent``, in one write now when nothing waits before them
        and the socket takes them (the usual case: no queue on the way)."""
        if self.codec is not None:
            self._send_frames(
                [frame for msg, data in sent for frame in self.codec.encode(msg, data)]
            )
            return
        frames = self._frames
        if (
            frames is None
            or self._queue.size  # not len(): a method call, on every write
            or self._replay
            or self._writer is not None
            or self._closing is not None
            or self._gone
        ):
            for msg, data in sent:
                self.queue(msg, data)
            self.flush()
            return
        try:
            written = frames.write_now([data for _, data in sent])
        except Exception as exc:  # whatever the socket raises once the peer is gone
            self._failed(exc)
            return
        if not written:  # the socket pushes back: they wait in the queue
            for msg, data in sent:
                self.queue(msg, data)
            self.flush()
            return
        if self.pongs_owed:
            self.pongs_owed = max(0, self.pongs_owed - sum(type(msg) is Pong for msg, _ in sent))

    def _send_frames(self, frames: list[bytes]) -> None:
        """``send_all`` for frames a codec made: in one write now when nothing waits
        before them, else through the queue."""
        if not frames:
            return
        writer = self._frames
        if (
            writer is not None
            and not self._queue.size
            and not self._replay
            and self._writer is None
            and self._closing is None
            and not self._gone
        ):
            try:
                if writer.write_now(frames):
                    return
            except Exception as exc:  # whatever the socket raises once the peer is gone
                self._failed(exc)
                return
        for frame in frames:
            if not self.queue(None, frame):
                break
        self.flush()

    def queue(self, msg: ServerMsg | None, data: bytes) -> bool:
        """``send`` without the write: the caller calls ``flush`` once it queued all it
        has. ``False`` when the event was dropped (the socket is closing)."""
        if self._closing is not None or self._gone:
            return False
        if self.codec is not None and msg is not None:
            for frame in self.codec.encode(msg, data):
                if not self.queue(None, frame):
                    return False
            return True
        if type(msg) is Pong and self.pongs_owed:
            self.pongs_owed -= 1
        if not self._queue.push(msg, data):
            log.warning("client_too_slow", queued_size=self._queue.size, merged=self._queue.merged)
            self.end(closing("client_too_slow"))
            return False
        return True

    def replay(self, data: bytes) -> None:
        """Queue a replayed (or connection-level) event ahead of live ones.

        Replayed events are the log's own bytes, already bounded by the log, so they
        do not count against the outbound bounds: a long replay cannot overflow.
        """
        if self._closing is None and not self._gone:
            if self._replay is None:
                self._replay = deque()
            if self.codec is None:
                self._replay.append(data)
            else:
                self._replay.extend(self.codec.encode(decode_server(data), data))
            self._kick()

    def end(self, close: Closing, *, flush: bool = False) -> None:
        """``close`` with the code and reason of ``close`` (``gateway.errors``)."""
        self.close(close.code, close.reason, flush=flush)

    def close(self, code: int, reason: str = "", *, flush: bool = False) -> None:
        """Close the socket: after what is queued (``flush``) or at once."""
        if self._closing is not None:
            return
        self._closing = (code, reason)
        self.close_code = code
        self.close_requested.set()
        if flush:
            self._flushing = True
            self._kick()  # what is queued goes out, then the close
            return
        self._queue.clear()
        self._replay = None
        if self._writer is not None:
            self._writer.cancel()
        self._start_closer()

    async def aclose(self) -> None:
        """Stop the tasks; for when the socket is gone already."""
        self._gone = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        tasks = [t for t in (self._writer, self._closer) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.done.set()

    # ----------------------------------------------------------------- writing

    def _kick(self) -> None:
        """Something is queued (or a flushed close is asked for): get it written."""
        if self._writer is None and not self._write_scheduled:
            self._write_scheduled = True
            self._loop.call_soon(self._write_soon)

    def _write_soon(self) -> None:
        self._write_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write what is queued now, in one go, if the socket takes it without waiting
        (else a writer task waits for it)."""
        if self._writer is not None or self._gone or self._closer is not None:
            return
        if self._frames is None:
            self._start_writer(None)
            return
        try:
            while (data := self._next()) is not None:
                batch = self._batch(data)
                if not self._frames.write_now(batch):
                    self._start_writer(batch)  # the socket pushes back: wait for it
                    return
        except Exception as exc:  # whatever the socket raises once the peer is gone
            self._failed(exc)
            return
        if self._flushing:
            self._start_closer()

    def _start_writer(self, batch: list[bytes] | None) -> None:
        self._writer = asyncio.create_task(self._write_loop(batch), name="gateway:writer")

    async def _write_loop(self, batch: list[bytes] | None) -> None:
        """Write ``batch`` and what gets queued meanwhile, then end (once the queue is
        empty, the next event goes out from ``_write_soon`` again)."""
        try:
            try:
                while True:
                    if batch is None:
                        data = self._next()
                        if data is None:
                            break
                        batch = self._batch(data)
                    self._sending_since = self._loop.time()
                    if self._watchdog is None and self._send_timeout is not None:
                        self._watchdog = self._loop.call_later(
                            self._send_timeout, self._check_sends
                        )
                    if self._frames is not None:
                        await self._frames.write(batch)
                    else:
                        for frame in batch:
                            if type(frame) is BinaryFrame:
                                await self._socket.send_bytes(frame)
                            else:
                                await self._socket.send_text(frame.decode())
                    batch = None
            finally:
                self._sending_since = None
        except asyncio.CancelledError:
            if not self._send_stalled:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # our own doing
            self._writer = None
            self._stalled()
            self._start_closer()
            return
        except Exception as exc:
            self._writer = None
            self._failed(exc)
            return
        self._writer = None
        if self._flushing:
            self._start_closer()

    def _failed(self, exc: Exception) -> None:
        log.debug("send_failed", error=type(exc).__name__)
        self._gone = True
        self._queue.clear()
        self._replay = None
        self.done.set()  # the receive loop notices the disconnect too

    def _check_sends(self) -> None:
        """The stall watchdog: cut a write that has waited ``send_timeout``.

        One timer per pushed-back socket, armed by the writer task's first write and
        re-armed while writes go on (not one per write); a socket that takes what it is
        sent has none.
        """
        self._watchdog = None
        since = self._sending_since
        if since is None or self._send_timeout is None or self._writer is None:
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
        """A write waited ``send_timeout``: the client stopped reading; close with 1013."""
        log.warning("client_not_reading", send_timeout=self._send_timeout, queued=self._queue.size)
        if self._closing is None:
            not_reading = closing("not_reading")
            self._closing = (not_reading.code, not_reading.reason)
            self.close_code = not_reading.code
            self.close_requested.set()
        self._queue.clear()
        self._replay = None

    def _next(self) -> bytes | None:
        return self._replay.popleft() if self._replay else self._queue.pop()

    def _batch(self, first: bytes) -> list[bytes]:
        """``first`` and the events ready after it, up to ``_BATCH_BYTES``: one write."""
        batch, size = [first], len(first)
        while size < _BATCH_BYTES and (data := self._next()) is not None:
            batch.append(data)
            size += len(data)
        return batch

    # ----------------------------------------------------------------- closing

    def _start_closer(self) -> None:
        if self._closer is None:
            self._closer = asyncio.create_task(self._close_socket(), name="gateway:closer")

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
