"""The WebSocket endpoint: frames in and out of a session's Driver.

The transport decodes client frames (validation happens here, at the edge) and
feeds them to the driver. The first frame decides which session the socket
belongs to: ``session.resume`` reattaches a live one, anything else starts a
new one. When the socket goes, the session stays (for ``session_ttl``).

Admission happens here too: at most ``max_sockets_per_ip`` open sockets per client
address (the address a trusted proxy forwards, see ``forwarded_allow_ips``), and the
runtime's session quotas at ``session.start``. Every refusal goes through ``_refuse``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from starlette.websockets import WebSocket, WebSocketState

from gateway.connection import ABORT_SCOPE_KEY, Connection
from gateway.errors import CloseCode, TooManySessions
from gateway.protocol import SUBPROTOCOL, DecodeFailure, Inbound, SessionResume, decode_client

if TYPE_CHECKING:
    from gateway.app import Runtime
    from gateway.driver import Driver

__all__ = ["realtime_endpoint"]

log = structlog.get_logger("gateway.transport")

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
    if websocket.client is None:  # a Unix socket: no address to count by
        await _serve(runtime, websocket)
        return
    address = websocket.client.host
    if not runtime.sockets.acquire(address):
        reason = "too many sockets from this address"
        await _refuse(runtime, websocket, CloseCode.TRY_AGAIN, reason, label="too_many_sockets")
        return
    try:
        await _serve(runtime, websocket)
    finally:
        runtime.sockets.release(address)


async def _serve(runtime: Runtime, websocket: WebSocket) -> None:
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if offered else None)
    conn = runtime.connection(websocket, abort=websocket.scope.get(ABORT_SCOPE_KEY))
    reader = _Reader(websocket)
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
    try:
        driver = await runtime.start_session()
    except TooManySessions as exc:
        await _refuse(runtime, conn, exc.close_code, str(exc), label=exc.label)
        return None
    driver.attach(conn)
    driver.feed(first)
    return driver


async def _refuse(
    runtime: Runtime,
    websocket_or_conn: WebSocket | Connection,
    code: CloseCode,
    reason: str,
    *,
    label: str,
) -> None:
    """Refuse a socket with ``code`` and ``reason``: logged and counted by ``label``.

    Every refused WebSocket goes through here. A socket not yet accepted is accepted
    first (with the subprotocol it asked for), since only an open socket can carry a
    close code and reason; an HTTP 403 would tell the client nothing.
    """
    log.info("connection_refused", label=label, close_code=int(code))
    runtime.note_refusal(label)
    if isinstance(websocket_or_conn, Connection):
        websocket_or_conn.close(code, reason)
        return
    websocket = websocket_or_conn
    if websocket.application_state is WebSocketState.CONNECTING:
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    await websocket.close(code, reason)


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


class _Reader:
    """Reads a socket's frames, decoded, into a queue; ``None`` marks the end."""

    def __init__(self, websocket: WebSocket) -> None:
        self._websocket = websocket
        self._queue: asyncio.Queue[Inbound | DecodeFailure | None] = asyncio.Queue()
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
                text = message.get("text")
                self._queue.put_nowait(_BINARY if text is None else decode_client(text))
        finally:
            self._queue.put_nowait(None)

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
