"""The HTTP/1.1 client under the model providers: an asyncio protocol with httptools.

A model's answer is a long response whose body comes an event at a time, each in an HTTP
chunk of its own; at a thousand conversations the gateway reads twenty thousand of them a
second on one core. httpx over aiohttp handed each chunk through a future, three layers of
async generators and a task switch (some 28 µs a delta of the 51 the gateway spent,
docs/performance.md). Here the socket's bytes go from the protocol's ``data_received``
through llhttp (httptools, in C) to the reader's ``data`` in the same callback: no task,
no future, no copy per chunk.

``HttpClient.post`` sends a request and returns its ``Exchange`` once the response's head
is in (status and headers); ``Exchange.read`` hands the body to a ``BodyReader`` as it
comes. Connections are kept alive and pooled per client (one per event loop, as a provider
keeps it), at most ``max_connections`` open, and used again for ``KEEP_IDLE`` seconds at
most; one whose response was read to its end goes back to the pool on ``Exchange.close``,
any other is dropped at once, so the model server sees the request end. A request that
finds its kept-alive connection closed by the server before any byte of the answer is sent
once more on a new one, as browsers do.

Failures are ``HttpError``s: ``ConnectFailed`` (the OS error as its cause),
``ConnectTimeout`` and ``ConnectionBroke``. The providers know nothing else of this module
but ``HttpClient``, ``Exchange`` and ``BodyReader``: the seam stays small, so the client
can be swapped (docs/performance.md says how the alternatives measured).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from typing import Protocol, cast
from urllib.parse import urlsplit

import certifi
import httptools

__all__ = [
    "BodyReader",
    "ConnectFailed",
    "ConnectTimeout",
    "ConnectionBroke",
    "Exchange",
    "HttpClient",
    "HttpError",
]

USER_AGENT = "conversation-gateway"
MAX_HEAD_BYTES = 64 * 1024
"""The most an answer's status line and headers may take (a server that never ends them
fails the request rather than fill the memory)."""
KEEP_IDLE = 15.0
"""Seconds an idle connection is used again; an older one is closed instead when next
picked (a server, a proxy or a NAT may have dropped it silently, and the request would
wait for its first byte in vain)."""


class HttpError(Exception):
    """A request that got no whole answer."""


class ConnectFailed(HttpError):
    """No connection to the server (the ``OSError`` is the cause)."""


class ConnectTimeout(HttpError):
    """No connection within the connect timeout (pooled or new)."""


class ConnectionBroke(HttpError):
    """The connection closed, or the server sent what is not HTTP, before the answer's end."""


class BodyReader(Protocol):
    """Takes a response body as it arrives (called from the connection's callbacks)."""

    def data(self, chunk: bytes) -> None: ...

    def end(self) -> None:
        """The body is whole."""

    def fail(self, error: HttpError) -> None:
        """The body will not be whole."""


_Key = tuple[str, str, int]
"""A pool's key: scheme, host, port."""


