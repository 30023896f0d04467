"""The WebSocket endpoint: frames in and out of a session's Driver.

The transport decodes client frames (validation happens here, at the edge) and
feeds them to the driver. The first frame decides which session the socket
belongs to: ``session.resume`` reattaches a live one, anything else starts a
new one. When the socket goes, the session stays (for ``session_ttl``).

Before that, the socket goes through the handshake every endpoint shares
(``gateway.edge.handshake``: Host and Origin, the ``gateway.v1`` subprotocol, the credential,
the sockets per address), and its new session through the runtime's session quotas. Its
``Reader`` (rate limits, a bounded inbox) reads the OpenAI-compatible endpoint's frames too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from starlette.websockets import WebSocket

from gateway.core.principal import Principal
from gateway.edge.handshake import accept, admit, open_session, refuse, refuse_expired
from gateway.errors import CloseCode, Closing, StoreUnavailable, closing, of_error
from gateway.shell.connection import Connection
from gateway.shell.flag import Flag
from gateway.shell.inbox import Inbox
from gateway.shell.session_queue import Device
from gateway.wire.msgpack import SUBPROTOCOL_MSGPACK, MsgpackCodec
from gateway.wire.v1 import (
    SUBPROTOCOL,
    DecodeFailure,
    Inbound,
    Ping,
    SessionAttach,
    SessionResume,
    decode_client,
)

if TYPE_CHECKING:
    from gateway.shell.driver import Driver
    from gateway.shell.runtime import Runtime

__all__ = ["Decode", "Reader", "close_out", "pump", "reader_for", "realtime_endpoint"]

log = structlog.get_logger("gateway.transport")

Decode = Callable[[str | bytes], list[Inbound | DecodeFailure | bytes]]
"""Reads a text frame of a wire protocol other than v1 into the core messages it stands for
(``gateway.wire.codec``)."""

_PEEK_MAX_CHARS = 4096
"""Frames up to this size are decoded before the rate limit is applied: a ``ping`` among
them may be free, and a refused one's ``id`` is named in the error. Larger frames over the
limit are refused unread, so that refusing costs little."""
_FLOOD_CLOSE_WAIT = 5.0
"""Seconds the driver has to close a flooding socket before the transport does it."""
_FLOODED = DecodeFailure(code="rate_limited", message="message flood")
"""Queued by the reader after the last frame it reads from a flooding client; the socket
then closes with 1008 once the errors before it are sent (never sent itself)."""
BINARY_REFUSED = DecodeFailure(
    code="invalid_message", message="binary frames are not supported; send JSON text frames"
)
_AUDIO_FIRST = DecodeFailure(
    code="invalid_audio", message="audio before session.start: send session.start first"
)
Frame = Inbound | DecodeFailure | bytes
"""What the reader reads: a message, a frame that is not one, or audio (a v1 binary frame)."""


async def realtime_endpoint(websocket: WebSocket) -> None:
    """``GET /v1/realtime``: one session per socket at a time, in JSON (``gateway.v1``) or
    MessagePack (``gateway.v1.msgpack``, when the client offers it)."""
    runtime: Runtime = websocket.app.state.runtime
    offered = websocket.scope.get("subprotocols") or []
    protocol = SUBPROTOCOL_MSGPACK if SUBPROTOCOL_MSGPACK in offered else SUBPROTOCOL
    admitted = await admit(runtime, websocket, protocol=protocol, exclusive=True)
    if admitted is None:
        return
    try:
        await _serve(runtime, websocket, admitted.principal, protocol)
    finally:
        admitted.release()


async def _serve(
    runtime: Runtime, websocket: WebSocket, principal: Principal, protocol: str
) -> None:
    """Accept an admitted socket and run it: its first frame, then its session."""
    conn = await accept(runtime, websocket, protocol)
    if protocol == SUBPROTOCOL_MSGPACK:
        codec = conn.codec = MsgpackCodec()
        reader = reader_for(runtime, websocket, conn, lambda frame: codec.decode(frame).messages)
    else:
        reader = reader_for(runtime, websocket, conn)
    try:
        driver = await _open(runtime, conn, reader, principal)
        if driver is not None:
            # Bound for the rest of this socket's task (it runs in a context of its own),
            # with no context manager held for its whole life.
            structlog.contextvars.bind_contextvars(session_id=driver.session_id)
            log.info("socket_attached", client=str(websocket.client), principal=principal.name)
            timers = _age_limit(runtime, driver, conn)
            try:
                await pump(reader, driver, conn)
            finally:
                for timer in timers:
                    timer.cancel()
            # A client that closes with 1000 is done; any other end may be resumed.
            done = reader.close_code == CloseCode.NORMAL and not conn.closing
            driver.detach(conn, end=done)
            log.info("socket_closed", client_code=reader.close_code, server_code=conn.close_code)
    finally:
        await close_out(reader, conn)


def _age_limit(runtime: Runtime, driver: Driver, conn: Connection) -> list[asyncio.TimerHandle]:
    """With ``max_socket_age``: the timers that give ``conn``'s client notice
    (``session.going_away``, ``going_away_notice`` seconds ahead), then close it with 1013
    at that age; its client resumes on a new socket meanwhile."""
    config = runtime.config
    age = config.max_socket_age
    if age is None:
        return []
    loop = asyncio.get_running_loop()
    notice = min(config.going_away_notice, age)
    left = age - (loop.time() - conn.opened_at)
    aged = closing("max_socket_age")
    return [
        loop.call_later(max(0.0, left - notice), driver.going_away, "max_socket_age", notice, conn),
        loop.call_later(max(0.0, left), driver.close_socket, conn, aged.code, aged.reason),
    ]


def reader_for(
    runtime: Runtime, websocket: WebSocket, conn: Connection, decode: Decode | None = None
) -> Reader:
    """The frame reader of an accepted socket, with this gateway's inbound limits."""
    config = runtime.config
    return Reader(
        websocket,
        conn,
        rate=config.max_messages_per_second,
        burst=config.max_message_burst,
        max_queued=config.max_inbound_queue,
        decode=decode,
    )


