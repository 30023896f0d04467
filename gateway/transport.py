"""The WebSocket endpoint: frames in and out of a session's Driver.

The transport decodes client frames (validation happens here, at the edge) and
feeds them to the driver. The first frame decides which session the socket
belongs to: ``session.resume`` reattaches a live one, anything else starts a
new one. When the socket goes, the session stays (for ``session_ttl``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from starlette.websockets import WebSocket

from gateway.connection import Connection
from gateway.errors import CloseCode
from gateway.protocol import (
    SUBPROTOCOL,
    DecodeFailure,
    Inbound,
    SessionResume,
    decode_client,
    frame_id,
)

if TYPE_CHECKING:
    from gateway.app import Runtime
    from gateway.driver import Driver

__all__ = ["realtime_endpoint"]

log = structlog.get_logger("gateway.transport")

_ID_SCAN_MAX_CHARS = 4096
"""Largest refused frame whose ``id`` is read for the ``rate_limited`` error."""
_BINARY = DecodeFailure(
    code="invalid_message", message="binary frames are not supported; send JSON text frames"
)


async def realtime_endpoint(websocket: WebSocket) -> None:
    """``GET /v1/realtime``: one session per socket at a time."""
    runtime: Runtime = websocket.app.state.runtime
    offered = websocket.scope.get("subprotocols") or []
    if offered and SUBPROTOCOL not in offered:
        # A client asking only for other protocols (say a future gateway.v2) must not be
        # served v1 by surprise; closing before accept refuses the handshake (HTTP 403).
        log.info("subprotocol_refused", offered=offered[:4])
        await websocket.close(code=CloseCode.POLICY)
        return
    if runtime.closing:
        await websocket.close(code=CloseCode.SERVICE_RESTART)
        return
    await websocket.accept(subprotocol=SUBPROTOCOL if offered else None)
    conn = runtime.connection(websocket)
    reader = _Reader(
        websocket,
        conn,
        rate=runtime.config.max_messages_per_second,
        burst=runtime.config.max_message_burst,
    )
    try:
        driver = await _open(runtime, conn, reader)
        if driver is not None:
            with structlog.contextvars.bound_contextvars(session_id=driver.session_id):
                log.info("socket_attached", client=str(websocket.client))
                await _pump(reader, driver, conn)
                # A client that closes with 1000 is done; any other end may be resumed.
                done = reader.close_code == CloseCode.NORMAL and not conn.closing
                driver.detach(conn, end=done)
                log.info(
                    "socket_closed", client_code=reader.close_code, server_code=conn.close_code
                )
    finally:
        await reader.aclose()
        if not conn.closing:
            conn.close(CloseCode.NORMAL)
        await conn.done.wait()
        await conn.aclose()


async def _open(runtime: Runtime, conn: Connection, reader: _Reader) -> Driver | None:
    """Read the first frame and attach the socket to its session."""
    try:
        async with asyncio.timeout(runtime.config.first_message_timeout):
            first = await reader.next()
    except TimeoutError:
        # A socket that says nothing holds resources for nothing (pings keep it alive).
        log.info("first_message_timeout")
        conn.close(CloseCode.POLICY, "no session.start or session.resume in time")
        return None
    if first is None:
        return None
    if isinstance(first, SessionResume):
        found = await runtime.find_session(first)
        if isinstance(found, CloseCode):
            log.info("resume_refused", close_code=int(found))
            conn.close(found, _REFUSALS[found])
            return None
        found.attach(conn, first.last_seq)
        return found
    driver = await runtime.start_session()
    driver.attach(conn)
    driver.feed(first)
    return driver


_REFUSALS = {
    CloseCode.UNAUTHORIZED: "wrong resume token",
    CloseCode.UNKNOWN_SESSION: "unknown session",
    CloseCode.SESSION_EXPIRED: "session ended or expired",
}


async def _pump(reader: _Reader, driver: Driver, conn: Connection) -> None:
    """Feed frames to the driver until the socket or the connection ends."""

    async def end_when_closed() -> None:
        await conn.done.wait()
        reader.end()  # closed by the server (takeover, 1013...): nothing more to read

    watcher = asyncio.create_task(end_when_closed())
    try:
        while (message := await reader.next()) is not None:
            driver.feed(message)
    finally:
        watcher.cancel()


class _TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second of ``clock``; a frame takes one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = self._burst
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class _Reader:
    """Reads a socket's frames, decoded, into a queue; ``None`` marks the end.

    Nothing a client sends can end the reader: every frame becomes a message or a
    ``DecodeFailure``. Frames over the socket's rate limit are not decoded; they get
    ``error rate_limited``, and a client that goes on sending ``burst`` more of them in a
    row is closed with 1008. Should the reader fail anyway (our bug), the socket closes
    with 1011 and the exception is logged.
    """

    def __init__(
        self, websocket: WebSocket, conn: Connection, *, rate: float | None, burst: int | None
    ) -> None:
        self._websocket = websocket
        self._conn = conn
        self._queue: asyncio.Queue[Inbound | DecodeFailure | None] = asyncio.Queue()
        self._bucket = (
            _TokenBucket(rate, burst, asyncio.get_running_loop().time)
            if rate is not None and burst is not None
            else None
        )
        self._flood_after = burst or 0
        self._refused_in_a_row = 0
        self._task = asyncio.create_task(self._read(), name="gateway:receive")
        self.close_code: int | None = None
        """The close code the client sent, once it is gone."""

    async def _read(self) -> None:
        try:
            while True:
                message = await self._websocket.receive()
                if message["type"] == "websocket.disconnect":
                    self.close_code = message.get("code")
                    return
                if self._bucket is not None and not self._bucket.take():
                    if not self._refuse(message.get("text")):
                        return
                    continue
                self._refused_in_a_row = 0
                text = message.get("text")
                self._queue.put_nowait(_BINARY if text is None else decode_client(text))
        except Exception:
            log.exception("frame_reader_failed")
            self._conn.close(CloseCode.INTERNAL)  # our bug: no reason text
        finally:
            self._queue.put_nowait(None)

    def _refuse(self, text: str | None) -> bool:
        """Answer a frame over the rate limit unread; ``False`` once the client floods."""
        self._refused_in_a_row += 1
        if self._refused_in_a_row > self._flood_after:
            log.warning("message_flood_closed", refused=self._refused_in_a_row)
            self._conn.close(CloseCode.POLICY, "message flood")
            return False
        self._queue.put_nowait(
            DecodeFailure(
                code="rate_limited",
                message="too many messages per second: this one was dropped",
                # Reading the id parses the frame: worth it for small frames only, since
                # a refused frame must cost little.
                in_reply_to=frame_id(text) if text and len(text) <= _ID_SCAN_MAX_CHARS else None,
                retryable=True,
            )
        )
        return True

    def end(self) -> None:
        """Drop what is unread: ``next`` returns ``None`` from now on."""
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def next(self) -> Inbound | DecodeFailure | None:
        """The next frame, or ``None`` once the socket is gone (for good)."""
        message = await self._queue.get()
        if message is None:
            self._queue.put_nowait(None)
        return message

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
