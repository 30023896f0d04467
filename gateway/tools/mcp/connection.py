"""One session with an MCP server, and how its end is noticed, for ``gateway.tools.mcp.backend``.

An ``Endpoint`` holds where the server is (its command or its URL, the agent file's
``${VAR}``s expanded); its ``open_session`` starts the server (stdio) or an HTTP client
(streamable HTTP) and the SDK's ``ClientSession`` over it, all closed with an exit stack
the caller owns. The SDK fails the calls in flight when the transport ends but tells
nobody else, so the transport's messages pass through a stream that notices their end;
and an HTTP server that answers 404 to our session has restarted. Either way the caller's
``lose`` hears of it. A ``Connection`` is what the caller and its calls know of a session;
``list_tools`` lists the session's tools, page after page.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TextIO

import anyio
import httpx2
import mcp_types as types
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client import ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared.message import SessionMessage

from gateway.errors import ConfigError
from gateway.tools.entry import McpServerEntry, expand_env

__all__ = ["Connection", "Endpoint", "list_tools"]

log = structlog.get_logger("gateway.tools")

_MAX_PAGES = 1000
"""``tools/list`` pages followed at most: a server whose cursor never ends cannot hang us."""


class Connection:
    """One session, and how calls and the supervisor learn that it is gone."""

    def __init__(self) -> None:
        self.session: ClientSession | None = None
        self.reason = ""
        self.lost = asyncio.Event()
        """Set by whoever notices first: the supervisor then tears the session down."""
        self.ending = False
        """The supervisor is tearing it down (after ``lost``)."""
        self.ended = asyncio.Event()
        """Set once torn down, ``reason`` final."""
        self.relist = asyncio.Event()
        """The server said its tools changed."""


class Endpoint:
    """Where one MCP server is and how to reach it: the command to start (stdio) or the
    URL (streamable HTTP), with the agent file's ``${VAR}``s expanded once.

    Args:
        entry: the server's settings from the agent file.
        base_dir: the agent file's directory; a relative ``cwd`` is relative to it.

    Raises:
        ConfigError: neither or both of ``command`` and ``url``; a ``${VAR}`` in ``env``
            or ``headers`` that is not set.
    """

    def __init__(self, entry: McpServerEntry, base_dir: Path) -> None:
        where = f"MCP server {entry.name!r}"
        if bool(entry.command) == (entry.url is not None):
            raise ConfigError(
                f"{where}: set either command (stdio) or url (streamable HTTP), not both or neither"
            )
        self._entry = entry
        self._env = {k: expand_env(v, f"{where}: env.{k}") for k, v in entry.env.items()}
        self._headers = {
            k: expand_env(v, f"{where}: headers.{k}") for k, v in entry.headers.items()
        }
        self._cwd = base_dir / entry.cwd if entry.cwd is not None else base_dir

    async def open_session(
        self, stack: AsyncExitStack, conn: Connection, lose: Callable[[Connection, str], None]
    ) -> TaskGroup:
        """Start the server (stdio) or the HTTP client, and a session over it, all closed
        with ``stack``; ``conn.session`` is the session.

        Args:
            stack: what closes it all, left in the task that entered it.
            conn: the connection the session is for.
            lose: called with ``conn`` and why, when the connection turns out to be gone.

        Returns:
            A task group for the connection's own tasks.
        """
        if self._entry.command:
            command = self._entry.command
            params = StdioServerParameters(
                command=command[0], args=command[1:], env={**os.environ, **self._env}, cwd=self._cwd
            )
            stdio = stdio_client(params, errlog=_stderr())
            read, write = await stack.enter_async_context(stdio)
        else:
            assert self._entry.url is not None

            async def on_response(response: httpx2.Response) -> None:
                # A server that restarted answers 404 to our session: the spec's cue to start
                # a new one. The SDK only fails that request, so the supervisor reconnects.
                if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
                    lose(conn, "it restarted and no longer knows our session")

            client = httpx2.AsyncClient(
                headers=self._headers,
                # No read timeout: a tool may work long in silence, and the gateway times
                # calls out itself.
                timeout=httpx2.Timeout(30.0, connect=self._entry.connect_timeout, read=None),
                event_hooks={"response": [on_response]},
            )
            await stack.enter_async_context(client)
            read, write = await stack.enter_async_context(
                streamable_http_client(self._entry.url, http_client=client)
            )
        tasks = await stack.enter_async_context(anyio.create_task_group())
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception]()
        stack.callback(receive.close)
        stack.callback(send.close)
        tasks.start_soon(_forward, read, send, conn, self._entry, lose)

        async def on_message(message: IncomingMessage) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                conn.relist.set()
            elif isinstance(message, Exception):
                log.debug(
                    "mcp_transport_error_received", server=self._entry.name, error=str(message)
                )

        conn.session = ClientSession(receive, write, message_handler=on_message)
        await stack.enter_async_context(conn.session)
        return tasks


async def _forward(
    read: AsyncIterable[SessionMessage | Exception],
    send: MemoryObjectSendStream[SessionMessage | Exception],
    conn: Connection,
    entry: McpServerEntry,
    lose: Callable[[Connection, str], None],
) -> None:
    """Pass the transport's messages on to the session, and notice their end: the SDK
    fails the calls in flight then, but tells nobody else (a stdio server exited)."""
    try:
        async with send:
            async for item in read:
                await send.send(item)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return  # the session ended first: our own shutdown
    ended = "the server process exited" if entry.command else "the server hung up"
    lose(conn, ended)


async def list_tools(session: ClientSession, server: str) -> list[types.Tool]:
    """Every tool, page after page.

    Args:
        session: the initialized session.
        server: the server's name in the agent file, for the log.
    """
    result = await session.list_tools()
    tools = list(result.tools)
    for _ in range(_MAX_PAGES):
        if result.next_cursor is None:
            return tools
        params = types.PaginatedRequestParams(cursor=result.next_cursor)
        result = await session.list_tools(params=params)
        tools += result.tools
    log.warning("mcp_tools_truncated", server=server, pages=_MAX_PAGES)
    return tools


def _stderr() -> TextIO:
    """Where a stdio server's stderr goes: ours, if it is a real file (not a test's)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or sys.stderr
    return sys.stderr