async def close_out(reader: Reader, conn: Connection) -> None:
    """The end of a socket's task, however it ended: stop reading, close the socket (1000
    unless a close is under way), wait until it is closed."""
    await reader.aclose()
    if not conn.closing:
        conn.close(closing("done").code)
    await conn.done.wait()
    await conn.aclose()


async def _open(
    runtime: Runtime, conn: Connection, reader: Reader, principal: Principal
) -> Driver | None:
    """Read the first frame and attach the socket to its session."""
    try:
        async with asyncio.timeout(runtime.config.first_message_timeout):
            first = await reader.next()
    except TimeoutError:
        # A socket that says nothing holds resources for nothing (pings keep it alive).
        await refuse(runtime, conn, closing("first_message_timeout"))
        return None
    if first is None:
        return None
    if first is _FLOODED:
        flood = closing("message_flood")
        conn.close(flood.code, flood.reason)
        return None
    if isinstance(first, bytes):
        first = _AUDIO_FIRST
    if isinstance(first, SessionResume | SessionAttach):
        return await _resume(runtime, conn, first, principal)
    if isinstance(first, DecodeFailure) and first.msg_type in _RESUMES:
        # A client that meant to resume must not silently get a new, empty session.
        await refuse(runtime, conn, closing("invalid_resume", first.message))
        return None
    return await open_session(runtime, conn, principal, first)


_RESUMES = frozenset({"session.resume", "session.attach"})
"""The first messages that name a session: one that does not decode opens no new one."""


def _device(msg: SessionResume | SessionAttach) -> Device | None:
    """Who ``msg``'s socket is among the session's devices (``None``: it takes the session
    over whole, as a resume naming no device does)."""
    if isinstance(msg, SessionAttach):
        return Device(None, msg.client_functions)
    if msg.device_id is None:
        return None
    return Device(msg.device_id, msg.client_functions)


