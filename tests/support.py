"""Helpers for tests that talk to a real gateway over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import websockets

from client_sdk import Connection, connect_raw
from gateway.__main__ import build_server
from gateway.app import Runtime, agent_from_config, create_app
from gateway.config import Config
from gateway.model import ModelEvent, ModelRequest
from gateway.protocol import (
    SUBPROTOCOL,
    ClientMsg,
    Outbound,
    ResponseDone,
    SessionCreated,
    SessionResume,
    SessionResumed,
    SessionStart,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from gateway.providers.base import Provider, ReportsRetries, RetryListener

TEST_AGENT = Path(__file__).parent / "data" / "agent.toml"


class RecordingProvider:
    """Wraps a provider and keeps every request it got: what the model really saw."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.requests: list[ModelRequest] = []

    @property
    def on_retry(self) -> RetryListener | None:
        return self.inner.on_retry if isinstance(self.inner, ReportsRetries) else None

    @on_retry.setter
    def on_retry(self, listener: RetryListener | None) -> None:
        if isinstance(self.inner, ReportsRetries):  # the gateway's metrics count retries
            self.inner.on_retry = listener

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        return self.inner.stream(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Gateway:
    url: str
    runtime: Runtime
    model: RecordingProvider
    port: int = 0


@asynccontextmanager
async def running_gateway(**overrides: Any) -> AsyncIterator[str]:
    """Serve the test agent (unless ``agent=`` says otherwise) on a free port.

    Yields:
        The ``ws://`` URL of ``/v1/realtime``.
    """
    async with serving(**overrides) as gateway:
        yield gateway.url


@asynccontextmanager
async def serving(*, send_buffer: int | None = None, **overrides: Any) -> AsyncIterator[Gateway]:
    """Like ``running_gateway``, yielding the runtime and a recording of the model too.

    Authentication is off (``no_auth=True``) unless the test says otherwise.

    ``send_buffer`` shrinks the kernel's send buffer of accepted sockets (SO_SNDBUF), so
    a client that stops reading pushes back on the gateway after a few KB, not MBs.
    """
    overrides.setdefault("agent", str(TEST_AGENT))
    overrides.setdefault("no_auth", True)  # tests of auth say no_auth=False
    config = Config(host="127.0.0.1", port=0, **overrides)
    agent = agent_from_config(config)
    model = RecordingProvider(agent.provider)
    app = create_app(config, agent=dataclasses.replace(agent, provider=model))
    server = build_server(config, app)
    # Listening before uvicorn starts means clients queue in the backlog: no race, no polling.
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only then,
    # and without it Nagle + delayed ACKs stall every streamed event by ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # room for the slowloris test's burst of connections
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield Gateway(f"ws://127.0.0.1:{port}/v1/realtime", app.state.runtime, model, port)
    finally:
        server.should_exit = True
        await task
        sock.close()
        await model.aclose()


@asynccontextmanager
async def session(url: str, **start: Any) -> AsyncIterator[tuple[Connection, SessionCreated]]:
    """Connect and start a session; yields the connection and ``session.created``."""
    async with connect_raw(url) as conn:
        await conn.send(SessionStart(**start))
        created = await conn.recv()
        assert isinstance(created, SessionCreated), created
        yield conn, created


async def say(conn: Connection, text: str, msg_id: str | None = None) -> list[Outbound]:
    """Send a user message and collect events up to its ``response.done``."""
    await conn.send(UserMessage(text=text, id=msg_id))
    return await conn.recv_until(lambda e: isinstance(e, ResponseDone))


async def say_until_calls(conn: Connection, text: str) -> ToolCalls:
    """Send a user message and wait for the ``tool.calls`` it causes."""
    await conn.send(UserMessage(text=text))
    events = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
    calls = events[-1]
    assert isinstance(calls, ToolCalls)
    return calls


def streamed_text(events: list[Outbound]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextDelta))


def types(events: list[Outbound]) -> list[str]:
    return [type(e).__struct_config__.tag for e in events]  # type: ignore[misc]


class ResumingClient:
    """A client that survives drops: it resumes with its cursor and checks what it gets.

    Every event with a ``seq`` must come exactly once and in order (``seq`` strictly
    increasing by one); results it sent but saw no confirmation of are sent again
    after a resume (the gateway must not apply them twice).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: Connection | None = None
        self.session_id = ""
        self.token = ""
        self.last_seq = 0
        self.drops = 0
        self.events: list[Outbound] = []
        self.resumes: list[SessionResumed] = []
        self.unconfirmed: dict[str, ToolResult] = {}

    async def _connect(self) -> Connection:
        websocket = await websockets.connect(self.url, subprotocols=[SUBPROTOCOL])
        self.conn = Connection(websocket)
        return self.conn

    async def start(self) -> SessionCreated:
        conn = await self._connect()
        await conn.send(SessionStart())
        created = await self.next()
        assert isinstance(created, SessionCreated)
        self.session_id, self.token = created.session_id, created.resume_token
        return created

    async def send(self, msg: ClientMsg) -> None:
        assert self.conn is not None
        if isinstance(msg, ToolResults):
            self.unconfirmed.update({r.call_id: r for r in msg.results})
        await self.conn.send(msg)

    async def drop(self) -> None:
        """Lose the socket the hard way (no close frame), as a phone does."""
        assert self.conn is not None
        self.conn.websocket.transport.abort()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.conn.websocket.wait_closed()
        self.drops += 1

    async def resume(self) -> SessionResumed:
        conn = await self._connect()
        await conn.send(
            SessionResume(
                session_id=self.session_id, resume_token=self.token, last_seq=self.last_seq
            )
        )
        resumed = await conn.recv()
        assert isinstance(resumed, SessionResumed), resumed
        assert resumed.replayed_from == self.last_seq + 1
        self.resumes.append(resumed)
        if self.unconfirmed:
            await conn.send(ToolResults(results=list(self.unconfirmed.values())))
        return resumed

    async def next(self) -> Outbound:
        """The next event of the session (connection-level ones are checked, not returned)."""
        assert self.conn is not None
        while True:
            event = await self.conn.recv()
            if event.seq == 0:
                raise AssertionError(f"unexpected connection-level event {event}")
            assert event.seq == self.last_seq + 1, (event.seq, self.last_seq)
            self.last_seq = event.seq
            self.events.append(event)
            if isinstance(event, ToolStatus):
                self.unconfirmed.pop(event.call_id, None)
            return event

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
