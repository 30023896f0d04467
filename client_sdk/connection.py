"""A typed, low-level connection to the gateway: send protocol messages, receive events.

This is the layer the higher-level SDK builds on; tests and tools use it to speak
the protocol exactly. Events of types this version does not know are skipped, as
the protocol asks of clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit, urlunsplit

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

from gateway.wire.msgpack import SUBPROTOCOL_MSGPACK
from gateway.wire.v1 import (
    SUBPROTOCOL,
    TOKEN_SUBPROTOCOL_PREFIX,
    ClientMsg,
    Outbound,
    ResponseTruncate,
    SessionResume,
    SessionStart,
    SessionUpdate,
    ToolRun,
    UserMessage,
    decode_server,
    encode,
)

__all__ = [
    "MAX_FRAME_SIZE",
    "SESSION_PARAM",
    "Connection",
    "connect_raw",
    "open_socket",
    "resume_url",
    "sent_fields",
    "text_frame",
]

MAX_FRAME_SIZE = 64 * 2**20
"""Largest event accepted: a snapshot holds the whole transcript, far over websockets' 1 MiB."""

SESSION_PARAM = "session"
"""The query parameter naming the session a socket resumes, for load balancers that route
by it (deploy/nginx.conf hashes it, so every resume of a session reaches the same node).
The gateway ignores it: the session is the one ``session.resume`` names."""


_RESPONSE_OPTIONS = (
    "tool_choice",
    "tools",
    "max_steps",
    "tool_mode",
    "time_zone",
    "segments",
    "audio",
)
"""Fields added to protocol v1 after its first release: sent only when set."""


def text_frame(msg: ClientMsg) -> str:
    """``msg`` as the text frame the SDK sends: like ``encode``, but without the response
    options (``tool_choice``, ``tools``, ``max_steps``, ``tool_mode``) it leaves unset, so
    that a gateway older than them, which rejects fields it does not know, still takes the
    message; a ``tool.run`` without edited arguments leaves ``args`` out."""
    data = sent_fields(msg)
    return (encode(msg) if data is msg else msgspec.json.encode(data)).decode()


def sent_fields(msg: ClientMsg) -> ClientMsg | dict[str, Any]:
    """What of ``msg`` the SDK sends, whatever the framing: ``msg`` itself, or its fields
    without the options it leaves unset (``text_frame``)."""
    if isinstance(msg, ToolRun):
        options: tuple[str, ...] = ("args",)
    elif isinstance(msg, UserMessage | SessionStart | SessionUpdate):
        options = _RESPONSE_OPTIONS
    elif isinstance(msg, ResponseTruncate):
        options = ("heard_chars", "audio_end_ms")
    elif isinstance(msg, SessionResume):
        options = ("device_id", "client_functions")
    else:
        return msg
    data: dict[str, Any] = msgspec.to_builtins(msg)
    for name in options:
        if name in data and data[name] is None:
            del data[name]
    return data


def resume_url(url: str, session_id: str) -> str:
    """``url`` with ``session=<session_id>`` in its query, for a socket that resumes that
    session: what the URL's query has (a token...) is kept as written, and a ``session``
    parameter already in it is replaced, never repeated."""
    parts = urlsplit(url)
    kept = [
        pair
        for pair in parts.query.split("&")
        if pair and unquote_plus(pair.partition("=")[0]) != SESSION_PARAM
    ]
    kept.append(f"{SESSION_PARAM}={quote(session_id, safe='')}")
    return urlunsplit(parts._replace(query="&".join(kept)))


class Connection:
    """One open socket to ``/v1/realtime``."""

    def __init__(self, websocket: ClientConnection) -> None:
        self.websocket = websocket

    async def send(self, msg: ClientMsg) -> None:
        """Send one protocol message."""
        await self.websocket.send(encode(msg).decode())

    async def send_raw(self, data: str | bytes) -> None:
        """Send a frame as is (text for ``str``, binary for ``bytes``)."""
        await self.websocket.send(data)

    async def recv(self, within: float = 10.0) -> Outbound:
        """The next event the client understands.

        Raises:
            TimeoutError: nothing arrived in ``within`` seconds.
            websockets.ConnectionClosed: the socket closed.
        """
        async with asyncio.timeout(within):
            while True:
                frame = await self.websocket.recv()
                if isinstance(frame, bytes):
                    continue  # the answer's audio (gateway.wire.audio_frame): not an event
                try:
                    return decode_server(frame)
                except msgspec.ValidationError:
                    continue  # an event type newer than this client: skip it

    async def recv_until(
        self, stop: Callable[[Outbound], bool], within: float = 10.0
    ) -> list[Outbound]:
        """Receive events up to and including the first for which ``stop`` is true."""
        events: list[Outbound] = []
        async with asyncio.timeout(within):
            while True:
                event = await self.recv(within=within)
                events.append(event)
                if stop(event):
                    return events

    async def close(self) -> None:
        await self.websocket.close()


async def open_socket(
    url: str,
    *,
    token: str | None = None,
    api_key: str | None = None,
    msgpack: bool = False,
    **kwargs: Any,
) -> ClientConnection:
    """Open a socket with the ``gateway.v1`` subprotocol (extra kwargs go to websockets);
    with ``msgpack``, ``gateway.v1.msgpack`` is offered first.

    ``token`` is offered as the ``gateway.token.<token>`` subprotocol (out of URLs and
    access logs); ``api_key`` is sent as ``Authorization: Bearer`` (server to server).
    """
    protocols = [SUBPROTOCOL_MSGPACK, SUBPROTOCOL] if msgpack else [SUBPROTOCOL]
    if token is not None:
        protocols.append(TOKEN_SUBPROTOCOL_PREFIX + token)
    kwargs.setdefault("subprotocols", [Subprotocol(p) for p in protocols])
    if api_key is not None:
        kwargs.setdefault("additional_headers", {"Authorization": f"Bearer {api_key}"})
    kwargs.setdefault("max_size", MAX_FRAME_SIZE)
    return await websockets.connect(url, **kwargs)


@asynccontextmanager
async def connect_raw(
    url: str, *, token: str | None = None, api_key: str | None = None, **kwargs: Any
) -> AsyncIterator[Connection]:
    """A ``Connection`` over ``open_socket(url, ...)``, closed when the block ends."""
    async with await open_socket(url, token=token, api_key=api_key, **kwargs) as websocket:
        yield Connection(websocket)