async def _resume(
    runtime: Runtime, conn: Connection, msg: SessionResume | SessionAttach, principal: Principal
) -> Driver | None:
    """Attach ``conn`` to the session ``msg`` names (a resume, or a device joining it),
    wherever it was driven: a session
    that left this node meanwhile (another node took its lease, or this one handed it
    over) is taken over again from the store, once; should it move again meanwhile, the
    client is told to resume (1013), never that the session ended.

    A resume whose client is gone by then (it gave up on this socket and resumed on
    another) takes nothing over: it would take the session from the client's live socket.
    """
    moved = False
    for _ in range(2):
        if conn.peer_gone:
            return None
        try:
            found = await runtime.find_session(msg, principal.name)
        except StoreUnavailable as exc:
            await refuse(runtime, conn, of_error(exc))
            return None
        if isinstance(found, Closing):  # refused
            await refuse(runtime, conn, found)
            return None
        if await found.attach(conn, msg.last_seq, _device(msg)):
            return found
        moved = found.moved
        if not moved:
            break
    if moved:
        await refuse(runtime, conn, closing("session_moved"))
    else:
        await refuse_expired(runtime, conn)
    return None


async def pump(reader: Reader, driver: Driver, conn: Connection) -> None:
    """Feed frames to the driver until the socket or the connection ends.

    While the session's queue holds its most client frames, the pump waits for room; the
    reader's inbox fills meanwhile, and then the reader stops reading the socket.
    """

    # Closed by the server (takeover, 1013...): nothing more to read.
    conn.done.on_set(reader.end)

    def feed(message: Frame) -> bool:
        if isinstance(message, bytes) or not driver.client_room.is_set():
            return False  # the pump waits for room, as below; audio may wait too
        driver.feed_client(message, conn)
        return True

    reader.feed_directly(feed)
    while (message := await reader.next()) is not None:
        if isinstance(message, bytes):
            await driver.feed_audio(message)  # waits while the session's audio backlog is full
            continue
        if message is _FLOODED:
            # Closed by the driver, after the rate_limited errors fed before it.
            flood = closing("message_flood")
            driver.close_socket(conn, flood.code, flood.reason)
            try:
                await asyncio.wait_for(conn.close_requested.wait(), _FLOOD_CLOSE_WAIT)
            except TimeoutError:  # the session ended meanwhile: close it here
                conn.close(flood.code, flood.reason)
            return
        if not driver.client_room.is_set():
            await _first(driver.client_room, conn.close_requested, conn.done)
            if conn.closing or conn.done.is_set():
                return  # the socket's unread frames are dropped, as ``reader.end`` does
        driver.feed_client(message, conn)


