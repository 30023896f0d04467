"""Helpers for tests that talk to a real gateway over a real socket."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client_sdk import Connection, Conversation, connect_raw
from gateway.__main__ import build_server
from gateway.config import Config
from gateway.core.model import ModelEvent, ModelRequest
from gateway.edge.app import create_app
from gateway.providers.base import ModelSink, Provider, Pushes, ReportsRetries, RetryListener, Room
from gateway.providers.realtime import RealtimeProvider
from gateway.shell.runtime import Runtime, agent_from_config
from gateway.wire.v1 import (
    Outbound,
    ResponseDone,
    SessionCreated,
    SessionResume,
    SessionStart,
    TextDelta,
    ToolCalls,
    UserMessage,
)

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

    def push(self, request: ModelRequest, sink: ModelSink, room: Room) -> Awaitable[None] | None:
        """The inner provider's ``push``, where it has one: the path the gateway takes with
        it (the HTTP adapters, the scripted model's paced answers), tested as it runs."""
        if not isinstance(self.inner, Pushes):
            return None
        played = self.inner.push(request, sink, room)
        if played is not None:  # else the driver calls ``stream``, which records it
            self.requests.append(request)
        return played

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
    if not isinstance(agent.provider, RealtimeProvider):  # its steps go through its sessions
        agent = dataclasses.replace(agent, provider=model)
    app = create_app(config, agent=agent)
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


@asynccontextmanager
async def resuming(
    url: str, created: SessionCreated, last_seq: int
) -> AsyncIterator[tuple[Connection, Outbound]]:
    """A new socket that sent ``session.resume`` from ``last_seq``; yields it and the answer."""
    async with connect_raw(url) as conn:
        resume = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=last_seq
        )
        await conn.send(resume)
        yield conn, await conn.recv()


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


class Recording:
    """Every event a conversation delivers from now on, as it comes (``record``)."""

    def __init__(self) -> None:
        self.events: list[Outbound] = []
        self.times: list[float] = []
        """When each event arrived (the loop's clock)."""
        self._arrived = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None

    async def add(self, event: Outbound) -> None:
        async with self._arrived:
            self.events.append(event)
            self.times.append(asyncio.get_running_loop().time())
            self._arrived.notify_all()

    async def until(self, found: Callable[[list[Outbound]], bool], within: float = 10.0) -> None:
        """Wait until ``found(events)`` holds, checked as each event arrives."""
        async with asyncio.timeout(within), self._arrived:
            await self._arrived.wait_for(lambda: found(self.events))

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


def record(conv: Conversation) -> Recording:
    """Record ``conv``'s events from now on (subscribed at once: none is missed)."""
    recording = Recording()
    stream = conv.events()

    async def read() -> None:
        async for event in stream:
            await recording.add(event)

    recording.task = asyncio.create_task(read())
    return recording