class HttpClient:
    """Pooled HTTP/1.1 connections (see the module docstring).

    Args:
        max_connections: connections open at once; a request beyond waits for one.
        connect_timeout: seconds to get a connection (from the pool or a new one).
        tls: how HTTPS servers are checked; by default against certifi's certificate
            store (httpx's, before: the same servers are trusted).
    """

    def __init__(
        self,
        *,
        max_connections: int,
        connect_timeout: float | None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._max = max_connections
        self._connect_timeout = connect_timeout
        self._idle: dict[_Key, list[_Connection]] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls = tls
        self.is_closed = False

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Exchange:
        """Send a POST of ``body`` and return its exchange once the answer's head is in.

        ``headers`` are sent as given after the client's own (host, length, agent); a
        name or value with a line break is refused (``ValueError``). Cancelling the call
        drops the connection."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        default_port = 443 if scheme == "https" else 80
        port = parts.port or default_port
        host = parts.hostname
        authority = host if port == default_port else f"{host}:{port}"
        if ":" in host:  # IPv6
            authority = f"[{host}]" if port == default_port else f"[{host}]:{port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = _request_bytes(target, authority, headers, body)
        key = (scheme, host, port)
        for fresh in (False, True):
            connection = await self._connection(key, fresh=fresh)
            exchange = connection.send(request)
            try:
                await exchange.head
            except ConnectionBroke:
                # A kept-alive connection the server closed as the request went out: no
                # byte of the answer came, so the server did not take the request.
                if connection.reused and not exchange.answered:
                    continue
                raise
            except BaseException:
                exchange.close()  # cancelled, or timed out by the caller: drop it
                raise
            return exchange
        raise ConnectionBroke("the server closed the connection before answering")

    async def aclose(self) -> None:
        """Close every connection; the client takes no more requests."""
        self.is_closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.drop()
        self._idle.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _connection(self, key: _Key, *, fresh: bool) -> _Connection:
        """An idle connection to ``key`` (unless ``fresh``), else a new one within the
        connect timeout."""
        if self.is_closed:
            raise ConnectFailed("the client is closed")
        try:
            async with asyncio.timeout(self._connect_timeout):
                while True:
                    connection = None if fresh else self._pooled(key)
                    if connection is not None:
                        return connection
                    if self._open < self._max or self._close_one_idle():
                        break
                    waiter = asyncio.get_running_loop().create_future()
                    self._waiters.append(waiter)
                    try:
                        await waiter
                    finally:
                        if waiter in self._waiters:
                            self._waiters.remove(waiter)
                    if self.is_closed:
                        raise ConnectFailed("the client is closed")
                self._open += 1
                try:
                    return await self._connect(key)
                except BaseException:
                    self._closed()
                    raise
        except TimeoutError as exc:
            raise ConnectTimeout("no connection within the connect timeout") from exc

    def _pooled(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if connection.lost:
                continue
            if now - connection.idle_since > KEEP_IDLE:
                connection.drop()  # its slot is freed as it goes
                continue
            return connection
        return None

    def _close_one_idle(self) -> bool:
        """Close an idle connection to another server to make room (its slot is taken
        over, so the count stays)."""
        for connections in self._idle.values():
            while connections:
                connection = connections.pop()
                if not connection.lost:
                    connection.counted = False
                    self._open -= 1
                    connection.drop()
                    return True
        return False

    async def _connect(self, key: _Key) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context(cafile=certifi.where())
            tls = self._tls
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(self, key),
                host,
                port,
                ssl=tls,
                server_hostname=host if tls else None,
            )
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        if connection.lost:
            raise ConnectionBroke("the server closed the connection as it opened")
        connection.counted = True
        return connection

    def _give_back(self, connection: _Connection) -> None:
        """A connection whose answer was read whole: idle, for the next request."""
        if self.is_closed:
            connection.drop()
            return
        self._idle.setdefault(connection.key, []).append(connection)
        self._wake()

    def _closed(self) -> None:
        """A connection of the count is gone: room for a waiting request."""
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _request_bytes(target: str, authority: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [
        f"POST {target} HTTP/1.1",
        f"host: {authority}",
        f"user-agent: {USER_AGENT}",
        "accept: text/event-stream",
        "accept-encoding: identity",
        f"content-length: {len(body)}",
    ]
    if "content-type" not in (name.lower() for name in headers):
        lines.append("content-type: application/json")
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0") or ":" in name:
            raise ValueError(f"the header {name!r} has a line break or a colon")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One kept-alive connection, serving one exchange at a time."""

    def __init__(self, client: HttpClient, key: _Key) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.lost = False
        self.reused = False
        """It served an answer before this one."""
        self.counted = False
        """It counts in the client's open connections (from its connect until it is gone)."""
        self.paused = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport's subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes) -> Exchange:
        assert self.transport is not None
        exchange = Exchange(self)
        if self.lost:  # closed by the server as it was handed over
            exchange.lost(None)
            return exchange
        self.exchange = exchange
        self.transport.write(request)
        return exchange

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            self.drop()  # an answer nobody asked for: the connection is not usable
            return
        exchange.feed(data)

    def eof_received(self) -> bool | None:
        return False  # close the transport (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.counted:
            self.counted = False
            self.client._closed()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.lost(exc)

    def finished(self, exchange: Exchange, keep: bool) -> None:
        """The exchange is closed: keep the connection for the next request, or drop it."""
        if self.exchange is not exchange:
            return
        self.exchange = None
        if keep and not self.lost:
            self.reused = True
            self.idle_since = asyncio.get_running_loop().time()
            self.client._give_back(self)
        else:
            self.drop()

    def reading(self, on: bool) -> None:
        """Read the socket, or stop (the reader of the answer has no room)."""
        transport = self.transport
        if transport is None or self.lost or on is not self.paused or transport.is_closing():
            return
        self.paused = not on
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def drop(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abort()


class Exchange:
    """One request and its answer: ``status`` and ``headers`` (names in lower case) once
    ``head`` is done; then the body, read by ``read``."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self._parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.answered = False
        """A byte of the answer came."""
        self.complete = False
        """The body came whole."""
        self._reader: BodyReader | None = None
        self._early: list[bytes] = []
        """Body bytes that came before a reader was set."""
        self._failure: HttpError | None = None
        self._ends_at_close = False
        self._keep_alive = False
        self._head_size = 0
        self._inflate: zlib._Decompress | None = None
        self._closed = False

    # What the owner calls.

    def read(self, reader: BodyReader) -> None:
        """Hand the body to ``reader``: what came already at once, the rest as it comes."""
        self._reader = reader
        early, self._early = self._early, []
        for chunk in early:
            reader.data(chunk)
        if self.complete:
            reader.end()
        elif self._failure is not None:
            reader.fail(self._failure)

    def pause(self) -> None:
        """Stop reading the socket (the reader has no room); ``resume`` goes on."""
        if not self._closed:
            self._connection.reading(False)

    def resume(self) -> None:
        if not self._closed:
            self._connection.reading(True)

    def close(self) -> None:
        """Done with the exchange: a whole answer's connection goes back to the pool, any
        other is dropped (the server sees the request end)."""
        if self._closed:
            return
        self._closed = True
        self._reader = None
        if not self.head.done():
            self.head.cancel()  # nobody waits for it any more
        keep = self.complete and self._keep_alive
        if keep:
            self._connection.reading(True)  # it may have been paused
        self._connection.finished(self, keep)

    # What the connection calls.

    def feed(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broke(ConnectionBroke("the server switched protocols"))
        except httptools.HttpParserError as exc:
            self._broke(ConnectionBroke(f"the server sent a malformed HTTP answer ({exc})"))
            return
        if not self.head.done():  # llhttp bounds no head: this client does
            self._head_size += len(data)
            if self._head_size > MAX_HEAD_BYTES:
                self._broke(ConnectionBroke(f"the server sent a head over {MAX_HEAD_BYTES} bytes"))

    def lost(self, exc: Exception | None) -> None:
        if self.complete:
            return
        if self.head.done() and self._ends_at_close and exc is None:
            self.on_message_complete()  # a body without a length ends with the connection
            return
        cause = f" ({exc})" if exc is not None else ""
        if self.head.done():
            error = ConnectionBroke(f"the server closed the connection mid-answer{cause}")
        else:
            error = ConnectionBroke(f"the server closed the connection before answering{cause}")
        error.__cause__ = exc
        self._broke(error)

    def _broke(self, error: HttpError) -> None:
        if self._failure is not None or self.complete:
            return
        self._failure = error
        self._connection.drop()
        if not self.head.done():
            self.head.set_exception(error)
        elif self._reader is not None:
            self._reader.fail(error)

    # httptools' callbacks (from inside ``feed_data``).

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            self.headers.clear()
            return
        headers = self.headers
        # Read now: llhttp forgets it once the message is complete.
        self._keep_alive = self._parser.should_keep_alive()
        self._ends_at_close = (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding in ("gzip", "deflate"):  # asked for none; some servers send it anyway
            self._inflate = zlib.decompressobj(47)  # zlib or gzip, by the header
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._failure is not None:
            return  # the rest of a read after a failure within it
        if self._inflate is not None:
            try:
                body = self._inflate.decompress(body)
            except zlib.error as exc:
                self._broke(
                    ConnectionBroke(f"the server sent a body that does not inflate ({exc})")
                )
                return
            if not body:
                return
        reader = self._reader
        if reader is not None:
            reader.data(body)
        elif not self._closed:
            self._early.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200 or self._failure is not None:
            return
        if self._inflate is not None and not self._inflate.eof:
            self._broke(ConnectionBroke("the server sent a compressed body cut short"))
            return
        self.complete = True
        reader = self._reader
        if reader is not None:
            reader.end()