async def _first(*events: Flag) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class _TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second of ``clock``; a frame takes one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = self._burst
        self._at = clock()

    def refund(self) -> None:
        """Give back the token a frame took (it was not the kind the rate bounds)."""
        self._tokens = min(self._burst, self._tokens + 1.0)

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Reader:
    """Reads a socket's frames, decoded, into a bounded inbox; ``None`` marks the end.

    With ``max_queued`` frames unread the reader waits for room and reads nothing meanwhile
    (nor does the server: the client's sends block on TCP), rather than grow the queue.

    Nothing a client sends can end the reader: every frame becomes a message or a
    ``DecodeFailure``. Frames over the socket's rate limit (a ping sent after the previous
    pong is free) are dropped with ``error rate_limited``, and a client that goes on
    sending ``burst`` more of them in a row is closed with 1008. Should the reader fail
    anyway (our bug), the socket closes
    with 1011 and the exception is logged.

    ``decode`` reads the frames of another wire protocol (``gateway.wire.codec``) instead of
    v1's: see ``_take``.
    """

    def __init__(
        self,
        websocket: WebSocket,
        conn: Connection,
        *,
        rate: float | None,
        burst: int | None,
        max_queued: int,
        decode: Decode | None = None,
    ) -> None:
        self._websocket = websocket
        self._decode = decode
        self._conn = conn
        self._inbox: Inbox[Frame] = Inbox(max_queued)
        conn.inbox = self._inbox
        self._bucket = (
            _TokenBucket(rate, burst, asyncio.get_running_loop().time)
            if rate is not None and burst is not None
            else None
        )
        self._flood_after = burst or 0
        self._refused_in_a_row = 0
        self._feed: Callable[[Frame], bool] | None = None
        self._waiting = False
        """``next`` waits on an empty inbox: its caller holds no frame."""
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
                if text is None and self._decode is None and message.get("bytes") is not None:
                    # Audio: bounded by the session's own audio limits, not by the frame rate.
                    if not await self._inbox.put(message["bytes"]):
                        return
                    continue
                if self._decode is not None:
                    frame = text if text is not None else message.get("bytes") or b""
                    if not await self._take(frame, self._decode):
                        return
                    continue
                peeked = (
                    decode_client(text)
                    if text is not None and len(text) <= _PEEK_MAX_CHARS
                    else None
                )
                # A ping sent after the previous one's pong (a latency probe, a keepalive)
                # is free: such a client waits a round trip per ping. Pipelined pings, and
                # every other frame, count against the rate.
                free = isinstance(peeked, Ping) and self._conn.pongs_owed == 0
                if self._bucket is not None and not free and not self._bucket.take():
                    if not await self._refuse(peeked):
                        return
                    continue
                if isinstance(peeked, Ping):
                    self._conn.pongs_owed += 1
                if not free:  # a free ping between refused frames does not end a flood
                    self._refused_in_a_row = 0
                if peeked is None:
                    peeked = BINARY_REFUSED if text is None else decode_client(text)
                if (
                    self._feed is not None
                    and self._waiting
                    and not self._inbox
                    and self._feed(peeked)
                ):
                    continue  # straight to the session: the pump holds nothing before it
                if not await self._inbox.put(peeked):
                    return  # ended by the server meanwhile
        except Exception:
            log.exception("frame_reader_failed")
            self._conn.close(closing("internal").code)  # our bug: no reason text
        finally:
            self._inbox.close()

    async def _take(self, frame: str | bytes, decode: Decode) -> bool:
        """Read a frame of a codec's protocol; ``False`` once the reader is to stop.

        A codec keeps state, so a frame is decoded only once it is admitted (no peek: a
        refused frame's error names no id), and it may stand for any number of messages
        (none, say, for a user item the codec keeps until ``response.create``).
        """
        if self._bucket is not None and not self._bucket.take():
            return await self._refuse(None)
        self._refused_in_a_row = 0
        items = decode(frame)
        if self._bucket is not None and items and all(type(i) is bytes for i in items):
            # Audio (an append): bounded by the session's audio limits, as v1's binary
            # frames are, not by the frame rate.
            self._bucket.refund()
        for item in items:
            if self._feed is not None and self._waiting and not self._inbox and self._feed(item):
                continue
            if not await self._inbox.put(item):
                return False  # ended by the server meanwhile
        return True

    async def _refuse(self, peeked: Inbound | DecodeFailure | None) -> bool:
        """Answer a frame over the rate limit; ``False`` once the client floods (or the
        reader was ended meanwhile)."""
        self._refused_in_a_row += 1
        if self._refused_in_a_row > self._flood_after:
            log.warning("message_flood_closed", refused=self._refused_in_a_row)
            self._inbox.close(_FLOODED)  # the last item: the end of a flood needs no room
            return False
        in_reply_to = peeked.in_reply_to if isinstance(peeked, DecodeFailure) else None
        if peeked is not None and not isinstance(peeked, DecodeFailure):
            in_reply_to = peeked.id
        return await self._inbox.put(
            DecodeFailure(
                code="rate_limited",
                message="too many messages per second: this one was dropped",
                in_reply_to=in_reply_to,
                retryable=True,
            )
        )

    def end(self) -> None:
        """Drop what is unread: ``next`` returns ``None`` from now on."""
        self._inbox.drop()

    def feed_directly(self, feed: Callable[[Frame], bool]) -> None:
        """From now on, hand a frame read while ``next``'s caller waits on an empty inbox
        to ``feed`` instead, unless it returns ``False`` (no room: the frame goes to the
        inbox). Saves a hop between tasks per frame: a ping's pong is a round trip."""
        self._feed = feed

    async def next(self) -> Frame | None:
        """The next frame, or ``None`` once the socket is gone (for good)."""
        self._waiting = True
        try:
            return await self._inbox.get()
        finally:
            self._waiting = False

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
