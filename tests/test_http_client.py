"""The providers' HTTP/1.1 client (``gateway/providers/wire.py``) against hand-written servers.

Each test runs a raw-socket server in its own event loop on a free port and writes the
answer's bytes by hand, so it can send what real model servers send now and then: a body
ended by the close, gzip though identity was asked, an interim 100, a connection closed
between two requests or in the middle of a body, or no HTTP at all. Every test runs on
asyncio's loop and once more on uvloop's (``test_on_uvloop``), which production uses.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import gzip
import socket
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import trustme
import uvloop

from gateway.providers import wire
from gateway.providers.failure import transport_cause
from gateway.providers.wire import (
    ConnectFailed,
    ConnectionBroke,
    ConnectTimeout,
    Exchange,
    HttpClient,
    HttpError,
)

T = TypeVar("T")

WAIT = 10.0
"""Seconds any awaited event may take before the test fails (all come in milliseconds)."""


async def soon(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(WAIT):
        return await awaitable


# The server.


@dataclass
class Request:
    line: str
    headers: dict[str, str]
    body: bytes
    peer: int
    """The number of the connection it came on (0 for the first the server accepted)."""


@dataclass
class Peer:
    """One connection the server accepted."""

    number: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    server: RawServer

    async def request(self) -> Request | None:
        """The next request on this connection, or None when the client closed it."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        line, *lines = head.decode("latin-1").split("\r\n")[:-2]
        headers = {}
        for header in lines:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        request = Request(line, headers, body, self.number)
        self.server.requests.append(request)
        return request

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def gone(self) -> None:
        """Wait until the client closes or drops the connection (the server sees EOF)."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass


Handler = Callable[[Peer], Awaitable[None]]


@dataclass
class RawServer:
    url: str = ""
    peers: list[Peer] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    """What a handler raised: re-raised when the test ends (the loop would only log it)."""


@asynccontextmanager
async def raw_server(
    handler: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    """A server on 127.0.0.1 and a free port (HTTPS with ``tls``); ``handler`` serves each
    connection, which is closed when it returns."""
    server = RawServer()
    tasks: set[asyncio.Task[Any]] = set()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        peer = Peer(len(server.peers), reader, writer, server)
        server.peers.append(peer)
        try:
            await handler(peer)
        except ConnectionError:
            pass  # the client dropped the connection: some tests do it on purpose
        except Exception as exc:
            server.errors.append(exc)
        finally:
            writer.close()
            tasks.discard(task)

    listening = await asyncio.start_server(accepted, "127.0.0.1", 0, ssl=tls)
    port = listening.sockets[0].getsockname()[1]
    scheme = "https" if tls else "http"
    server.url = f"{scheme}://127.0.0.1:{port}/v1/chat?stream=1"
    try:
        yield server
    finally:
        listening.close()
        # Not cancelled (Python 3.11's streams log a cancelled handler as an error): the
        # handlers see their connection closed and return.
        for peer in server.peers:
            peer.writer.transport.abort()
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*tasks, return_exceptions=True)
        await listening.wait_closed()
    if server.errors:
        raise server.errors[0]


@asynccontextmanager
async def http_client(
    max_connections: int = 4,
    connect_timeout: float | None = WAIT,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[HttpClient]:
    client = HttpClient(max_connections=max_connections, connect_timeout=connect_timeout, tls=tls)
    try:
        yield client
    finally:
        await client.aclose()


def sized(body: bytes, *headers: str) -> bytes:
    """An answer with a content-length."""
    head = ["HTTP/1.1 200 OK", "content-type: text/event-stream", f"content-length: {len(body)}"]
    return ("\r\n".join([*head, *headers]) + "\r\n\r\n").encode() + body


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunks(*pieces: bytes) -> bytes:
    """``pieces`` as HTTP chunks, with the last (empty) chunk."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def answer_each(*bodies: bytes) -> Handler:
    """A handler that answers every request of its connection with the next body."""
    left = list(bodies)

    async def handler(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(sized(left.pop(0)))

    return handler


# The client's side.


class Body:
    """A ``BodyReader`` that keeps what it is given and in what order."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.calls: list[str] = []
        """``end`` and ``fail``, as they were called."""
        self.failure: HttpError | None = None
        self.done = asyncio.Event()

    def data(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)

    def end(self) -> None:
        self.calls.append("end")
        self.done.set()

    def fail(self, error: HttpError) -> None:
        self.calls.append("fail")
        self.failure = error
        self.done.set()

    @property
    def bytes(self) -> bytes:
        return b"".join(self.chunks)


async def read_whole(exchange: Exchange) -> bytes:
    """The body, which must come whole (``end`` called once, ``fail`` never)."""
    body = Body()
    exchange.read(body)
    await soon(body.done.wait())
    assert body.calls == ["end"], body.failure
    return body.bytes


async def read_through(client: HttpClient, url: str) -> Body:
    """Post, read the answer however it ends, and close the exchange: what the reader saw."""
    exchange = await soon(client.post(url, {}, b"{}"))
    body = Body()
    exchange.read(body)
    await soon(body.done.wait())
    exchange.close()
    return body


async def fetch(client: HttpClient, url: str, body: bytes = b"{}") -> bytes:
    """Post, read the answer whole and give the connection back."""
    exchange = await soon(client.post(url, {}, body))
    try:
        assert exchange.status == 200
        return await read_whole(exchange)
    finally:
        exchange.close()


# 0. HTTPS.


@pytest.fixture(scope="module")
def test_ca() -> trustme.CA:
    return trustme.CA()


async def test_an_https_answer_is_read_whole_on_a_kept_connection(test_ca: trustme.CA) -> None:
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    test_ca.issue_cert("127.0.0.1").configure_cert(served)
    trusted = ssl.create_default_context()
    test_ca.configure_trust(trusted)
    async with (
        raw_server(answer_each(b"one", b"two"), tls=served) as server,
        http_client(tls=trusted) as client,
    ):
        assert await fetch(client, server.url) == b"one"
        assert await fetch(client, server.url) == b"two"
    assert len(server.peers) == 1


async def test_a_certificate_the_store_does_not_trust_is_refused(test_ca: trustme.CA) -> None:
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    test_ca.issue_cert("127.0.0.1").configure_cert(served)
    async with raw_server(answer_each(b"never"), tls=served) as server, http_client() as client:
        with pytest.raises(ConnectFailed) as failed:
            await soon(client.post(server.url, {}, b"{}"))
    assert isinstance(failed.value.__cause__, ssl.SSLCertVerificationError)
    assert transport_cause(failed.value) == "TLS failed (certificate verify failed)"


# 1. Chunked, kept alive.


async def test_a_chunked_answer_is_read_whole_and_its_connection_serves_the_next() -> None:
    async def handler(peer: Peer) -> None:
        while (request := await peer.request()) is not None:
            events = [b"data: %s\n\n" % word for word in request.body.split()]
            await peer.send(CHUNKED_HEAD)
            for event in events:  # one chunk, one write each, as a model server streams
                await peer.send(chunks(event)[:-5])
            await peer.send(b"0\r\n\r\n")

    async with raw_server(handler) as server, http_client() as client:
        for words in (b"one two", b"three"):
            exchange = await soon(client.post(server.url, {"authorization": "Bearer k"}, words))
            assert exchange.status == 200
            assert exchange.headers["transfer-encoding"] == "chunked"
            assert exchange.headers["content-type"] == "text/event-stream"
            expected = b"".join(b"data: %s\n\n" % word for word in words.split())
            assert await read_whole(exchange) == expected
            exchange.close()

    assert len(server.peers) == 1
    assert [r.peer for r in server.requests] == [0, 0]
    first = server.requests[0]
    assert first.line == "POST /v1/chat?stream=1 HTTP/1.1"
    assert first.headers["host"] == server.url.split("/")[2]
    assert first.headers["authorization"] == "Bearer k"
    assert first.headers["content-type"] == "application/json"  # the default
    assert first.headers["accept"] == "text/event-stream"
    assert [r.body for r in server.requests] == [b"one two", b"three"]


async def test_an_answer_split_at_every_byte_comes_out_the_same() -> None:
    answer = CHUNKED_HEAD + chunks(b"data: a\n\n", b"data: bc\n\n")

    async def handler(peer: Peer) -> None:
        peer.writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        while await peer.request() is not None:
            for i in range(len(answer)):
                await peer.send(answer[i : i + 1])

    async with raw_server(handler) as server, http_client() as client:
        assert await fetch(client, server.url) == b"data: a\n\ndata: bc\n\n"
        assert await fetch(client, server.url) == b"data: a\n\ndata: bc\n\n"
    assert len(server.peers) == 1


# 2. A body ended by the close.


async def test_a_body_without_a_length_ends_with_the_connection_which_is_not_reused() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        await peer.send(b"data: a\n\n")
        await peer.send(b"data: b\n\n")  # and the connection closes: the body's end

    async with raw_server(handler) as server, http_client() as client:
        exchange = await soon(client.post(server.url, {}, b"{}"))
        assert exchange.status == 200
        assert await read_whole(exchange) == b"data: a\n\ndata: b\n\n"
        exchange.close()
        assert await fetch(client, server.url) == b"data: a\n\ndata: b\n\n"
    assert len(server.peers) == 2
    assert [r.peer for r in server.requests] == [0, 1]


# 3. Content codings.


@pytest.mark.parametrize(
    ("coding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
async def test_a_compressed_body_comes_out_inflated(
    coding: str, compress: Callable[[bytes], bytes]
) -> None:
    plain = b"".join(b'data: {"n": %d}\n\n' % n for n in range(5000))
    packed = compress(plain)
    assert len(packed) < len(plain) // 4

    async def handler(peer: Peer) -> None:
        while await peer.request() is not None:
            answer = sized(packed, f"content-encoding: {coding}")
            half = len(answer) // 2
            await peer.send(answer[:half])
            await peer.send(answer[half:])

    async with raw_server(handler) as server, http_client() as client:
        assert await fetch(client, server.url) == plain
        assert await fetch(client, server.url) == plain  # a fresh inflater each answer
    assert server.requests[0].headers["accept-encoding"] == "identity"
    assert len(server.peers) == 1


@pytest.mark.parametrize("arrives", ["before read", "after read"])
async def test_a_body_that_does_not_inflate_fails(arrives: str) -> None:
    reading = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        answer = sized(b"this is not gzip at all", "content-encoding: gzip")
        head_end = answer.index(b"\r\n\r\n") + 4
        if arrives == "after read":
            await peer.send(answer[:head_end])
            await reading.wait()
            answer = answer[head_end:]
        await peer.send(answer)
        await peer.gone()

    async with raw_server(handler) as server, http_client() as client:
        exchange = await soon(client.post(server.url, {}, b"{}"))
        body = Body()
        exchange.read(body)
        reading.set()
        await soon(body.done.wait())
        for _ in range(10):  # a late end() would come in the same callback
            await asyncio.sleep(0)
        exchange.close()
    assert body.calls == ["fail"]
    assert isinstance(body.failure, ConnectionBroke)


async def test_a_gzip_body_cut_short_fails() -> None:
    cut = gzip.compress(bytes(range(256)) * 64)[:40]

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(sized(cut, "content-encoding: gzip"))
        await peer.gone()

    async with raw_server(handler) as server, http_client() as client:
        body = await read_through(client, server.url)
    assert body.calls == ["fail"]


# 4. A kept-alive connection the server closed.


async def test_a_connection_closed_by_the_server_after_its_answer_is_replaced() -> None:
    first_closed = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(sized(b"answer %d" % peer.number))  # no "connection: close"
        if peer.number == 0:
            peer.writer.close()
            await peer.writer.wait_closed()
            first_closed.set()
        else:
            await peer.gone()

    async with raw_server(handler) as server, http_client() as client:
        assert await fetch(client, server.url) == b"answer 0"
        await soon(first_closed.wait())
        assert await fetch(client, server.url) == b"answer 1"
    assert len(server.peers) == 2


async def test_a_connection_idle_too_long_is_closed_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A NAT may drop an idle connection without a word: past KEEP_IDLE it is not trusted.
    monkeypatch.setattr(wire, "KEEP_IDLE", -1.0)  # every idle connection is too old
    async with raw_server(answer_each(b"one", b"two")) as server, http_client() as client:
        assert await fetch(client, server.url) == b"one"
        assert await fetch(client, server.url) == b"two"
    assert len(server.peers) == 2  # the first was closed, not used again


async def test_a_request_on_a_connection_the_server_closes_unanswered_is_sent_again() -> None:
    # The server takes the second request on the kept-alive connection and closes it
    # without a byte of answer: the client sends it once more, on a new connection.
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(sized(b"answer %d" % peer.number))
        if peer.number == 0:
            await peer.request()
        else:
            await peer.gone()

    async with raw_server(handler) as server, http_client() as client:
        assert await fetch(client, server.url, b"1") == b"answer 0"
        assert await fetch(client, server.url, b"2") == b"answer 1"
    assert [(r.peer, r.body) for r in server.requests] == [(0, b"1"), (0, b"2"), (1, b"2")]


async def test_a_request_is_sent_again_once_only() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        if peer.number == 0:
            await peer.send(sized(b"answer"))
            await peer.request()  # then closed unanswered, as is the new connection's

    async with raw_server(handler) as server, http_client() as client:
        assert await fetch(client, server.url) == b"answer"
        with pytest.raises(ConnectionBroke):
            await soon(client.post(server.url, {}, b"{}"))
    assert [r.peer for r in server.requests] == [0, 0, 1]


async def test_a_new_connection_closed_before_the_answer_is_not_retried() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()

    async with raw_server(handler) as server, http_client() as client:
        with pytest.raises(ConnectionBroke):
            await soon(client.post(server.url, {}, b"{}"))
    assert len(server.peers) == 1


async def test_an_answer_saying_connection_close_is_not_kept() -> None:
    dropped = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(sized(b"answer %d" % peer.number, "connection: close"))
        await peer.gone()  # the server leaves closing to the client
        dropped.set()

    async with raw_server(handler) as server, http_client() as client:
        assert await fetch(client, server.url) == b"answer 0"
        await soon(dropped.wait())
        assert await fetch(client, server.url) == b"answer 1"
    assert len(server.peers) == 2


async def test_a_chunked_body_cut_by_the_close_fails_whatever_the_case_of_its_header() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n")
        await peer.send(chunks(b"data: a\n\n")[:-5])  # and closed, the last chunk unsent

    async with raw_server(handler) as server, http_client() as client:
        body = await read_through(client, server.url)
    assert body.calls == ["fail"]


# 5. The connection limit.


async def test_a_request_beyond_the_limit_waits_for_the_connection_in_use() -> None:
    async with (
        raw_server(answer_each(b"first", b"second")) as server,
        http_client(max_connections=1) as client,
    ):
        first = await soon(client.post(server.url, {}, b"1"))
        assert await read_whole(first) == b"first"
        second = asyncio.create_task(client.post(server.url, {}, b"2"))
        for _ in range(10):  # let it run to where it waits (it has nothing to wait on else)
            await asyncio.sleep(0)
        assert not second.done()
        assert len(server.requests) == 1
        first.close()
        exchange = await soon(second)
        assert await read_whole(exchange) == b"second"
        exchange.close()
    assert len(server.peers) == 1
    assert [r.body for r in server.requests] == [b"1", b"2"]


async def test_a_request_waiting_past_the_connect_timeout_fails() -> None:
    first_dropped = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        if peer.number == 0:  # an answer that goes on and on
            await peer.send(CHUNKED_HEAD + chunks(b"data: a\n\n")[:-5])
            await peer.gone()
            first_dropped.set()
        else:
            await peer.send(sized(b"third"))
            await peer.gone()

    async with (
        raw_server(handler) as server,
        http_client(max_connections=1, connect_timeout=0.2) as client,
    ):
        first = await soon(client.post(server.url, {}, b"1"))
        with pytest.raises(ConnectTimeout):
            await soon(client.post(server.url, {}, b"2"))
        first.close()  # its answer not whole: the connection is dropped, its place freed
        await soon(first_dropped.wait())
        assert await fetch(client, server.url, b"3") == b"third"
    assert [(r.peer, r.body) for r in server.requests] == [(0, b"1"), (1, b"3")]


async def test_at_the_limit_an_idle_connection_to_another_server_makes_room() -> None:
    a_dropped = asyncio.Event()

    async def to_a(peer: Peer) -> None:
        await peer.request()
        await peer.send(sized(b"from a"))
        await peer.gone()
        a_dropped.set()

    async with (
        raw_server(to_a) as a,
        raw_server(answer_each(b"from b")) as b,
        http_client(max_connections=1) as client,
    ):
        assert await fetch(client, a.url) == b"from a"
        assert await fetch(client, b.url) == b"from b"
        await soon(a_dropped.wait())


# 6. No server.


async def test_a_refused_connection_fails_with_the_os_error_and_frees_its_place() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = unused.getsockname()[1]
        async with (
            raw_server(answer_each(b"fine")) as server,
            http_client(max_connections=1) as client,
        ):
            with pytest.raises(ConnectFailed) as failed:
                await soon(client.post(f"http://127.0.0.1:{port}/", {}, b"{}"))
            assert isinstance(failed.value.__cause__, OSError)
            assert failed.value.__cause__.errno == errno.ECONNREFUSED
            assert await fetch(client, server.url) == b"fine"


# 7. Broken answers.


@pytest.mark.parametrize("framing", ["sized", "chunked"])
async def test_a_body_cut_by_the_close_fails_the_reader(framing: str) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        if framing == "sized":
            await peer.send(sized(b"data: a\n\n" * 100)[:-500])
        else:
            await peer.send(CHUNKED_HEAD + chunks(b"data: a\n\n")[:-5])

    async with raw_server(handler) as server, http_client() as client:
        body = await read_through(client, server.url)
    assert body.calls == ["fail"]
    assert isinstance(body.failure, ConnectionBroke)
    assert body.bytes.startswith(b"data: a\n\n")


async def test_an_answer_that_is_not_http_fails_and_drops_the_connection() -> None:
    dropped = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await peer.gone()
        dropped.set()

    async with raw_server(handler) as server, http_client() as client:
        with pytest.raises(ConnectionBroke):
            await soon(client.post(server.url, {}, b"{}"))
        await soon(dropped.wait())


# 8. Header injection.


async def test_a_head_that_never_ends_fails_within_its_bound() -> None:
    async def endless(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\nx-long: ")
        while True:  # until the client drops the connection (a ConnectionError ends it)
            await peer.send(b"a" * 16384)

    async with raw_server(endless) as server, http_client() as client:
        with pytest.raises(ConnectionBroke, match="head over"):
            await soon(client.post(server.url, {}, b"{}"))


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-key", "k\r\nx-injected: yes"), ("x-key", "k\nx-injected: yes"), ("x-a: b", "c")],
)
async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    name: str, value: str
) -> None:
    async with raw_server(answer_each(b"fine")) as server, http_client() as client:
        with pytest.raises(ValueError, match="line break"):
            await client.post(server.url, {name: value}, b"{}")
        assert await fetch(client, server.url) == b"fine"
    assert len(server.peers) == 1  # only the good request's connection
    (request,) = server.requests
    assert "x-injected" not in request.headers
    assert "x-a" not in request.headers


# 9. Back-pressure.


async def test_pause_stops_the_body_and_resume_delivers_the_rest_whole() -> None:
    total = 16 * 1024 * 1024  # far more than the socket buffers hold
    piece = bytes(range(256)) * 256  # 64 KiB
    paused = asyncio.Event()
    server_stuck = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total + piece)
        await paused.wait()  # the rest only once the client stopped reading
        for _ in range(total // len(piece) - 1):
            peer.writer.write(piece)
            if peer.writer.transport.get_write_buffer_size() > 0:
                server_stuck.set()  # the socket buffers are full: the client reads nothing
            await peer.writer.drain()

    async with raw_server(handler) as server, http_client() as client:
        exchange = await soon(client.post(server.url, {}, b"{}"))

        class PausingBody(Body):
            def data(self, chunk: bytes) -> None:
                super().data(chunk)
                if not paused.is_set():  # as the providers' reader does when it has no room
                    exchange.pause()
                    paused.set()

        body = PausingBody()
        exchange.read(body)
        await soon(paused.wait())
        delivered = body.size  # what the read that paused held went on to the reader
        await soon(server_stuck.wait())
        for _ in range(10):  # the socket has bytes waiting: a reading transport takes them
            await asyncio.sleep(0)
        assert body.size == delivered
        assert delivered <= len(piece)
        exchange.resume()
        await soon(body.done.wait())
        exchange.close()
    assert body.calls == ["end"]
    assert body.size == total
    assert body.bytes == piece * (total // len(piece))


# 10. Cancelling.


async def post_timed_out_once(event: asyncio.Event, client: HttpClient, url: str) -> Exchange:
    """``client.post`` under a timeout that expires once ``event`` is set (not at a time that
    a slow machine could miss)."""

    async def expire(deadline: asyncio.Timeout) -> None:
        await event.wait()
        deadline.reschedule(asyncio.get_running_loop().time())

    async with asyncio.timeout(WAIT) as deadline:
        expiring = asyncio.create_task(expire(deadline))
        try:
            return await client.post(url, {}, b"{}")
        finally:
            expiring.cancel()


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_giving_up_on_the_head_drops_the_connection(how: str) -> None:
    asked = asyncio.Event()
    dropped = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        if peer.number == 0:
            asked.set()
            await peer.gone()
            dropped.set()
        else:
            await peer.send(sized(b"fine"))
            await peer.gone()

    async with raw_server(handler) as server, http_client(max_connections=1) as client:
        if how == "cancel":
            posting = asyncio.create_task(client.post(server.url, {}, b"{}"))
            await soon(asked.wait())
            posting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await posting
        else:  # as the providers give up on a silent server (first_byte_timeout)
            with pytest.raises(TimeoutError):
                await post_timed_out_once(asked, client, server.url)
        await soon(dropped.wait())
        assert await fetch(client, server.url) == b"fine"  # its place was freed
    assert len(server.peers) == 2


# 11. Interim answers.


async def test_interim_answers_before_the_real_one_are_skipped() -> None:
    async def handler(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            await peer.send(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n")
            await peer.send(sized(b"real", "x-final: yes"))

    async with raw_server(handler) as server, http_client() as client:
        for _ in range(2):
            exchange = await soon(client.post(server.url, {}, b"{}"))
            assert exchange.status == 200
            assert exchange.headers["x-final"] == "yes"
            assert "link" not in exchange.headers
            assert await read_whole(exchange) == b"real"
            exchange.close()
    assert len(server.peers) == 1


# Production's loop.

Scenario = Callable[[], Coroutine[Any, Any, None]]

ON_UVLOOP: list[Scenario] = [
    test_a_chunked_answer_is_read_whole_and_its_connection_serves_the_next,
    test_an_answer_split_at_every_byte_comes_out_the_same,
    test_a_body_without_a_length_ends_with_the_connection_which_is_not_reused,
    functools.partial(test_a_compressed_body_comes_out_inflated, "gzip", gzip.compress),
    test_a_connection_closed_by_the_server_after_its_answer_is_replaced,
    test_a_request_on_a_connection_the_server_closes_unanswered_is_sent_again,
    test_a_request_is_sent_again_once_only,
    test_a_new_connection_closed_before_the_answer_is_not_retried,
    test_a_request_beyond_the_limit_waits_for_the_connection_in_use,
    test_a_request_waiting_past_the_connect_timeout_fails,
    test_an_answer_saying_connection_close_is_not_kept,
    test_at_the_limit_an_idle_connection_to_another_server_makes_room,
    test_a_refused_connection_fails_with_the_os_error_and_frees_its_place,
    functools.partial(test_a_body_cut_by_the_close_fails_the_reader, "sized"),
    functools.partial(test_a_body_cut_by_the_close_fails_the_reader, "chunked"),
    test_an_answer_that_is_not_http_fails_and_drops_the_connection,
    functools.partial(
        test_a_header_with_a_line_break_is_refused_before_anything_is_sent, "x-key", "a\r\nb: c"
    ),
    test_pause_stops_the_body_and_resume_delivers_the_rest_whole,
    functools.partial(test_giving_up_on_the_head_drops_the_connection, "cancel"),
    functools.partial(test_giving_up_on_the_head_drops_the_connection, "timeout"),
    test_interim_answers_before_the_real_one_are_skipped,
]


def _name(scenario: Scenario) -> str:
    if isinstance(scenario, functools.partial):
        return "-".join([scenario.func.__name__, *map(str, scenario.args[:1])])
    return scenario.__name__


@pytest.mark.parametrize("scenario", ON_UVLOOP, ids=_name)
def test_on_uvloop(scenario: Scenario) -> None:
    # uvloop's transports are not asyncio's classes and read in their own way.
    uvloop.run(scenario())
